"""Progress of long library loops (rollouts, optimizer steps): a rich bar in the terminal and a callback; and
:class:`Timeline`, a run's wall time as consecutive stages (the end-of-run table of ``rao run``).

The library reports progress through an optional callback ``on_progress(done, total)`` (counts of finished
units: trees, optimizer steps), so that callers outside ``rao_core`` (the Prefect tasks' progress artifacts)
see it without ``rao_core`` importing them. The terminal bar is rich's own: it is drawn only when the console
is a terminal (``rich.console.Console.is_terminal``: off in tests, CI logs, a worker's log file) and not
disabled with ``RAO_PROGRESS=0``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

ProgressCallback = Callable[[int, int], None]
"""``on_progress(done, total)``: ``done`` of ``total`` units finished (called after each unit)."""

__all__ = ["ProgressCallback", "StepProgress", "Timeline", "bar_enabled", "every_tenth", "fan_out", "quiet_heartbeat"]


def bar_enabled(console: Console | None = None) -> bool:
    """Whether a terminal bar would be drawn: ``console`` (default: a new stdout console) is a terminal and
    the environment variable ``RAO_PROGRESS`` is not ``0``."""
    if os.environ.get("RAO_PROGRESS", "1").strip() == "0":
        return False
    return (console or Console()).is_terminal


def every_tenth(report: ProgressCallback) -> ProgressCallback:
    """An ``on_progress(done, total)`` that passes a call on to ``report`` only at each tenth of ``total``
    (every multiple of ``total // 10``; every unit when ``total < 20``) and at the last unit: periodic log lines
    of a long loop where no bar is drawn (a log file, a pipe). Nothing is reported while ``done`` or ``total`` is 0."""

    def report_tenths(done: int, total: int) -> None:
        if done > 0 and total > 0 and (done >= total or done % max(1, total // 10) == 0):
            report(done, total)

    return report_tenths


def fan_out(*callbacks: ProgressCallback) -> ProgressCallback:
    """One ``on_progress(done, total)`` that calls each of ``callbacks`` in order with the same counts: a loop's
    progress fed to a log line (:func:`every_tenth`) and a UI artifact at once."""

    def call(done: int, total: int) -> None:
        for cb in callbacks:
            cb(done, total)

    return call


async def quiet_heartbeat(say: Callable[[float], None], last_news: Callable[[], float], every_s: float = 20.0,
                          poll_s: float = 1.0, clock: Callable[[], float] | None = None) -> None:
    """Run until cancelled: whenever ``every_s`` seconds (time.monotonic) have passed since ``last_news()`` and
    since its own last line, call ``say(seconds since last_news())``: a "still working" line for a loop whose
    units can take longer than ``every_s`` (the first trees of a generation stage), so a log never goes silent
    for long. Start it with ``asyncio.create_task`` beside the loop and cancel it when the loop ends. ``clock``
    (default ``time.monotonic``) is the time base of ``last_news``; the check runs every ``poll_s`` seconds."""
    import asyncio
    import time

    clock = clock or time.monotonic
    said = float("-inf")
    while True:
        await asyncio.sleep(poll_s)
        now = clock()
        quiet = now - last_news()
        if quiet >= every_s and now - said >= every_s:
            say(quiet)
            said = now


class StepProgress:
    """Count the finished units of one long loop: a rich progress bar (``description  12/40  0:01:02 ...``)
    while the loop runs, and ``on_progress(done, total)`` after each unit.

    Use as a context manager (the bar is stopped on exit, also on errors)::

        with StepProgress("training steps", total=n, on_progress=cb) as p:
            for ...:
                ...
                p.advance()

    Args:
        description: the bar's label, e.g. ``"rollouts"``.
        total: units expected (trees, optimizer steps); may be raised later with :meth:`set_total`.
        on_progress: called with ``(done, total)`` after each :meth:`advance`; its exceptions propagate
            (callers that must not fail wrap their own).
        show: False: never draw the bar; None or True: draw it when :func:`bar_enabled` (a terminal,
            ``RAO_PROGRESS`` not 0).
        console: the rich console to draw on (default: stdout).
    """

    def __init__(self, description: str, total: int, *, on_progress: ProgressCallback | None = None,
                 show: bool | None = None, console: Console | None = None) -> None:
        self.console = console or Console()
        self.done, self.total = 0, int(total)
        self.on_progress = on_progress
        visible = show is not False and bar_enabled(self.console)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, disable=not visible)
        self._task = self.bar.add_task(description, total=self.total)

    @property
    def visible(self) -> bool:
        """Whether the bar is drawn (False when rich's ``disable`` is set)."""
        return not self.bar.disable

    def start(self) -> StepProgress:
        """Start drawing (nothing when the bar is not visible); returns self."""
        self.bar.start()
        return self

    def stop(self) -> None:
        """Stop drawing, leaving the final bar on screen."""
        self.bar.stop()

    def __enter__(self) -> StepProgress:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def set_total(self, total: int) -> None:
        """Change the expected number of units (e.g. once a child process reports it)."""
        self.total = int(total)
        self.bar.update(self._task, total=self.total)

    def advance(self, n: int = 1, *, done: int | None = None) -> None:
        """Record ``n`` more finished units (or set the count to ``done``), redraw, call ``on_progress``."""
        self.done = self.done + n if done is None else int(done)
        self.bar.update(self._task, completed=self.done)
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)


class Timeline:
    """The wall time of a run as consecutive stages: each :meth:`lap` closes the stage that ran since the
    previous one, so the rows always sum to the time from the start to the last lap (nothing falls between
    two rows: what no stage names is still counted in the row whose lap follows it).

    Args:
        start: the start, seconds since the epoch (default: now); ``rows``: rows already taken (a timeline
            continued in another function or process, :meth:`from_dict`).
        clock: seconds since the epoch (``time.time``: the marks are compared across functions and with a
            process's start time; tests pass a fake one).

    A row is ``{"stage": name, "s": seconds, "detail": text}``; :meth:`to_dict` / :meth:`from_dict` carry a
    timeline in a JSON summary.
    """

    def __init__(self, start: float | None = None, rows: list[dict[str, Any]] | None = None, *,
                 clock: Callable[[], float] | None = None) -> None:
        import time

        self.clock = clock or time.time
        self.start = self.clock() if start is None else float(start)
        self.rows: list[dict[str, Any]] = list(rows or [])
        self.mark = self.start + sum(r["s"] for r in self.rows)

    def lap(self, stage: str, detail: str = "", *, at: float | None = None) -> float:
        """Close stage ``stage`` at ``at`` (default: now): a row of the seconds since the previous lap (or the
        start); returns them."""
        now = self.clock() if at is None else float(at)
        seconds = now - self.mark
        self.rows.append({"stage": stage, "s": seconds, "detail": detail})
        self.mark = now
        return seconds

    @property
    def total(self) -> float:
        """Seconds from the start to the last lap (the sum of the rows)."""
        return self.mark - self.start

    def to_dict(self) -> dict[str, Any]:
        """``{"start": epoch seconds, "rows": [...]}``."""
        return {"start": self.start, "rows": [dict(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, clock: Callable[[], float] | None = None) -> Timeline:
        """The timeline :meth:`to_dict` wrote, to be continued."""
        return cls(data["start"], data.get("rows") or [], clock=clock)
