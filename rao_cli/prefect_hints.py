"""``rao deploy``'s output without Prefect's own hints that would talk to the wrong API.

``prefect work-pool create`` and ``prefect deploy`` end with commands to paste (``prefect worker start --pool
'rao-pool'``, ``prefect deployment run 'rao-campaign/campaign'``) that lack ``PREFECT_API_URL``: pasted in
another terminal they start a worker on (or ask) a different API than the one deployed to. Their output is
passed through :class:`HintFilter`: the worker hints are dropped (``rao deploy`` prints one correct worker
command itself, last) and every other ``$ prefect ...`` command (``prefect deployment run ...``, to schedule a
run) gets ``PREFECT_API_URL=<api>``, the auth string of the installation's own server
(``infra.orchestration.auth_prefix``: read from its file when pasted) and the ``prefect`` of this environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

_WORKER = re.compile(r"^\s*(\$\s*)?prefect\s+worker\s+start\b")
_WORKER_LEAD_IN = re.compile(r"\bstart a worker\b")  # "To start a worker for this work pool, run:", ...
_COMMAND = re.compile(r"^(\s*\$\s*)prefect\s+(.*)$")


class HintFilter:
    """Line by line: ``feed(line)`` returns the lines to print now (none, the line, possibly rewritten, or
    lines held back before); ``close()`` the lines still held at the end.

    Dropped: Prefect's worker commands and the sentences that introduce them (wrapped over several lines
    when the output is narrow: from the sentence to the command, at most :data:`LOOKAHEAD` lines, are held
    back and dropped together); kept once: a blank line where dropping left two in a row. Rewritten:
    ``$ prefect ARGS`` -> ``$ PREFECT_API_URL=<api_url> <auth><prefect_bin> ARGS`` (``auth``: e.g.
    ``PREFECT_API_AUTH_STRING="$(cat FILE)" ``, or empty).
    """

    #: lines held after a sentence that introduces a worker command, before they are printed after all
    LOOKAHEAD = 4

    def __init__(self, api_url: str, prefect_bin: str, auth: str = ""):
        self.api_url, self.prefect_bin, self.auth = api_url, prefect_bin, auth
        self._blank = False
        self._held: list[str] | None = None  # after a lead-in sentence: the lines until its command

    def feed(self, line: str) -> list[str]:
        text = line.rstrip("\n")
        if _WORKER.match(text):
            self._held = None  # the command and what introduced it
            return []
        if _WORKER_LEAD_IN.search(text):
            out = self.close()
            self._held = []
            return out
        if self._held is not None:
            self._held.append(text)
            return self.close() if sum(1 for h in self._held if h.strip()) > self.LOOKAHEAD else []
        return self._emit(text)

    def close(self) -> list[str]:
        held, self._held = self._held or [], None
        return [o for h in held for o in self._emit(h)]

    def _emit(self, text: str) -> list[str]:
        if not text.strip():
            if self._blank:
                return []
            self._blank = True
            return [text]
        self._blank = False
        m = _COMMAND.match(text)
        if m:
            text = f"{m.group(1)}PREFECT_API_URL={self.api_url} {self.auth}{self.prefect_bin} {m.group(2)}"
        return [text]


@contextlib.contextmanager
def prefect_hints_rewritten(api_url: str) -> Iterator[None]:
    """Within the block, what child processes (and this one) write to stdout (file descriptor 1) goes
    through :class:`HintFilter` before it reaches the real stdout, line by line as it comes. On a terminal,
    ``COLUMNS`` (unless set) tells the children, who write to a pipe, the terminal's width for their tables."""
    from infra.orchestration import auth_prefix, prefect_bin

    sys.stdout.flush()
    real = os.dup(1)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.close(write_end)
    hints = HintFilter(api_url, prefect_bin(), auth_prefix(api_url))

    def pump() -> None:
        with os.fdopen(read_end, "r", encoding="utf-8", errors="replace") as src:
            for line in src:
                for out in hints.feed(line):
                    os.write(real, (out + "\n").encode())
        for out in hints.close():
            os.write(real, (out + "\n").encode())

    thread = threading.Thread(target=pump, name="rao-prefect-hints", daemon=True)
    thread.start()
    saved_columns = os.environ.get("COLUMNS")
    if os.isatty(real) and not saved_columns:
        os.environ["COLUMNS"] = str(os.get_terminal_size(real).columns)
    try:
        yield
    finally:
        if saved_columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved_columns
        sys.stdout.flush()
        os.dup2(real, 1)  # the pipe's last write end closes: the pump reads to its end
        thread.join(timeout=30)
        os.close(real)
