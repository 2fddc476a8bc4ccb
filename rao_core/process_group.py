"""Process groups on Linux: is a process alive, and stop a whole group (SIGTERM, then SIGKILL).

The lowest layer's copy, so that ``rao_core`` (the trainer's launch) and ``infra`` (the services,
``infra.process``, which re-exports these) stop groups the same way. Reads ``/proc``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True if a process with ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def kill_group(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM the process group led by ``pid`` (a process started in its own session), then SIGKILL after
    ``timeout_s`` seconds; returns once the leader and every other member are gone or zombies (a member whose
    parent already exited included), or 5 s after the SIGKILL. Reaps the leader when it is this process's child."""
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
            if not pid_alive(pid) and not group_members(pid):
                return
            time.sleep(0.1)


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group ``pgid``."""
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
