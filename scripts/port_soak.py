"""Port soak of the embedded S3 store (docs/benchmarks/soak.md "Embedded services: port soak").

Starts and stops the embedded SeaweedFS (``infra.storage.SeaweedFSServer``: ``weed mini``, 11 ports) ``--n`` times
in a row, each start writing and reading back one object, while threads beside it open and close loopback
connections as fast as they can (each connection takes a source port from the kernel's ephemeral range, as every
outgoing connection of a busy machine does). A start that raises counts as a failure; a start that needed a retry
on fresh ports (a ``warning:`` line of ``infra.process.start_on_fresh_ports``) is counted apart. Prints
``failures: F / N`` at the end; exits 1 when F > 0.

Everything is on 127.0.0.1, under a fresh temporary RAO_HOME (removed at the end), bounded in count (``--n``
starts, ``--max-connections``) and in time (``--timeout-s``: no new start after it).

``--picker kernel --attempts 1`` gives the services' ports as they were picked before (``bind(0)``: the kernel's
ephemeral range, the same one the connections draw from) with no retry, for comparison.

Usage: python scripts/port_soak.py [--n 10] [--threads 2] [--hold 256] [--timeout-s 900]
                                   [--picker service|kernel] [--attempts 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def kernel_ports(n: int = 1, **_kw) -> list[int]:
    """``n`` ports the way they were picked before: ``bind(("127.0.0.1", 0))`` and close, one by one."""
    out = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            out.append(s.getsockname()[1])
    return out


class Churn:
    """Threads that open loopback connections to a listener of their own and close them, until stopped or
    ``limit`` connections were opened; each opens ``hold`` connections, keeps them open ``hold_s`` seconds, closes
    them and starts again, so that some hundreds of source ports are held at any time, a few milliseconds each
    (as a busy machine's connections hold theirs)."""

    def __init__(self, threads: int, limit: int, hold: int = 256, hold_s: float = 0.02):
        self.hold_s = hold_s
        self.limit, self.hold, self.count, self.errors = limit, hold, 0, 0
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(1024)
        self.server.settimeout(0.2)
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads += [threading.Thread(target=self._connect, daemon=True) for _ in range(threads)]

    def __enter__(self) -> "Churn":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=5)
        self.server.close()

    def _accept(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, _ = self.server.accept()
                conn.close()
            except OSError:
                continue

    def _connect(self) -> None:
        addr = self.server.getsockname()
        while not self.stop_event.is_set():
            with self.lock:
                if self.count >= self.limit:
                    return
                self.count += self.hold
            held = []
            for _ in range(self.hold):
                s = socket.socket()
                try:
                    s.connect(addr)
                    held.append(s)
                except OSError:
                    self.errors += 1
                    s.close()
            time.sleep(self.hold_s)
            for s in held:
                s.close()


def one_start(i: int, data: Path, logs: Path) -> tuple[bool, int, str]:
    """Start the store, write and read back one object, stop it: (ok, retries, the error's first line)."""
    from infra.storage import ArtifactStore, SeaweedFSServer

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            with SeaweedFSServer(data_dir=data, log_dir=logs) as srv:
                store = ArtifactStore(srv.settings(), "soak")
                src = data.parent / "object.txt"
                src.write_text(f"start {i}")
                store.put_file(src, f"o-{i}.txt")
                store.get_file(f"o-{i}.txt", data.parent / "back.txt")
                if (data.parent / "back.txt").read_text() != f"start {i}":
                    raise RuntimeError("the object read back differs")
        ok, why = True, ""
    except Exception as e:  # noqa: BLE001 - counted and named
        ok, why = False, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
    warnings = [ln for ln in err.getvalue().splitlines() if ln.startswith("warning:") and "port" in ln]
    for w in warnings:
        print(f"  {w}", flush=True)
    return ok, len(warnings), why


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10, help="starts of the store (1-500)")
    ap.add_argument("--threads", type=int, default=2, help="connection threads beside it (0-8)")
    ap.add_argument("--hold", type=int, default=256, help="connections each thread holds open at once (1-1000)")
    ap.add_argument("--max-connections", type=int, default=5_000_000, help="connections opened at most, in all")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="no new start after this many seconds")
    ap.add_argument("--picker", choices=("service", "kernel"), default="service",
                    help="service: infra.process.pick_ports (outside the ephemeral range); kernel: bind(0)")
    ap.add_argument("--attempts", type=int, default=None, help="starts per service on a taken port "
                    "(default: infra.process.PORT_ATTEMPTS)")
    a = ap.parse_args(argv)
    if not 1 <= a.n <= 500 or not 0 <= a.threads <= 8 or not 1 <= a.hold <= 1000:
        ap.error("--n must be 1-500, --threads 0-8 and --hold 1-1000")

    home = Path(tempfile.mkdtemp(prefix="rao-port-soak-"))
    os.environ["RAO_HOME"] = str(home)
    import infra.process
    import infra.storage

    if a.picker == "kernel":
        infra.storage.pick_ports = kernel_ports
    if a.attempts is not None:
        infra.process.PORT_ATTEMPTS = a.attempts
    low, high = infra.process.ephemeral_port_range()
    print(f"port soak: {a.n} starts of the embedded S3 store, picker {a.picker}, {a.threads} connection thread(s) "
          f"holding {a.hold} each, "
          f"ephemeral range {low}-{high}, RAO_HOME {home}", flush=True)
    failures, retries, done = 0, 0, 0
    t0 = time.monotonic()
    try:
        with Churn(a.threads, a.max_connections, a.hold) as churn:
            for i in range(a.n):
                if time.monotonic() - t0 > a.timeout_s:
                    print(f"  time limit: stopped after {done} starts", flush=True)
                    break
                t = time.monotonic()
                ok, r, why = one_start(i, home / "data", home / "logs")
                done += 1
                failures += not ok
                retries += r
                retried = f", {r} retr{'y' if r == 1 else 'ies'}" if r else ""
                print(f"  start {i + 1}/{a.n}: {'ok' if ok else 'FAILED'} ({time.monotonic() - t:.1f} s{retried})"
                      f"{f': {why}' if why else ''}", flush=True)
            conns, conn_errors = churn.count, churn.errors
    finally:
        shutil.rmtree(home, ignore_errors=True)
    wall = time.monotonic() - t0
    print(f"failures: {failures} / {done} (starts that needed a retry on fresh ports: {retries}); "
          f"{conns} loopback connections opened beside them ({conn_errors} refused); {wall:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
