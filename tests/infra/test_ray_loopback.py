"""The local Ray head of ``rao services up --ray`` listens on loopback only.

Ray takes "127.0.0.1" to mean "this machine" and registers the node under the host's network address, where its
servers (and a replica's vLLM server, which listens on its node's address) are reachable from the network; the
head now runs Ray's one-machine mode (``infra.services.RAY_LOOPBACK_ENV``). The test starts a real head, joins it
as the flow does, places one policy server replica (a fake vLLM server started by a Ray actor, as in
``tests/pipeline/test_ray_replicas.py``) and runs a task on a worker, then reads every listening socket of the
session's processes from ``psutil.net_connections``. Before the fix it found the GCS, raylet, workers and the
client server on ``*`` or on 192.0.2.2.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]


def _tree(pids: list[int]) -> set[int]:
    """``pids`` and all their descendants (a replica's server is a child of its actor's worker, in its own group)."""
    out = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out |= {pid, *(c.pid for c in p.children(recursive=True))}
        except psutil.Error:
            continue
    return out


def _listening(pids: set[int]) -> dict[tuple[str, int], str]:
    """(address, port) -> process name of every listening TCP socket of ``pids`` (IPv4 and IPv6)."""
    out = {}
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            try:
                name = psutil.Process(c.pid).name()
            except psutil.Error:
                name = "?"
            out[(c.laddr.ip, c.laddr.port)] = f"{name} (pid {c.pid})"
    return out


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)  # [::ffff:127.0.0.1], as Ray's gRPC servers show it
    return (mapped or addr).is_loopback


def test_loopback_addresses_are_told_from_the_network_ones(monkeypatch, tmp_path):
    from infra.services import is_loopback_address

    assert all(map(is_loopback_address, ["127.0.0.1:6379", "localhost:1", "[::1]:6379", "ray://127.0.0.1:10001"]))
    assert not any(map(is_loopback_address, ["10.0.0.5:6379", "192.0.2.2:41831", "head.example:6379"]))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:41831")
    assert is_loopback_address("auto")
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert not is_loopback_address("auto")  # no note of a cluster
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("192.0.2.2:6379\n")
    assert not is_loopback_address("auto")
    assert _loopback("::ffff:127.0.0.1") and _loopback("127.0.0.1") and not _loopback("0.0.0.0")
    assert not _loopback("::") and not _loopback("192.0.2.2")


@pytest.mark.timeout(120)
def test_ray_token_is_made_when_missing_and_kept_when_present(monkeypatch, tmp_path):
    """``ray start`` in token mode refuses to start without a token: the head makes Ray's own, once (through
    the ``ray`` command: Ray is not imported here)."""
    if not (Path(sys.executable).parent / "ray").exists():
        pytest.skip("Ray is not installed")
    from infra.services import ensure_ray_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    ensure_ray_token()
    made = (tmp_path / ".ray" / "auth_token").read_text()
    assert len(made) >= 32
    ensure_ray_token()
    assert (tmp_path / ".ray" / "auth_token").read_text() == made


def _drive(address: str, ckpt_dir: str) -> None:
    """The flow's side, run in its own process (as ``rao run`` is; Ray reads its token mode when it is imported,
    so this test's process, where other tests may have imported Ray already, cannot be the driver): join the
    head, place one replica, run a task on a worker; print what runs where as one ``LOOPBACK`` JSON line, then
    wait for a line on stdin before stopping."""
    import json
    import sys

    import ray

    from tasks import serve
    from infra.stage_records import Checkpoint
    from tests.pipeline.test_ray_replicas import _ctx

    ctx = _ctx(f"execution.ray_address={address}", "serving.replicas=1", "execution.cpus_per_replica=1")
    served = serve.serve_checkpoint.fn(ctx, Checkpoint(name="iter-0", local=ckpt_dir))  # joins (rollouts.connect)
    worker = ray.get(ray.remote(num_cpus=1)(lambda: os.getpid()).remote(), timeout=120)  # a task on a worker
    replica = serve.POOL.servers[0]
    print("LOOPBACK " + json.dumps({"driver": os.getpid(), "worker": worker, "replica_pid": replica.pid,
                                    "replica_port": replica.port, "urls": served.urls,
                                    "nodes": [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]}),
          flush=True)
    sys.stdin.readline()
    serve.shutdown_server()
    ray.shutdown()


@pytest.mark.services
@pytest.mark.timeout(600)
def test_the_local_ray_head_its_workers_and_its_replicas_listen_on_loopback_only(tmp_path):
    """A real head (``RayHead``, as ``rao services up --ray`` starts it) joined by a flow process that places a
    replica and runs a task: every listening socket of the head's processes, their children (the workers, the
    replica's server) and the flow's process is on 127.0.0.1 or ::1."""
    import json

    pytest.importorskip("ray")
    from infra.process import group_members
    from infra.services import RAY_LOOPBACK_ENV, RayHead

    fake_python = tmp_path / "fake-python"
    fake_python.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.pipeline.fake_vllm_main \"$@\"\n")
    fake_python.chmod(fake_python.stat().st_mode | stat.S_IEXEC)
    token = tmp_path / "ray-token"
    token.write_text("0123456789abcdef" * 4)
    ckpt = tmp_path / "iter-0"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    env = {**os.environ, "RAO_VLLM_PYTHON": str(fake_python), "RAO_HOME": str(tmp_path / "home"),
           "RAY_AUTH_TOKEN_PATH": str(token),  # not ~/.ray/auth_token (test_ray_token_is_made_...)
           "RAY_AUTH_MODE": "token"}  # what `rao services up --ray` exports; the driver sets the loopback mode
    for k in (*RAY_LOOPBACK_ENV, "RAY_ADDRESS"):
        env.pop(k, None)
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_TOKEN_PATH", "RAO_HOME")}
    os.environ.update(RAY_AUTH_TOKEN_PATH=str(token), RAO_HOME=str(tmp_path / "home"))  # for the head's env
    head = driver = None
    try:
        head = RayHead(num_cpus=2, object_store_gib=0.3, log_dir=tmp_path / "logs").start()
        code = f"from tests.infra.test_ray_loopback import _drive; _drive({head.address!r}, {str(ckpt)!r})"
        driver = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = []
        for line in driver.stdout:
            seen.append(line)
            if line.startswith("LOOPBACK "):
                break
        else:
            pytest.fail("the flow process ended before it reported:\n" + "".join(seen)[-3000:])
        info = json.loads(line.removeprefix("LOOPBACK "))

        assert info["nodes"] == ["127.0.0.1"]
        assert info["urls"] == [f"http://127.0.0.1:{info['replica_port']}/v1"]
        session = _tree(group_members(head.pid)) | {info["driver"]}  # the head's group, its children, the flow
        assert {info["worker"], info["replica_pid"]} <= session
        listening = _listening(session)
        ports = {port for _, port in listening}
        assert {head.port, info["replica_port"]} <= ports, listening  # the GCS and the replica's server were found
        assert len(listening) >= 5, listening  # GCS, raylet (2), a worker, the client server, ...
        exposed = {f"{ip}:{port}": who for (ip, port), who in listening.items() if not _loopback(ip)}
        assert exposed == {}, f"listening beyond loopback: {exposed}"
    finally:
        if driver is not None:
            try:
                driver.communicate("\n", timeout=120)
            except subprocess.TimeoutExpired:
                driver.kill()
                driver.wait()
        if head is not None:
            head.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
