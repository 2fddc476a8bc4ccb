"""Node finalisation: ``env.on_node_end`` and ``env.verify`` run once for every node, whatever ends it.

Regression tests for two runtime defects: ``on_node_end`` was never called (TextCraft's verifier then
read the shared inventory after the parent had consumed the child's products), and a cancellation that
reached a node while its REPL was being closed skipped its timings and verifier (seen in TextCraft runs
as nodes without a verifier value and ``timings.wall_s == 0``).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from rao_core.envs import get_env
from rao_core.envs.base import Episode, Task
from rao_core.policies.scripted import ReplayPolicy, cell
from rao_core.policies.textcraft_expert import TextCraftExpert
from rao_core.runtime import RuntimeConfig, run_tree
from rao_core.runtime.sandbox import Repl
from rao_core.tree import EndReason, ExecutionTree, Node
from tests.runtime.fakes import SANDBOX, FakeEnv, runtime_config, task

CLOSE_DELAY_S = 0.4


class HookEnv(FakeEnv):
    """FakeEnv that records on_node_end calls and offers ``closing()``: REPLs now being closed."""

    def __init__(self) -> None:
        self.end_calls: list[tuple[str, EndReason]] = []
        self.closing = 0

    def tools(self):
        from rao_core.envs.base import ToolSpec

        return super().tools() + [ToolSpec(name="closing", signature="closing() -> int",
                                           doc="How many REPLs are being closed right now.")]

    def call_tool(self, episode: Episode, node: Node, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if name == "closing":
            return self.closing
        return super().call_tool(episode, node, name, args, kwargs)

    def on_node_end(self, episode: Episode, node: Node) -> None:
        assert node.end_reason != EndReason.RUNNING  # the end reason is set before the hook
        assert "verified" not in node.env_info  # ... and the hook runs before the verifier
        self.end_calls.append((node.node_id, node.end_reason))

    def verify(self, episode: Episode, node: Node) -> float | None:
        node.env_info["verified"] = True  # the verifier ran
        return 1.0 if node.end_reason == EndReason.FINISHED else 0.0


def slow_close(monkeypatch, env: HookEnv) -> None:
    """Make every REPL close take CLOSE_DELAY_S, visible to cells through ``env.closing``."""
    original = Repl.close

    async def close(self: Repl) -> None:
        env.closing += 1
        try:
            await asyncio.sleep(CLOSE_DELAY_S)
        finally:
            env.closing -= 1
            await original(self)

    monkeypatch.setattr(Repl, "close", close)


cfg = functools.partial(runtime_config, repl_pool_size=0)  # REPLs started on demand


def assert_all_finalised(tree: ExecutionTree, env: HookEnv) -> None:
    for n in tree.nodes:
        assert n.end_reason != EndReason.RUNNING, n.node_id
        assert "verified" in n.env_info, (n.node_id, n.end_reason, n.error)
        assert n.timings.wall_s > 0, n.node_id
    assert sorted(i for i, _ in env.end_calls) == sorted(n.node_id for n in tree.nodes)  # exactly once each


# the parent's cell ends (without awaiting the child) as soon as some REPL is being closed
_WAIT_FOR_A_CLOSE = ("t = asyncio.ensure_future(launch_subagent({goal!r}))\n"
                     "while not closing():\n    await asyncio.sleep(0.01)\nprint('cell ends')")


async def test_child_cancelled_while_its_repl_closes_is_still_verified(tok, monkeypatch):
    env = HookEnv()
    slow_close(monkeypatch, env)
    pol = ReplayPolicy(by_depth={0: [cell(_WAIT_FOR_A_CLOSE.format(goal="child")), cell("finish('root')")],
                                 1: [cell("finish('child done')")]})
    tree = await run_tree(env, task(), pol, cfg(), tokenizer=tok)
    child = tree.nodes[1]
    assert tree.root.end_reason == EndReason.FINISHED
    # the child had finished and was closing its REPL when its parent's cell ended and cancelled it
    assert child.end_reason == EndReason.FINISHED and child.result == "child done"
    assert child.verifier == 1.0
    assert tree.root.turns[0].observation == "cell ends\n"
    assert_all_finalised(tree, env)


async def test_nested_double_cancellation_finalises_every_node(tok, monkeypatch):
    """leaf finishes and closes; mid's cell ends (cancel 1 to leaf), then the root's cell ends, which
    cancels mid while mid's cell waits for leaf (cancel 2 to leaf, through mid's gather)."""
    env = HookEnv()
    slow_close(monkeypatch, env)
    pol = ReplayPolicy(by_depth={0: [cell(_WAIT_FOR_A_CLOSE.format(goal="mid")), cell("finish('root')")],
                                 1: [cell(_WAIT_FOR_A_CLOSE.format(goal="leaf")), cell("finish('mid')")],
                                 2: [cell("finish('leaf')")]})
    tree = await run_tree(env, task(), pol, cfg(), tokenizer=tok)
    by_id = {n.node_id: n for n in tree.nodes}
    assert set(by_id) == {"0", "0.0", "0.0.0"}
    assert by_id["0"].end_reason == EndReason.FINISHED
    assert by_id["0.0.0"].end_reason == EndReason.FINISHED and by_id["0.0.0"].verifier == 1.0
    assert by_id["0.0"].end_reason == EndReason.CANCELLED
    assert by_id["0.0"].verifier == 0.0
    assert_all_finalised(tree, env)


async def test_tree_timeout_while_children_pending_finalises_every_node(tok):
    env = HookEnv()
    pol = ReplayPolicy(by_depth={0: [cell("await asyncio.gather(launch_subagent('a'), launch_subagent('b'))")],
                                 1: [cell("await asyncio.sleep(30)")]})
    tree = await run_tree(env, task(), pol, cfg(tree_timeout_s=2.0, cell_timeout_s=60), tokenizer=tok)
    assert len(tree.nodes) == 3
    assert all(n.end_reason == EndReason.TREE_TIMEOUT for n in tree.nodes)
    assert all(n.verifier == 0.0 for n in tree.nodes)
    assert_all_finalised(tree, env)


async def test_max_steps_and_failed_gather_with_children_pending(tok):
    """The parent's gather fails on one child (max_steps) while its sibling still runs: the sibling is
    cancelled, and both, the parent and its other children all end finalised."""
    env = HookEnv()
    pol = ReplayPolicy(by_goal={"slow": [cell("await asyncio.sleep(0.5)"), cell("finish('slow')")],
                                "fails": [cell("print('no finish')")]},
                       by_depth={0: [cell("await asyncio.gather(launch_subagent('fails'), launch_subagent('slow'))"),
                                     cell("finish('root')")]})
    tree = await run_tree(env, task(), pol, cfg(max_steps_per_node=2), tokenizer=tok)
    ends = {n.goal: n.end_reason for n in tree.nodes}
    assert ends == {"root goal": EndReason.FINISHED, "fails": EndReason.MAX_STEPS, "slow": EndReason.CANCELLED}
    assert "sub-agent ended without finishing (max_steps)" in tree.root.turns[0].observation
    assert_all_finalised(tree, env)


class _CapturingTextCraft(type(get_env("textcraft-synth"))):
    """TextCraft env that keeps the episode of its last rollout (to re-verify nodes afterwards)."""

    def new_episode(self, task: Task):
        self.episode = super().new_episode(task)
        return self.episode


async def test_textcraft_child_is_verified_on_its_end_counts_after_the_parent_consumed_them(tok):
    env = _CapturingTextCraft()
    # a medium task where the expert delegates two ingredients and then crafts the target from them
    t = next(x for x in env.generate_tasks(n=2, seed=31, difficulty="medium")
             if x.task_id == "tcs-train-medium-s31-00001")
    tree = await run_tree(env, t, TextCraftExpert(seed=0), RuntimeConfig(sandbox=SANDBOX, repl_pool_size=0),
                          tokenizer=tok)
    children = [n for n in tree.nodes if n.depth > 0]
    assert len(children) == 2 and tree.root.end_reason == EndReason.FINISHED
    inv = env.episode.inventory
    stale_scores = []
    for child in children:
        (item, need), = child.goal_args["targets"].items()
        end = child.env_info["end_counts"]  # snapshot by on_node_end when the child finished
        assert end[item] - child.env_info["start_counts"][item] >= need
        assert inv.get(item, 0) < end[item]  # the parent consumed the child's products afterwards
        assert child.verifier == 1.0
        assert env.verify(env.episode, child) == 1.0  # re-verifying later still uses the end snapshot
        stale = child.model_copy(deep=True)
        del stale.env_info["end_counts"]
        stale_scores.append(env.verify(env.episode, stale))  # a verifier reading today's inventory
    assert 0.0 in stale_scores  # ... would fail a child that did its job (w3_i12 here: all consumed)
