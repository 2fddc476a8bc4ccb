"""Tree limits on a busy machine (``runtime.tree_clock``; rao_core/runtime/agent.py, "Tree limits").

A tree's limit (an evaluation's, an RL rollout's) counts the tree's own time, not its wait on a policy server
slowed by load: trees behind a slow server are scored, where the wall-clock rule (the old one, ``tree_clock: wall``) cut every one of
them. The server's slowness is simulated without load on this machine: each request waits ``per_request_s``
times the requests in flight when it arrives (asyncio.sleep, as a CPU server shares its cores among requests).
"""

from __future__ import annotations

import asyncio

import pytest

from rao_core.evaluation import evaluate_policy, mode_runtime
from rao_core.judge.stage import INFRA_END_REASONS
from rao_core.policies.base import Generation, PolicyRequest
from rao_core.policies.scripted import ReplayPolicy, cell
from rao_core.runtime import agent
from rao_core.runtime.agent import _TreeClock, tree_clock
from rao_core.tree import EndReason
from tests.runtime.fakes import FakeEnv, runtime_config, task

LIMIT_S = 6.0  # tree_timeout_s of the busy evaluations
TREES = 4  # trees at once: every request waits about 4 x PER_REQUEST_S
PER_REQUEST_S = 0.75  # 4 requests per tree (root, child, child, root) at ~2-3 s each: ~11-13 s of wall-clock per tree


class BusyServer(ReplayPolicy):
    """A scripted policy behind a server slowed by load: a request waits ``per_request_s`` x (requests in flight
    when it arrives, itself included) before its scripted answer. ``waits`` lists every wait (seconds)."""

    def __init__(self, per_request_s: float, **kw):
        super().__init__(**kw)
        self.per_request_s = per_request_s
        self.live = 0
        self.waits: list[float] = []

    async def generate(self, request: PolicyRequest) -> Generation:
        self.live += 1
        try:
            wait = self.per_request_s * self.live
            self.waits.append(wait)
            await asyncio.sleep(wait)
            return await super().generate(request)
        finally:
            self.live -= 1


def busy_server() -> BusyServer:
    """Each tree: the root waits on one child (two turns), then finishes with 'done' (the task's answer)."""
    return BusyServer(PER_REQUEST_S, by_goal={
        "child": [cell("print('working')"), cell("finish('ok')")],
        "busy": [cell("r = await launch_subagent('child')\nprint(r)"), cell("finish('done')")]})


def busy_tasks() -> list:
    return [task(f"busy {i}", expect="done", task_id=f"busy-{i}") for i in range(TREES)]


async def test_trees_behind_a_busy_server_are_scored_not_timed_out(tok):
    """The evaluation's default (``tree_clock: auto``, resolved to ``own``): every tree finishes and is scored,
    although each spent more than its limit of wall-clock waiting on the server, with little of its own."""
    pol = busy_server()
    rep = await evaluate_policy(FakeEnv(), busy_tasks(), pol, runtime_config(tree_timeout_s=LIMIT_S),
                                tokenizer=tok, mode="recursive", keep_trees=0)
    row = rep.rows[0]
    assert row.end_reasons == {"finished": TREES}, [t.root.error for t in rep.trees]
    assert (row.n, row.unscored, row.successes) == (TREES, 0, float(TREES))
    assert all(t.root.result == "done" and len(t.nodes) == 2 for t in rep.trees)
    assert not [t for t in rep.trees if t.root.end_reason in INFRA_END_REASONS]
    assert min(pol.waits) >= PER_REQUEST_S and max(pol.waits) >= 3 * PER_REQUEST_S  # the server was shared
    for t in rep.trees:  # each tree would have hit the wall-clock limit, its own time did not
        assert t.wall_s > LIMIT_S, (t.wall_s, t.meta)
        assert t.meta["own_s"] < LIMIT_S <= t.wall_s
        waited = sum(turn.queue_s + turn.generation_s for n in t.nodes for turn in n.turns)
        assert waited > LIMIT_S  # the root's two requests and its child's two, one after another


async def test_rl_rollouts_behind_a_busy_server_finish_too(tok):
    """The RL rollouts (``run_trees``, the generate stage) under the default clock, behind the same busy server:
    every tree finishes (none ``tree_timeout``, which drops it from its group and counts against the stage's
    infrastructure-failure share), although each spent more than its limit of wall-clock waiting."""
    pol = busy_server()
    trees = await agent.run_trees(FakeEnv(), [(t, 1) for t in busy_tasks()], pol,
                                  runtime_config(tree_timeout_s=LIMIT_S), tokenizer=tok)
    assert [t.root.end_reason for t in trees] == [EndReason.FINISHED] * TREES, [t.root.error for t in trees]
    assert all(t.root.result == "done" and t.meta["own_s"] < LIMIT_S < t.wall_s for t in trees)


async def test_the_wall_clock_rule_cuts_the_same_trees_as_infrastructure_failures(tok):
    """The old rule, asked for explicitly (``tree_clock: wall``), on the same busy server: every tree ends
    ``tree_timeout`` at its limit, an infrastructure failure (unscored)."""
    pol = busy_server()
    rep = await evaluate_policy(FakeEnv(), busy_tasks(), pol, runtime_config(tree_timeout_s=LIMIT_S, tree_clock="wall"),
                                tokenizer=tok, mode="recursive", keep_trees=0)
    row = rep.rows[0]
    assert row.end_reasons == {"tree_timeout": TREES}
    assert all(t.root.end_reason in INFRA_END_REASONS for t in rep.trees)
    assert all(n.end_reason == EndReason.TREE_TIMEOUT for t in rep.trees for n in t.nodes)
    assert all(t.root.error == "the tree's wall-clock limit elapsed" for t in rep.trees)
    assert all(LIMIT_S <= t.wall_s < LIMIT_S + 3 for t in rep.trees), [t.wall_s for t in rep.trees]


async def test_a_tree_working_past_its_limit_is_still_cut(tok):
    """The own clock is still a limit: a root whose cells work (sleep) for longer than the limit, behind an idle
    server, ends ``tree_timeout`` (unscored) once its own time reaches the limit."""
    pol = ReplayPolicy(default=[cell("import time\ntime.sleep(1.0)\nprint('step')")])
    rep = await evaluate_policy(FakeEnv(), [task("work", expect="done")], pol,
                                runtime_config(tree_timeout_s=2.5, cell_timeout_s=10, max_steps_per_node=20),
                                tokenizer=tok, mode="recursive", keep_trees=0)
    (tree,) = rep.trees
    assert tree.root.end_reason == EndReason.TREE_TIMEOUT and rep.rows[0].end_reasons == {"tree_timeout": 1}
    assert tree.root.error == "the tree's own time reached its limit of 2.5 s (runtime.tree_clock: own)"
    assert 2.5 <= tree.meta["own_s"] <= tree.wall_s < 2.5 + 3
    assert len(tree.root.turns) <= 3  # cut within its third second of work, long before its 20 steps


def test_evaluations_and_rollouts_count_own_time():
    rc = runtime_config()
    assert rc.tree_clock == "auto" and tree_clock(rc) == "own"  # run_trees (the RL rollouts) too
    assert tree_clock(runtime_config(tree_clock="wall")) == "wall"  # the old rule, asked for
    assert mode_runtime(rc, "recursive").tree_clock == "own" == mode_runtime(rc, "single").tree_clock
    for explicit in ("wall", "own"):
        assert mode_runtime(runtime_config(tree_clock=explicit), "single").tree_clock == explicit
    with pytest.raises(ValueError, match="tree_clock"):
        runtime_config(tree_clock="cpu")


def test_tree_clock_counts_seconds_when_some_node_works(monkeypatch):
    """Own time by hand: root works 0-1; waits on the policy 1-3; waits on child 3-9 while the child works 3-4,
    waits on the policy 4-7 and works 7-8 and ends at 8; a tool call still open at the child's end closes at 8.5;
    the root works again 9-10. Own time: 1 + 1 + 1 + 1 = 4 of 10 s."""
    now = [0.0]
    monkeypatch.setattr(agent.time, "perf_counter", lambda: now[0])
    c = _TreeClock()
    c.start("0")
    now[0] = 1.0
    with c.waiting("0"):  # the root's generation
        now[0] = 3.0
    assert c.own_s() == 1.0
    with c.waiting("0"):  # launch_subagent
        c.start("0.0")
        now[0] = 4.0
        with c.waiting("0.0"):
            now[0] = 7.0
            assert c.own_s() == 2.0
        now[0] = 8.0
        tool = c.waiting("0.0")
        tool.__enter__()
        c.end("0.0")  # ended inside a waiting block: the block's close counts nothing
        now[0] = 8.5
        tool.__exit__(None, None, None)
        assert c.own_s() == 3.0
        now[0] = 9.0
    now[0] = 10.0
    assert c.own_s() == 4.0
    c.end("0")
    now[0] = 12.0
    assert c.own_s() == 4.0
