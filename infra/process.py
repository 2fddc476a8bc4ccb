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
from collections.abc import Callable
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

    ``health_url`` is polled (HTTP GET, any status < 500) until healthy or ``start_timeout_s`` seconds;
    ``on_wait`` (if set) is called after each poll while it waits (e.g. to report the start's phases from
    the log, :class:`infra.serving.StartupWatch`).
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
    on_wait: Callable[[], None] | None = None

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
            if self.on_wait is not None:
                self.on_wait()
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


def descendants(pid: int | None = None) -> list[int]:
    """Pids of the live descendants of ``pid`` (default: this process), parents before their children."""
    root = pid or os.getpid()
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().split(")")[-1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(d.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def stop_descendants(timeout_s: float = 10.0) -> list[int]:
    """Stop every descendant of this process: SIGTERM to each (and to the whole group of each one that leads
    its own, as services do), then SIGKILL what is left after ``timeout_s`` seconds; returns the pids found.
    Repeated until none is left (a dying parent may have started another child meanwhile), at most 3 times."""
    seen: list[int] = []
    own_group = os.getpgrp()
    for _ in range(3):
        pids = descendants()
        if not pids:
            break
        seen += pids
        groups = {p for p in pids if _pgid(p) == p and p != own_group}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in pids:
                _signal(os.kill, p, sig)
            for g in groups:
                _signal(os.killpg, g, sig)
            deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5.0)
            while time.monotonic() < deadline:
                _reap()
                if not any(pid_alive(p) for p in pids) and not any(_group_members(g) for g in groups):
                    break
                time.sleep(0.05)
            else:
                continue
            break
    return seen


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _signal(send, target: int, sig: int) -> None:
    try:
        send(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap() -> None:
    """Collect this process's exited children, so they do not stay zombies while we wait."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def run_interruptible(fn, on_interrupt, *, grace_s: float = 5.0, stop_timeout_s: float = 10.0):
    """Run ``fn()`` in a worker thread so that SIGINT and SIGTERM reach this (main) thread at once, whatever
    ``fn`` is doing (a Prefect flow would otherwise take SIGTERM for itself and spend a minute reporting the
    crash to an API the same Ctrl-C has just stopped). Returns ``fn()``'s value or raises its exception.
    Called from another thread, it only calls ``fn()`` (signals reach the main thread alone).

    On the first signal: ``KeyboardInterrupt`` is raised inside ``fn`` (its ``finally`` blocks stop what they
    started) and given ``grace_s`` seconds; then ``on_interrupt(signum)`` runs (e.g. marks the tracking runs
    KILLED) and returns the message; then every child process left is stopped (:func:`stop_descendants`),
    ``error: <message>`` is printed on stderr and the process exits with 128 + signum (130 for Ctrl-C, 143
    for SIGTERM) without running ``atexit`` handlers. This process's other output is dropped meanwhile
    unless ``RAO_DEBUG`` is set (then every thread's stack is dumped first). A second signal skips the waiting.
    """
    import ctypes
    import contextvars
    import faulthandler
    import logging
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        return fn()
    box: dict[str, object] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            box["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=contextvars.copy_context().run, args=(target,), name="rao-interruptible",
                              daemon=True)
    received: list[int] = []

    def handler(signum, frame) -> None:
        received.append(signum)
        if len(received) == 1:
            raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.start()
        while not done.wait(0.2):
            pass
    except KeyboardInterrupt:
        signum = received[0] if received else signal.SIGINT
        sys.stdout.flush()
        sys.stderr.flush()
        err = os.dup(2)
        if os.environ.get("RAO_DEBUG"):
            faulthandler.dump_traceback(all_threads=True)
        else:  # the threads' reports of what the interrupt broke (Prefect's loggers ignore logging.disable)
            logging.disable(logging.CRITICAL)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(KeyboardInterrupt))
        deadline = time.monotonic() + grace_s
        while len(received) < 2 and time.monotonic() < deadline and not done.wait(0.1):
            pass
        try:
            message = on_interrupt(signum)
        except Exception as e:  # noqa: BLE001 - still stop the children and exit
            message = f"interrupted ({type(e).__name__} while cleaning up: {e})"
        stop_descendants(0.5 if len(received) > 1 else stop_timeout_s)
        os.write(err, f"error: {message}\n".encode())
        os._exit(128 + signum)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")
