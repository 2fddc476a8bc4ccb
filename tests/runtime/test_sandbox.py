"""One test per threat of docs/sandbox.md; each fails if its protection is removed."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path

import pytest

from rao_core.envs.base import ToolError
from rao_core.runtime.sandbox import Repl, SandboxLimits, bwrap_command, run_cell_once
from rao_core.paths import rao_home
from rao_core.tree import CellStatus

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                reason="needs bubblewrap and root (to drop to a sandbox uid)")


async def no_calls(name, args, kwargs):
    raise ToolError("no tools")


async def repl(**kw) -> Repl:
    r = await Repl(SandboxLimits(**kw)).start()
    await r.init([], False, {})
    return r


async def test_plain_cell_output_and_persistence():
    r = await repl()
    try:
        a = await r.execute("x = 41\nprint('hi')", no_calls)
        b = await r.execute("x + 1", no_calls)  # no notebook echo by default: only prints are shown
        c = await r.execute("print(x + 1)", no_calls)
        assert (a.status, a.output) == (CellStatus.OK, "hi\n")
        assert (b.status, b.output) == (CellStatus.OK, "")
        assert (c.status, c.output) == (CellStatus.OK, "42\n")
    finally:
        await r.close()


async def test_notebook_echo_only_when_switched_on():
    r = await repl(echo=True)
    try:
        b = await r.execute("x = 41\nx + 1", no_calls)
        assert (b.status, b.output) == (CellStatus.OK, "42\n")
    finally:
        await r.close()


async def test_infinite_loop_hits_wall_clock_limit_and_kills_repl():
    r = await repl(cell_timeout_s=1.0)
    try:
        res = await r.execute("while True:\n    pass", no_calls)
        assert res.status == CellStatus.TIMEOUT
        assert not r.alive  # the orchestrator killed the whole sandbox
    finally:
        await r.close()


async def test_cells_run_niced_and_cannot_lower_it():
    """A looping cell must not take a core from a CPU vLLM engine bound to every core: the REPL tree runs at
    niceness ``nice`` (10) relative to the orchestrator, set outside the sandbox, and the cell cannot undo it."""
    base = os.nice(0)
    cell_nice = min(base + 10, 19)  # 19 is the ceiling: a test run under `nice -n 19` sees 19, not 29
    r = await repl()
    try:
        res = await r.execute("import os\nprint(os.nice(0))\ntry:\n    os.nice(-5)\nexcept PermissionError:\n"
                              "    print('denied')\nprint(os.nice(0))", no_calls)
        assert res.output == f"{cell_nice}\ndenied\n{cell_nice}\n", res
        if Path("/proc/self/autogroup").exists():  # autogroup scheduling: the session's CPU group is niced too
            group = await r.execute("print(open('/proc/self/autogroup').read().split()[-1])\ntry:\n"
                                    "    open('/proc/self/autogroup', 'w').write('0')\nexcept OSError:\n"
                                    "    print('denied')", no_calls)
            assert group.output == f"{cell_nice}\ndenied\n", group
    finally:
        await r.close()
    r = await repl(nice=0)
    try:
        assert (await r.execute("import os\nprint(os.nice(0))", no_calls)).output == f"{base}\n"
    finally:
        await r.close()


async def test_memory_bomb_raises_memory_error():
    r = await repl(memory_mb=256)
    try:
        res = await r.execute("b = bytearray(2 * 1024**3)\nprint(len(b))", no_calls)
        assert res.status == CellStatus.MEMORY
        ok = await r.execute("print('alive')", no_calls)
        assert ok.output == "alive\n"
    finally:
        await r.close()


async def test_fork_bomb_is_capped_by_nproc():
    # A bounded "fork bomb": try 100 children (each sleeps then exits) and count how many started.
    code = (
        "import os, time\n"
        "n = 0\n"
        "for i in range(100):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(3); os._exit(0)\n"
        "    n += 1\n"
        "print(n)"
    )
    r = await repl(nproc=16)
    try:
        res = await r.execute(code, no_calls)
        assert res.status == CellStatus.OK, res.error
        assert int(res.output) < 16  # threads of the REPL count too, so fewer than the limit
    finally:
        await r.close()


async def test_huge_print_is_capped():
    r = await repl(output_cap=10_000)
    try:
        res = await r.execute("print('x' * 10**7)", no_calls)
        assert res.status == CellStatus.OK
        assert len(res.output) == 10_000
        assert res.truncated_chars == 10**7 + 1 - 10_000
    finally:
        await r.close()


async def test_os_exit_reports_killed():
    r = await repl()
    try:
        res = await r.execute("import os\nos._exit(3)", no_calls)
        assert res.status == CellStatus.KILLED
        assert "exit status" in res.error
    finally:
        await r.close()


async def test_cannot_kill_parent_or_orchestrator():
    r = await repl()
    try:
        code = (
            "import os, signal\n"
            "out = []\n"
            f"for pid in (os.getppid(), 1, {os.getpid()}):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL); out.append('killed')\n"
            "    except OSError as e:\n"
            "        out.append(type(e).__name__)\n"
            "print(out)"
        )
        res = await r.execute(code, no_calls)
        assert res.status == CellStatus.OK
        assert "killed" not in res.output, res.output
        assert r.alive
        again = await r.execute("print(1)", no_calls)
        assert again.output == "1\n"
    finally:
        await r.close()


async def test_orchestrator_env_and_proc_are_invisible(monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("RAO_TEST_SECRET", secret)
    r = await repl()
    try:
        code = (
            "import os, glob\n"
            "seen = [k for k, v in os.environ.items()]\n"
            "leak = []\n"
            "for p in glob.glob('/proc/[0-9]*/environ'):\n"
            "    try:\n"
            "        leak.append(open(p, 'rb').read())\n"
            "    except OSError:\n"
            "        pass\n"
            f"print('RAO_TEST_SECRET' in seen, any(b'{secret}' in x for x in leak), "
            f"os.path.exists('/proc/{os.getpid()}/cmdline'))"
        )
        res = await r.execute(code, no_calls)
        assert res.status == CellStatus.OK, res.error
        assert res.output.strip() == "False False False"
        assert secret not in res.output
    finally:
        await r.close()


async def test_network_is_unreachable():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    r = await repl()
    try:
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')\n"
            "except OSError as e:\n"
            "    print('blocked', type(e).__name__)"
        )
        res = await r.execute(code, no_calls)
        assert res.output.startswith("blocked"), res.output
    finally:
        srv.close()
        await r.close()


async def test_cannot_write_outside_work_folder():
    # a host folder outside /tmp and /root (both are private tmpfs mounts inside the sandbox), so that only
    # the read-only bind of the host filesystem protects it, wherever the checkout lives
    outside = Path("/var/tmp") / f"rao-sandbox-test-{uuid.uuid4().hex}"
    outside.mkdir(parents=True)
    os.chmod(outside, 0o777)  # world-writable on the host: only the read-only bind protects it
    r = await repl()
    try:
        code = (
            "import os\n"
            "open('inside.txt', 'w').write('ok')\n"
            "try:\n"
            f"    open('{outside}/x.txt', 'w').write('escape'); print('wrote')\n"
            "except OSError as e:\n"
            "    print('blocked', e.errno)\n"
            "print(os.getcwd())"
        )
        res = await r.execute(code, no_calls)
        assert res.output.splitlines() == ["blocked 30", "/tmp/work"], res.output  # 30 = EROFS
        assert not (outside / "x.txt").exists()
        assert (r.workdir / "inside.txt").read_text() == "ok"
    finally:
        await r.close()
        shutil.rmtree(outside, ignore_errors=True)


async def test_file_size_limit():
    r = await repl(fsize_mb=1)
    try:
        res = await r.execute("open('big', 'wb').write(b'0' * 2 * 1024**2)", no_calls)
        assert res.status == CellStatus.ERROR and "File too large" in res.error
    finally:
        await r.close()


async def test_run_cell_once_and_command_line():
    res = await run_cell_once("print(2 + 2)", SandboxLimits())
    assert (res.status, res.output) == (CellStatus.OK, "4\n")
    cmd = bwrap_command(rao_home(), ["python3"])
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--clearenv"):
        assert flag in cmd


async def test_errors_show_only_the_cell_never_a_host_path():
    """A cell that does not compile reads as Python shows it (File "<cell>"), without the frame of the parser
    on the host (it named the stdlib's ast.py); a runtime error keeps only the cell's own frames."""
    r = await repl()
    try:
        bad = await r.execute("x = 1\ny = (", no_calls)
        div = await r.execute("def f():\n    return 1 / 0\nf()", no_calls)
    finally:
        await r.close()
    assert bad.status == div.status == CellStatus.ERROR
    assert bad.error == '  File "<cell>", line 2\n    y = (\n        ^\nSyntaxError: \'(\' was never closed\n'
    assert div.error == ('Traceback (most recent call last):\n  File "<cell>", line 3, in <module>\n'
                         '  File "<cell>", line 2, in f\nZeroDivisionError: division by zero\n')
