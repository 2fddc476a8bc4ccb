"""Process groups on Linux: is a process alive, and stop a whole group (SIGTERM, then SIGKILL).

The lowest layer's copy, so that ``rao_core`` (the trainer's launch) and ``infra`` (the services,
``infra.process``, which re-exports these) stop groups the same way. Reads ``/proc``.

A process is named across time by its pid and its start time (:func:`start_time`): a record of both
(:func:`process_record`) never makes another process that reuses the pid look like the one recorded
(:func:`same_process`). :func:`watch_parent` (run as ``python -m rao_core.process_group PID``) is the orphan
guard: it outlives a parent killed with SIGKILL and stops the processes the parent had started.
"""

from __future__ import annotations

import json
import os
import signal
import sys
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


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22); None when no such
    process exists. With the pid it names one process: a later process that reuses the pid starts later."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().split(")")[-1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_record(pid: int, **extra: object) -> dict:
    """A record naming process ``pid`` across time: ``{"pid", "start_time", "host"}`` plus ``extra``."""
    return {"pid": pid, "start_time": start_time(pid), "host": os.uname().nodename, **extra}


def same_process(record: dict | None) -> bool:
    """True when the process a :func:`process_record` names still runs on this machine (same pid, same start
    time, not a zombie); False for a record of another host or a malformed one."""
    try:
        pid, started = int(record["pid"]), record["start_time"]  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return False
    if record.get("host", os.uname().nodename) != os.uname().nodename:  # type: ignore[union-attr]
        return False
    return started is not None and pid_alive(pid) and start_time(pid) == started


def read_record(path: Path) -> dict | None:
    """The JSON record at ``path``; None when it is missing or not a JSON object."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def write_record(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` as JSON (a temporary file renamed over it; mode 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))
    os.replace(tmp, path)


def _table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, process group, start time) of every live (not zombie) process."""
    out: dict[int, tuple[int, int, int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().split(")")[-1].split()
                if f[0] != "Z":
                    out[int(d.name)] = (int(f[1]), int(f[2]), int(f[19]))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _descendants(table: dict[int, tuple[int, int, int]], root: int) -> dict[int, tuple[int, int]]:
    """pid -> (process group, start time) of the descendants of ``root`` in ``table``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        p = todo.pop()
        if p not in out:
            out[p] = (table[p][1], table[p][2])
            todo.extend(children.get(p, []))
    return out


def stop_processes(known: dict[int, tuple[int, int]], timeout_s: float = 10.0) -> list[int]:
    """Stop the processes of ``known`` (pid -> (process group, start time)) that still run as the same process,
    the process groups they lead and whatever they started since: SIGTERM, then SIGKILL after ``timeout_s``
    seconds. Returns the pids signalled."""
    me = os.getpid()
    hit: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        table = _table()
        live = {p: v for p, v in known.items() if p != me and table.get(p, (0, 0, -1))[2] == v[1]}
        for p in list(live):  # what they started meanwhile
            live.update({c: v for c, v in _descendants(table, p).items() if c != me})
        groups = {g for p, (g, _) in live.items() if g == p}
        for p in live:
            try:
                os.kill(p, sig)
                hit.append(p)
            except (ProcessLookupError, PermissionError):
                pass
        for g in groups:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if not live:
            break
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            if not any(pid_alive(p) for p in live) and not any(group_members(g) for g in groups):
                return sorted(set(hit))
            time.sleep(0.1)
    return sorted(set(hit))


def watch_parent(parent: int, parent_start: int | None = None, interval_s: float = 1.0,
                 timeout_s: float = 10.0) -> list[int]:
    """The orphan guard: while process ``parent`` (started at ``parent_start``, default: its start time now)
    runs, note its descendants (every process it started, those in sessions of their own included) every
    ``interval_s`` seconds; once it is gone (exited, or killed with SIGKILL, which runs none of its own clean-up),
    stop those still running (:func:`stop_processes`, ``timeout_s`` seconds of SIGTERM) and return their pids.
    Run it in a session of its own (``python -m rao_core.process_group PARENT``, started by the parent): a
    signal to the parent's process group then does not reach it. A child started less than ``interval_s``
    before the parent died may be missed (the trainer's own record covers it: ``rao_core.train.launch``)."""
    parent_start = parent_start if parent_start is not None else start_time(parent)
    known: dict[int, tuple[int, int]] = {}
    while True:
        table = _table()
        if parent not in table or table[parent][2] != parent_start:
            return stop_processes(known, timeout_s)
        known = {p: v for p, v in _descendants(table, parent).items() if p != os.getpid()}
        time.sleep(interval_s)


if __name__ == "__main__":  # the orphan guard: python -m rao_core.process_group PARENT_PID [PARENT_START]
    watch_parent(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
