"""Managed background services: start, health-check, stop, with no orphan processes.

Every embedded service (vLLM, SeaweedFS, MLflow server, Prefect server) is a child process started in
its own session (process group), bound to loopback on a free port, logging to one file under the run
folder. ``stop()`` sends SIGTERM to the whole group, waits, then SIGKILLs what is left, so a service's
own children (vLLM's engine core, uvicorn workers) go too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


class ServiceError(RuntimeError):
    """A service failed to start or died; the message names it and points at its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 30) -> str:
    """Last ``n`` lines of a log file (empty string if absent)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


def pid_alive(pid: int) -> bool:
    """True if a process with ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def kill_group(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL after ``timeout_s`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            if not pid_alive(pid) and not _group_members(pid):
                return
            time.sleep(0.1)


def _group_members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().split(")")[-1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


@dataclass
class ManagedProcess:
    """One service process. Use as a context manager or call ``start()``/``stop()``.

    ``health_url`` is polled (HTTP GET, any status < 500) until healthy or ``start_timeout_s`` seconds.
    """

    name: str
    cmd: list[str]
    log_path: Path
    health_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    start_timeout_s: float = 300.0
    proc: subprocess.Popen | None = None
    start_seconds: float = 0.0

    def start(self) -> "ManagedProcess":
        """Start the process and wait until it is healthy; raises ServiceError with the log tail."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env}, cwd=self.cwd, start_new_session=True,
        )
        log.close()
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        if self.health_url is None:
            return
        while True:
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with code {self.proc.returncode} during start-up; "
                    f"log {self.log_path}:\n{tail(self.log_path)}"
                )
            try:
                if httpx.get(self.health_url, timeout=2.0).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > self.start_timeout_s:
                raise ServiceError(
                    f"{self.name} not healthy at {self.health_url} after {self.start_timeout_s:.0f} s; "
                    f"log {self.log_path}:\n{tail(self.log_path)}"
                )
            time.sleep(0.5)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the whole process group (SIGTERM, then SIGKILL)."""
        if self.proc is None:
            return
        kill_group(self.proc.pid, timeout_s)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> "ManagedProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServiceMixin:
    """Common handle methods of the service classes (each has ``process`` and ``start()``)."""

    process: ManagedProcess | None

    @property
    def pid(self) -> int | None:
        """Pid of the service's process group leader (None before start)."""
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        """True while the service process runs."""
        return self.process is not None and self.process.alive()

    def stop(self) -> None:
        """Stop the service and every process of its group."""
        if self.process:
            self.process.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
