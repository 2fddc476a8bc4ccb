"""The REPL server that runs inside a node's sandbox (standard library only; run as a script).

Protocol: JSON lines (the messages: :func:`main`). The orchestrator writes to this process's stdin and reads its
stdout; right at start the server moves those two pipes to private descriptors and points fds 0/1/2 at
/dev/null and a capped log file, so whatever model code prints (``print``, ``os.write(1, ...)``, subprocesses)
is captured as cell output and can never corrupt the protocol stream. Sync tools block the calling thread on a
``threading.Event`` that the reader thread sets, so they work inside coroutines even while ``launch_subagent``
futures are pending; ``launch_subagent`` returns an awaitable resolved on the event loop via
``call_soon_threadsafe``. Docs: docs/sandbox.md#how-a-repl-is-confined.
"""

import ast
import asyncio
import collections  # noqa: F401  (pre-imported for model code)
import functools  # noqa: F401
import inspect
import io
import itertools  # noqa: F401
import json
import math  # noqa: F401
import os
import random  # noqa: F401
import re  # noqa: F401
import resource
import signal
import sys
import threading
import traceback

_PROTO_IN = os.dup(0)
_PROTO_OUT = os.dup(1)
_SEND_LOCK = threading.Lock()
_LOG = {"fd": -1}  # fds 1/2 point at this file (in the work dir); read back after each cell


def _send(msg):
    data = (json.dumps(msg) + "\n").encode()
    with _SEND_LOCK:
        view = memoryview(data)
        while view:
            n = os.write(_PROTO_OUT, view)
            view = view[n:]


class _Finished(BaseException):
    """Raised by finish() to stop the cell (BaseException so `except Exception` does not catch it)."""


class ToolError(Exception):
    """A tool or launch_subagent refused the call; the message says why."""


_LIMITS = {"max_bytes": 262_144, "max_depth": 64}  # set by the orchestrator's "limits" message


def _check_json(value, what, sized=True):
    """Return ``value`` as JSON text, or raise ToolError: nested deeper than ``_LIMITS["max_depth"]``
    containers, NaN or infinity (not JSON), not JSON-serialisable, or (``sized``) longer than
    ``_LIMITS["max_bytes"]`` characters. The orchestrator checks the same again outside the sandbox."""
    limit = _LIMITS["max_depth"]
    stack = [(value, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list, tuple)):
            if d > limit:
                raise ToolError(f"{what} is nested more than {limit} levels deep; flatten it")
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
        elif isinstance(x, float) and not math.isfinite(x):
            raise ToolError(f"{what} contains {x!r}, which is not valid JSON; use None or a string instead")
    try:
        data = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ToolError(f"{what} must be JSON-serialisable (dict, list, str, number, bool, None): {e}") from None
    if sized and len(data) > _LIMITS["max_bytes"]:
        raise ToolError(f"{what} is {len(data)} bytes as JSON; the limit is {_LIMITS['max_bytes']} bytes")
    return data


class _CappedWriter(io.TextIOBase):
    def __init__(self, cap):
        self.cap = cap
        self.parts = []
        self.size = 0
        self.dropped = 0

    def writable(self):
        return True

    def write(self, s):
        s = str(s)
        room = self.cap - self.size
        if room > 0:
            self.parts.append(s[:room])
            self.size += min(len(s), room)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def getvalue(self):
        return "".join(self.parts)


class _Server:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.inbox = asyncio.Queue()
        self.waiting = {}  # call_id -> (kind, obj) where kind is "event" or "future"
        self.next_id = 0
        self.lock = threading.Lock()
        self.cap = 100_000
        self.ns = {"__name__": "__main__", "asyncio": asyncio, "json": json, "ToolError": ToolError}

    # ---- reader thread -------------------------------------------------------------------------
    def reader(self):
        buf = b""
        f = os.fdopen(_PROTO_IN, "rb", buffering=0)
        while True:
            chunk = f.read(65536)
            if not chunk:
                os._exit(0)  # orchestrator went away
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if msg["type"] == "reply":
                    with self.lock:
                        kind, obj = self.waiting.pop(msg["call_id"])
                    if kind == "event":
                        obj[1] = msg
                        obj[0].set()
                    else:
                        self.loop.call_soon_threadsafe(self._resolve, obj, msg)
                else:
                    self.loop.call_soon_threadsafe(self.inbox.put_nowait, msg)

    @staticmethod
    def _resolve(fut, msg):
        if fut.done():
            return
        if msg.get("ok"):
            fut.set_result(msg.get("value"))
        else:
            fut.set_exception(ToolError(msg.get("error", "error")))

    def _new_call(self, kind, obj):
        with self.lock:
            self.next_id += 1
            cid = self.next_id
            self.waiting[cid] = (kind, obj)
        return cid

    # ---- stubs ---------------------------------------------------------------------------------
    def sync_call(self, name, args, kwargs):
        slot = [threading.Event(), None]
        _check_json([list(args), kwargs], f"an argument of {name}()", sized=False)
        cid = self._new_call("event", slot)
        _send({"type": "call", "call_id": cid, "name": name, "args": list(args), "kwargs": kwargs})
        slot[0].wait()
        msg = slot[1]
        if not msg.get("ok"):
            raise ToolError(msg.get("error", "error"))
        return msg.get("value")

    def make_tool(self, name, finishes):
        server = self

        def tool(*args, **kwargs):
            value = server.sync_call(name, args, kwargs)
            if finishes:
                raise _Finished()
            return value

        tool.__name__ = name
        return tool

    def make_launch(self):
        server = self

        async def launch_subagent(*args, **kwargs):
            _check_json([list(args), kwargs], "an argument of launch_subagent()", sized=False)
            fut = server.loop.create_future()
            cid = server._new_call("future", fut)
            _send({"type": "call", "call_id": cid, "name": "launch_subagent", "args": list(args),
                   "kwargs": kwargs})
            return await fut

        return launch_subagent

    @staticmethod
    def finish(result=None):
        """End this agent with ``result`` (JSON data within the result limits; else ToolError)."""
        _check_json(result, "the finish() value")
        _send({"type": "finish", "value": result, "via": "finish"})
        raise _Finished()

    # ---- init ----------------------------------------------------------------------------------
    def init(self, msg):
        rl = msg.get("rlimits", {})
        for key, name in (("as", "RLIMIT_AS"), ("nproc", "RLIMIT_NPROC"), ("fsize", "RLIMIT_FSIZE"),
                          ("cpu", "RLIMIT_CPU")):
            if rl.get(key):
                v = int(rl[key])
                resource.setrlimit(getattr(resource, name), (v, v))
        uid = msg.get("uid")
        if uid is not None and os.getuid() == 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        self.cap = int(msg.get("output_cap", 100_000))
        self.echo = bool(msg.get("echo", False))
        for t in msg.get("tools", []):
            self.ns[t["name"]] = self.make_tool(t["name"], t.get("finishes", False))
        if msg.get("delegation"):
            self.ns["launch_subagent"] = self.make_launch()
        self.ns["finish"] = self.finish
        self.ns.update(msg.get("variables") or {})

    # ---- exec ----------------------------------------------------------------------------------
    def _compile(self, code):
        tree = ast.parse(code, "<cell>", "exec")
        # Notebook-style display of a bare last expression, only when the orchestrator asked for it
        # (RuntimeConfig.echo_last_expression): by default a child's result stays in its variable and
        # reaches the parent's context only through an explicit print (docs/concepts.md).
        if getattr(self, "echo", False) and tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body[-1]
            call = ast.Expr(ast.Call(ast.Name("__rao_show__", ast.Load()), [last.value], []))
            tree.body[-1] = ast.copy_location(call, last)
            ast.fix_missing_locations(tree)
        return compile(tree, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

    async def run_cell(self, code, cpu_s):
        out = _CappedWriter(self.cap)
        status, error = "ok", ""
        if cpu_s:
            used = resource.getrusage(resource.RUSAGE_SELF)
            soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
            new = int(used.ru_utime + used.ru_stime) + int(cpu_s)
            if hard != resource.RLIM_INFINITY:
                new = min(new, hard)
            resource.setrlimit(resource.RLIMIT_CPU, (new, hard))
        self.ns["__rao_show__"] = lambda v: None if v is None else print(repr(v))
        sys.stdout = sys.stderr = out
        try:
            result = eval(self._compile(code), self.ns)
            if inspect.iscoroutine(result):
                await result
        except _Finished:
            pass
        except MemoryError:
            status, error = "memory", "MemoryError: the cell exceeded its memory limit"
        except BaseException as e:  # noqa: BLE001 - everything a cell raises is reported to the agent
            status = "error"
            # only the cell's own frames: no host path (this file, the stdlib) reaches the model; a cell that
            # does not compile (SyntaxError) has none and reads as Python shows it: File "<cell>", line N
            tb = [fr for fr in traceback.extract_tb(e.__traceback__) if fr.filename == "<cell>"]
            error = "".join(traceback.format_exception_only(e))
            if tb:
                error = "Traceback (most recent call last):\n" + "".join(traceback.format_list(tb)) + error
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        text = out.getvalue()
        dropped = out.dropped
        try:  # fd-level output (os.write(1, ...), subprocesses)
            extra = os.pread(_LOG["fd"], self.cap + 1, 0).decode(errors="replace")
            os.ftruncate(_LOG["fd"], 0)
            if extra:
                room = max(0, self.cap - len(text))
                dropped += max(0, len(extra) - room)
                text += extra[:room]
        except OSError:
            pass
        _send({"type": "done", "status": status, "output": text, "truncated_chars": dropped,
               "error": error})

    async def main(self):
        while True:
            msg = await self.inbox.get()
            if msg["type"] == "limits":
                _LIMITS["max_bytes"] = int(msg["result_max_bytes"])
                _LIMITS["max_depth"] = int(msg["result_max_depth"])
            elif msg["type"] == "init":
                self.init(msg)
                _send({"type": "ready"})
            elif msg["type"] == "exec":
                await self.run_cell(msg["code"], msg.get("cpu_s"))


def _session_niceness() -> None:
    """Give this REPL's session the niceness the orchestrator started it with (``nice -n``, outside).

    With the kernel's autogroup scheduling every session (bwrap ``--new-session``) is its own CPU group,
    whose share of a core ignores the niceness of the processes in it: a looping cell then takes as much
    of a contended core as the whole vLLM engine (measured: raw decode 633 -> 184 tok/s with or without
    ``nice``). Raising a group's niceness is allowed to anyone; lowering it needs CAP_SYS_NICE, which the
    dropped uid lacks. No autogroup (disabled, other kernels): per-process niceness applies as it is."""
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(os.nice(0)))
    except OSError:
        pass


def main():
    """Serve the protocol on this process's stdin/stdout until the orchestrator closes it.

    Orchestrator -> REPL::

        {"type": "init", "uid": int|null, "rlimits": {...}, "tools": [{"name", "finishes"}],
         "delegation": bool, "variables": {...}, "output_cap": int, "echo": bool}
        {"type": "exec", "code": str, "cpu_s": int}
        {"type": "limits", "result_max_bytes": int, "result_max_depth": int}  (before init; see _check_json)
        {"type": "reply", "call_id": int, "ok": bool, "value": any, "error": str}

    REPL -> orchestrator::

        {"type": "started"} once imports are done; {"type": "ready"} after init (limits set, uid dropped)
        {"type": "call", "call_id": int, "name": str, "args": [...], "kwargs": {...}}  (tool or launch_subagent)
        {"type": "finish", "value": any, "via": str}  (finish() or a finishing tool's value)
        {"type": "done", "status": "ok"|"error"|"memory", "output": str, "truncated_chars": int, "error": str}
    """
    _session_niceness()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead of killing
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    log = os.open(".rao_fd_output", os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    _LOG["fd"] = log
    os.close(devnull)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
    threading.stack_size(1 << 20)
    server = _Server()
    threading.Thread(target=server.reader, daemon=True).start()
    _send({"type": "started"})
    server.loop.run_until_complete(server.main())


if __name__ == "__main__":
    main()
