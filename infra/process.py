"""Managed background services: start, health-check, stop, with no orphan processes.

Every embedded service (vLLM, SeaweedFS, MLflow server, Prefect server, Ray head) is a child process started
in its own session (process group), bound to loopback on a free port, logging to one file under the run
folder. ``stop()`` sends SIGTERM to the whole group, waits, then SIGKILLs what is left, so a service's
own children (vLLM's engine core, uvicorn workers) go too.

Ports. A port the kernel hands out for ``bind(0)`` comes from its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the range every outgoing connection takes
its source port from: between the pick and the service's own bind any connection may take it (``weed mini``
alone binds a dozen). :func:`pick_ports` picks outside that range instead, each port checked free at pick time
and never handed out twice within :data:`PORT_MEMORY_S` by this process; :func:`start_on_fresh_ports` restarts a
service whose log says a port of it was taken all the same (:data:`PORT_IN_USE`), on fresh ports, at most
:data:`PORT_ATTEMPTS` times, with one ``warning:`` line per retry, and raises :class:`PortInUseError` naming the
service, the port, what holds it and the log when every attempt failed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from rao_core.process_group import group_members, kill_group, pid_alive, start_time  # noqa: F401 (re-exported)

T = TypeVar("T")


class ServiceError(RuntimeError):
    """A service failed to start or died; the message names it and points at its log."""


class StartTimeout(ServiceError):
    """A service did not answer within its start time-out; the message says what it was doing (its last phase and
    log lines where known) and names its log."""


#: Where Linux says which ports outgoing connections (and ``bind(0)``) draw their local port from: "LOW<tab>HIGH".
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The ephemeral range assumed where that file is missing or unreadable: Linux's default low end (32768) up to
#: the top (macOS and the BSDs use IANA's 49152-65535), so that a port picked outside it is outside either.
FALLBACK_EPHEMERAL_RANGE = (32768, 65535)
#: The lowest port a service is given: below it lie the usual development ports (3000, 5000, 8000, 8080, ...) and
#: Ray's worker ports (10002-19999 by default).
SERVICE_PORT_MIN = 20000
#: Seconds a port handed out by :func:`pick_ports` is not handed out again by this process (its service may not
#: have bound it yet; replicas start in parallel threads).
PORT_MEMORY_S = 600.0
#: Starts of a service whose port was taken, in all (:func:`start_on_fresh_ports`).
PORT_ATTEMPTS = 3
#: A log line saying that a port could not be bound: Go's ``bind: address already in use`` (SeaweedFS), uvicorn's
#: ``[Errno 98] error while attempting to bind on address (...): address already in use`` (MLflow, Prefect,
#: vLLM), Prefect's ``Port N is already in use``, Ray's ``Failed to bind to HOST:PORT because it's already
#: occupied`` / ``port N that is used by other components``, and ``weed mini``'s own check: ``port N for S3
#: (specified by flag s3.port) is not available on 127.0.0.1``.
PORT_IN_USE = re.compile(r"address already in use|\bport \d+ is already in use|already occupied|"
                         r"used by other components|\bport \d+\b[^\n]{0,80}?\bnot available|EADDRINUSE", re.I)
_PORT_NUMBER = re.compile(r"(?:\bport\s+|:|\(\s*'[^']*',\s*)(\d{1,5})\b", re.I)

_given: dict[int, float] = {}  # port -> when pick_ports handed it out (time.monotonic)
_given_lock = threading.Lock()
_rng = random.Random()  # seeded from the OS: two processes picking at once pick different ports


def ephemeral_port_range(path: Path | str | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range ``(low, high)``, inclusive, read from ``path`` (two integers; default
    :data:`EPHEMERAL_RANGE_FILE`); the :data:`FALLBACK_EPHEMERAL_RANGE` when the file is missing, unreadable or
    not two ports ``low <= high`` (never raises)."""
    try:
        low, high = (int(v) for v in Path(path or EPHEMERAL_RANGE_FILE).read_text().split())
    except (OSError, ValueError):
        return FALLBACK_EPHEMERAL_RANGE
    if not 1 <= low <= high <= 65535:
        return FALLBACK_EPHEMERAL_RANGE
    return low, high


def service_port_ranges(ephemeral: tuple[int, int] | None = None) -> list[range]:
    """The ports services are picked from: ``SERVICE_PORT_MIN..65535`` less the ephemeral range ``ephemeral``
    (default :func:`ephemeral_port_range`); with 32768-60999, 20000-32767 and 61000-65535. When that leaves
    nothing (an ephemeral range that covers it all), 1024-65535 less the range; when that leaves nothing too,
    ``SERVICE_PORT_MIN..65535`` itself (a race then stays possible: :func:`start_on_fresh_ports` covers it)."""
    low, high = ephemeral or ephemeral_port_range()
    for floor in (SERVICE_PORT_MIN, 1024):
        ranges = [r for r in (range(floor, min(low, 65536)), range(max(high + 1, floor), 65536)) if len(r)]
        if ranges:
            return ranges
    return [range(SERVICE_PORT_MIN, 65536)]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could bind TCP ``host:port`` now: nothing listens there (nor on every address), no
    connection uses it as its local port. Checked by binding it (without ``SO_REUSEADDR``, so a port of a
    connection closing, in TIME_WAIT, counts as taken) and closing at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def pick_ports(n: int = 1, *, host: str = "127.0.0.1", ranges: list[range] | None = None,
               is_free: Callable[[int, str], bool] = port_is_free) -> list[int]:
    """``n`` distinct TCP ports for services on ``host``, at random from ``ranges`` (default
    :func:`service_port_ranges`: outside the kernel's ephemeral range, so no outgoing connection takes one
    between this pick and the service's bind), each free at pick time (``is_free``) and none handed out by this
    process in the last :data:`PORT_MEMORY_S` seconds. Thread-safe.

    Raises ServiceError when ``n`` free ports are not found in ``max(200, 20 n)`` tries."""
    pool = ranges or service_port_ranges()
    total = sum(len(r) for r in pool)
    if n < 1 or total < 1:
        raise ServiceError(f"cannot pick {n} port(s) from {total} candidate ports")
    chosen: list[int] = []
    with _given_lock:
        now = time.monotonic()
        for p, t in list(_given.items()):
            if now - t > PORT_MEMORY_S:
                del _given[p]
        for _ in range(max(200, 20 * n)):
            k = _rng.randrange(total)
            for r in pool:
                if k < len(r):
                    port = r[k]
                    break
                k -= len(r)
            if port not in chosen and port not in _given and is_free(port, host):
                chosen.append(port)
                if len(chosen) == n:
                    for p in chosen:
                        _given[p] = now
                    return chosen
    raise ServiceError(f"found only {len(chosen)} of {n} free TCP port(s) on {host} in "
                       f"{', '.join(f'{r.start}-{r.stop - 1}' for r in pool)} (outside the kernel's ephemeral range "
                       f"{EPHEMERAL_RANGE_FILE}); stop what holds them")


def free_port() -> int:
    """One TCP port on 127.0.0.1 that is free right now, outside the kernel's ephemeral range
    (:func:`pick_ports`). Raises ServiceError when none is found."""
    return pick_ports(1)[0]


@dataclass(frozen=True)
class PortClash:
    """A service's log line saying a port could not be bound: ``port`` (None when the line names none) and the
    line."""

    port: int | None
    line: str


def find_port_clash(text: str, ports: Iterable[int] = ()) -> PortClash | None:
    """The first line of ``text`` (a service's log) that says a port of ``ports`` was in use
    (:data:`PORT_IN_USE`), as a :class:`PortClash`: the port of ``ports`` the line names, or, for a line that
    names no port (vLLM's ``OSError: [Errno 98] Address already in use``), the first of ``ports`` (its main
    port). A line that names only other ports (a library's own, e.g. torch's rendezvous port) is not one of
    ``ports``' clashes and is skipped. With ``ports`` empty: the first such line, with the first port it names."""
    ours = list(ports)
    for line in text.splitlines():
        if not PORT_IN_USE.search(line):
            continue
        named = [int(m) for m in _PORT_NUMBER.findall(line) if 1024 <= int(m) <= 65535]
        if not ours:
            return PortClash(named[0] if named else None, line.strip())
        mine = [p for p in named if p in ours]
        if mine:
            return PortClash(mine[0], line.strip())
        if not named:
            return PortClash(ours[0], line.strip())
    return None


def port_holder(port: int, host: str = "127.0.0.1") -> str:
    """What holds TCP ``port`` now, as words for an error line: ``pid 123 (weed mini -dir=...) listening on
    127.0.0.1:8333``, ``a connection 127.0.0.1:40000 -> 127.0.0.1:8333 (ESTABLISHED) of pid 9 (curl ...)``,
    ``a process this user cannot see``, or ``nothing holds it any more (...)``. Asks psutil
    (``net_connections``), else ``ss``; never raises."""
    try:
        import psutil

        conns = [c for c in psutil.net_connections(kind="tcp") if c.laddr and c.laddr.port == port]
    except Exception:  # noqa: BLE001 - psutil missing or refused: ask ss
        return _ss_holder(port)
    if not conns:
        return "nothing holds it any more (a short-lived socket took it)"
    conns.sort(key=lambda c: c.status != "LISTEN")
    c = conns[0]
    who = _describe_pid(c.pid)
    local = f"{c.laddr.ip}:{c.laddr.port}"
    if c.status == "LISTEN":
        return f"{who} listening on {local}"
    remote = f"{c.raddr.ip}:{c.raddr.port}" if c.raddr else "?"
    return f"a connection {local} -> {remote} ({c.status}) of {who}"


def _describe_pid(pid: int | None) -> str:
    if not pid:
        return "a process this user cannot see"
    try:
        import psutil

        p = psutil.Process(pid)
        cmd = " ".join(p.cmdline()) or p.name()
    except Exception:  # noqa: BLE001 - gone meanwhile
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:100]}{' ...' if len(cmd) > 100 else ''})"


def _ss_holder(port: int) -> str:
    try:
        out = subprocess.run(["ss", "-Htanp", f"( sport = :{port} )"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "what holds it is unknown (neither psutil nor ss could tell)"
    if not out:
        return "nothing holds it any more (a short-lived socket took it)"
    return "held by: " + " ".join(out.splitlines()[0].split())


class PortInUseError(ServiceError):
    """A service could not bind one of its ports on any of its starts: the message names the service, the port,
    what holds it and the log. ``service``, ``port`` and ``log_path`` are kept as attributes."""

    def __init__(self, message: str, *, service: str, port: int | None, log_path: Path | None):
        super().__init__(message)
        self.service, self.port, self.log_path = service, port, log_path


def start_on_a_fresh_port(service: str, owner: Any, fixed: int) -> Any:
    """:func:`start_on_fresh_ports` for a service of one port: ``owner.port`` (0: ``owner._start_once()`` picks
    one), its ``owner.process``; a retry puts ``owner.port`` back to ``fixed`` (0: pick again), and a port set by
    hand (``fixed`` not 0) is never retried. Returns and raises as :func:`start_on_fresh_ports`."""
    def repick() -> None:
        owner.port = fixed

    return start_on_fresh_ports(service, owner._start_once, process=lambda: owner.process, repick=repick,
                                repickable=lambda port: not fixed)


def start_on_fresh_ports(service: str, start_once: Callable[[], T], *,
                         process: Callable[[], "ManagedProcess | None"], repick: Callable[[], None],
                         repickable: Callable[[int | None], bool] = lambda port: True,
                         attempts: int | None = None) -> T:
    """``start_once()``, started again on fresh ports (``repick()``) when it raised ServiceError and the part of
    its log this start wrote (``process()``'s :meth:`ManagedProcess.port_clash`) says a port of it was in use:
    at most ``attempts`` starts in all, each retry announced by one ``warning:`` line on stderr naming the
    service, the port and what holds it. A port the user chose (``repickable(port)`` False) is not retried.
    ``attempts`` None: :data:`PORT_ATTEMPTS` (read at each call).

    Returns ``start_once()``'s value. Raises :class:`PortInUseError` (the service, the port, what holds it, the
    ports tried, the log) when the last start failed on a port; the ServiceError of a start that failed for
    another reason as it is."""
    attempts = PORT_ATTEMPTS if attempts is None else attempts
    tried: list[int | None] = []
    for attempt in range(1, attempts + 1):
        try:
            return start_once()
        except ServiceError as e:
            proc = process()
            clash = e.clash if isinstance(e, _PortClashError) else (proc.port_clash() if proc is not None else None)
            if clash is None:
                raise
            tried.append(clash.port)
            log = proc.log_path if proc is not None else None
            where = f"port {clash.port} on 127.0.0.1" if clash.port else "one of its ports on 127.0.0.1"
            holder = port_holder(clash.port) if clash.port else "unknown"
            if attempt == attempts or not repickable(clash.port):
                if len(tried) > 1:
                    times = f" on each of its {len(tried)} starts (ports {', '.join(str(p) for p in tried)} in turn)"
                else:
                    times = " (a port set by hand is not changed)" if not repickable(clash.port) else ""
                raise PortInUseError(f"{service} could not bind {where}: it is in use{times}; now: {holder}; its "
                                     f"log says: {clash.line[:200]}; log {log}", service=service, port=clash.port,
                                     log_path=log) from None
            print(f"warning: {service}: {where} was taken before it could bind it (now: {holder}); restarting it "
                  f"on fresh ports (start {attempt + 1} of {attempts}; log {log})", file=sys.stderr, flush=True)
            repick()
    raise AssertionError("unreachable")  # pragma: no cover


class _PortClashError(ServiceError):
    """Raised by :class:`ManagedProcess` while it waits, as soon as its log says one of its ports was in use."""

    def __init__(self, message: str, clash: PortClash):
        super().__init__(message)
        self.clash = clash


def tail(path: Path, n: int = 30) -> str:
    """Last ``n`` lines of a log file (empty string if absent)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


@dataclass
class ManagedProcess:
    """One service process. Use as a context manager or call ``start()``/``stop()``.

    ``health_url`` is polled (HTTP GET, any status < 500) until healthy or ``start_timeout_s`` seconds;
    ``on_wait`` (if set) is called after each poll while it waits (e.g. to report the start's phases from
    the log, :class:`infra.serving.StartupWatch`). ``ports``: the ports the service was told to bind (its main
    one first); while it waits, a log line saying one of them is in use (:func:`find_port_clash`) ends the
    wait at once with a ServiceError (:func:`start_on_fresh_ports` then restarts it on fresh ports).
    ``log_offset``: the size of the log when the last start began (bytes; the log is appended to).
    ``on_spawn`` (if set) is called with the pid as soon as the process exists, before the wait (e.g. to record it,
    so that a run cancelled during a long start can still stop it from another process). ``describe`` (if set)
    says what the start was doing, for the time-out's message (e.g. :meth:`infra.serving.StartupWatch.state`);
    else the message carries the log's last lines.
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
    ports: tuple[int, ...] = ()
    log_offset: int = 0
    on_spawn: Callable[[int], None] | None = None
    describe: Callable[[], str] | None = None

    def start(self) -> "ManagedProcess":
        """Start the process and wait until it is healthy; raises ServiceError with the log tail (at once when
        its log says one of ``ports`` is in use)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        log = open(self.log_path, "ab")
        self.log_offset = self._scanned = log.tell()
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env}, cwd=self.cwd, start_new_session=True,
        )
        log.close()
        try:
            if self.on_spawn is not None:
                self.on_spawn(self.proc.pid)
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def log_text(self) -> str:
        """What the process wrote to its log since its last start began (empty before a start)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def port_clash(self) -> PortClash | None:
        """The first line its last start logged saying one of ``ports`` was in use (:func:`find_port_clash`), or
        None."""
        return find_port_clash(self.log_text(), self.ports)

    def check_ports(self) -> None:
        """Raise ServiceError (naming the port and the log) when the lines its log gained since the last call (of
        this start) say one of ``ports`` is in use; with no ``ports``, nothing."""
        if not self.ports:
            return
        start = max(self.log_offset, getattr(self, "_scanned", 0))
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._scanned = start + end
        clash = find_port_clash(data[:end].decode(errors="replace"), self.ports)
        if clash is not None:
            raise _PortClashError(f"{self.name}: port {clash.port} on 127.0.0.1 is in use ({clash.line[:200]}); "
                                  f"log {self.log_path}", clash)

    def _wait_healthy(self, t0: float) -> None:
        if self.health_url is None:
            return
        while True:
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with code {self.proc.returncode} during start-up; "
                    f"log {self.log_path}:\n{tail(self.log_path)}"
                )
            self.check_ports()
            try:
                if httpx.get(self.health_url, timeout=2.0).status_code < 500:
                    self.check_ports()  # what answered may be whatever holds its port
                    return
            except httpx.HTTPError:
                pass
            if self.on_wait is not None:
                self.on_wait()
            if time.monotonic() - t0 > self.start_timeout_s:
                if self.describe is not None:  # what it was doing first: an error line is cut after a few hundred
                    raise StartTimeout(f"{self.name} not healthy at {self.health_url} after "
                                       f"{self.start_timeout_s:.0f} s (the start time-out): {self.describe()}; "
                                       f"log {self.log_path}")
                raise StartTimeout(
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
                if not any(pid_alive(p) for p in pids) and not any(group_members(g) for g in groups):
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


def start_orphan_guard() -> subprocess.Popen | None:
    """Start the orphan guard of this process (``rao_core.process_group.watch_parent``, in a session of its own):
    should this process die without stopping what it started (SIGKILL, the out-of-memory killer), the guard stops
    every process it had started (services, the trainer, Prefect's API server) within about ``10 s``. Stop it with
    :func:`stop_orphan_guard` once the work is done. None where there is no ``/proc`` (not Linux)."""
    if not Path("/proc/self/stat").exists():
        return None
    me = os.getpid()
    return subprocess.Popen([sys.executable, "-m", "rao_core.process_group", str(me), str(start_time(me))],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [str(Path(__file__).resolve().parent.parent)]
                                + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])})


def stop_orphan_guard(guard: subprocess.Popen | None) -> None:
    """End the guard of :func:`start_orphan_guard` without it stopping anything (the work ended normally)."""
    if guard is not None and guard.poll() is None:
        guard.kill()
        guard.wait()


def run_interruptible(fn, on_interrupt, *, grace_s: float = 5.0, stop_timeout_s: float = 10.0,
                      orphan_guard: bool = True):
    """Run ``fn()`` in a worker thread so that SIGINT and SIGTERM reach this (main) thread at once, whatever
    ``fn`` is doing (a Prefect flow would otherwise take SIGTERM for itself and spend a minute reporting the
    crash to an API the same Ctrl-C has just stopped). Returns ``fn()``'s value or raises its exception.
    Called from another thread, it only calls ``fn()`` (signals reach the main thread alone).

    With ``orphan_guard``, an orphan guard (:func:`start_orphan_guard`) watches this process while ``fn`` runs:
    a SIGKILL, which no handler sees, still leaves no child of it running.

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
    guard = start_orphan_guard() if orphan_guard else None
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
        stop_orphan_guard(guard)
        for s, h in old.items():
            signal.signal(s, h)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")
