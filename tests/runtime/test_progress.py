"""Progress of long loops: rich's bar only on a terminal, and the callback that the Prefect tasks
turn into a progress artifact (rao_core.progress, run_trees)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rao_core.progress import StepProgress, bar_enabled


def _run(console: Console, **kw) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    with StepProgress("training steps", 3, on_progress=lambda d, t: calls.append((d, t)), console=console,
                      **kw) as p:
        for _ in range(3):
            p.advance()
    return calls


def test_the_bar_is_drawn_on_a_terminal_and_the_callback_gets_each_count(monkeypatch):
    monkeypatch.delenv("RAO_PROGRESS", raising=False)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    assert bar_enabled(console)
    assert _run(console) == [(1, 3), (2, 3), (3, 3)]
    assert "training steps" in out.getvalue() and "3/3" in out.getvalue()


@pytest.mark.parametrize("how", ["not a terminal", "RAO_PROGRESS=0", "show=False"])
def test_no_bar_off_a_terminal_or_when_disabled_but_the_callback_still_runs(monkeypatch, how):
    out = io.StringIO()
    console = Console(file=out, force_terminal=how != "not a terminal", width=100)
    monkeypatch.setenv("RAO_PROGRESS", "0" if how == "RAO_PROGRESS=0" else "1")
    kw = {"show": False} if how == "show=False" else {}
    assert _run(console, **kw) == [(1, 3), (2, 3), (3, 3)]
    assert out.getvalue() == ""


@pytest.mark.parametrize("terminal", [True, False])
async def test_run_trees_reports_each_finished_tree_and_draws_rollouts_only_on_a_terminal(tok, capsys, monkeypatch,
                                                                                           terminal):
    """rich decides from stdout (here captured; TTY_COMPATIBLE is rich's own switch for what a terminal is)."""
    from rao_core.policies.scripted import ReplayPolicy, cell
    from rao_core.runtime import run_trees
    from tests.runtime.fakes import FakeEnv, runtime_config, task

    monkeypatch.delenv("RAO_PROGRESS", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TTY_COMPATIBLE", "1" if terminal else "0")
    seen: list[tuple[int, int, str]] = []
    pol = ReplayPolicy(default=[cell("finish(1)")])
    trees = await run_trees(FakeEnv(), [(task(task_id="a"), 2), (task(task_id="b"), 1)], pol, runtime_config(),
                            tokenizer=tok, progress=lambda d, t, tree: seen.append((d, t, tree.group_id)))
    assert [(d, t) for d, t, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert sorted(g for _, _, g in seen) == sorted(t.group_id for t in trees) == ["a", "a", "b"]
    out = capsys.readouterr().out
    assert ("rollouts" in out and "3/3" in out) == terminal, out


@pytest.mark.parametrize("total, reported", [
    (32, [3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 32]),  # every 32 // 10 = 3 units, and the last
    (4, [1, 2, 3, 4]),  # fewer than 20: every unit
    (0, []),  # nothing planned (yet): nothing to say
])
def test_every_tenth_passes_on_each_tenth_and_the_last(total, reported):
    from rao_core.progress import every_tenth

    got: list[tuple[int, int]] = []
    report = every_tenth(lambda d, t: got.append((d, t)))
    for done in range(0, max(total, 3) + 1):
        report(done, total)
    assert got == [(d, total) for d in reported]



def test_quiet_heartbeat_speaks_only_after_a_quiet_spell():
    """On a clock the test moves: a line once every_s passes with no news, not again before another every_s,
    none while news comes (no wall-clock assertion: the event loop only gives the heartbeat its turns)."""
    import asyncio

    from rao_core.progress import quiet_heartbeat

    async def main():
        said: list[float] = []
        t = {"now": 0.0, "news": 0.0}
        beat = asyncio.create_task(quiet_heartbeat(said.append, lambda: t["news"], every_s=5, poll_s=0.001,
                                                   clock=lambda: t["now"]))

        async def at(now: float, news: float | None = None) -> list[float]:
            t["now"] = now
            if news is not None:
                t["news"] = news
            await asyncio.sleep(0.05)  # the heartbeat polls (its 1 ms timer comes first)
            return list(said)

        assert await at(4.9) == []                 # quiet 4.9 s < 5
        assert await at(10.0) == [10.0]            # quiet 10 s: one line, however often it polls
        assert await at(14.0) == [10.0]            # quiet, but only 4 s since its own line
        assert await at(15.5) == [10.0, 15.5]
        assert await at(18.0, news=17.0) == [10.0, 15.5]  # news 1 s ago
        beat.cancel()

    asyncio.run(main())
