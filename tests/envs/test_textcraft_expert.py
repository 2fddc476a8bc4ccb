"""The scripted TextCraft expert solves tasks of every difficulty through a stand-in runtime."""

from __future__ import annotations

import re

import pytest

from rao_core.envs.textcraft import TextCraftEnv
from rao_core.policies.textcraft_expert import TextCraftExpert
from tests.envs.textcraft_driver import FakeRuntime, LazyChildren

ENV = TextCraftEnv()


async def _solve(task, policy, **kw):
    ep = ENV.new_episode(task)
    rt = FakeRuntime(ENV, ep, policy, **kw)
    root = await rt.run(task)
    return ep, rt, root


@pytest.mark.parametrize("level,n", [("easy", 12), ("medium", 12), ("hard", 6), ("extreme", 3)])
async def test_expert_solves_every_task_and_every_node_verifies(level, n):
    for task in ENV.generate_tasks(n=n, seed=21, difficulty=level):
        ep, rt, root = await _solve(task, TextCraftExpert(seed=3))
        assert [ENV.verify(ep, node) for node in rt.nodes] == [1.0] * len(rt.nodes), task.task_id
        assert all(sum(m["role"] == "assistant" for m in node.messages) <= 10 for node in rt.nodes)
        assert max(node.depth for node in rt.nodes) <= 2
        if level in ("hard", "extreme"):
            assert root.children, "deep tasks are delegated"


async def test_expert_reads_printed_recipes_and_writes_specific_crafts():
    task = ENV.generate_tasks(n=1, seed=2, difficulty="easy")[0]
    ep, rt, root = await _solve(task, TextCraftExpert(seed=0, suboptimal_prob=0.0))
    msgs = root.messages
    assert "get_info(" in msgs[1]["content"]  # turn 1 looks up the targets
    target = next(iter(task.data["targets"]))
    assert f"INFO {target} depth" in msgs[2]["content"]  # and the runtime printed them
    craft_turn = next(m["content"] for m in msgs if m["role"] == "assistant" and "craft(" in m["content"])
    crafted = re.findall(r"craft\((\{.*?\}), \('(\w+)', (\d+)\)\)", craft_turn)
    gold = {(s["item"], s["total"]) for s in task.data["gold_plan"]}
    assert {(i, int(n)) for _, i, n in crafted} == gold  # same aggregated batches as the gold plan
    seen = " ".join(m["content"] for m in msgs[: msgs.index(next(m for m in msgs if m["content"] == craft_turn))])
    assert all(i in seen for _, i, _ in crafted)  # every item it crafts was printed before
    assert "finish(" in msgs[-1]["content"] and root.result.startswith("Crafted")


async def test_expert_parallel_and_sequential_delegation():
    task = ENV.generate_tasks(n=1, seed=5, difficulty="hard")[0]
    texts = {}
    for p in (0.0, 1.0):
        ep, rt, root = await _solve(task, TextCraftExpert(seed=0, parallel_prob=p))
        assert ENV.verify(ep, root) == 1.0
        texts[p] = " ".join(m["content"] for n in rt.nodes for m in n.messages if m["role"] == "assistant")
    assert "asyncio.gather" in texts[1.0] and "asyncio.gather" not in texts[0.0]


async def test_single_agent_expert_without_delegation():
    for task in ENV.generate_tasks(n=3, seed=8, difficulty="medium"):
        ep, rt, root = await _solve(task, TextCraftExpert(max_depth=0), max_depth=0)
        assert len(rt.nodes) == 1 and ENV.verify(ep, root) == 1.0


async def test_expert_repairs_after_a_failed_child():
    """A child that never crafts: the parent's crafts fail, it repairs from scratch and still succeeds."""
    task = ENV.generate_tasks(n=1, seed=5, difficulty="medium")[0]

    ep, rt, root = await _solve(task, LazyChildren(seed=1))
    if len(rt.nodes) > 1:
        assert ENV.verify(ep, rt.nodes[1]) == 0.0
        assert any("# repair" in m["content"] for m in root.messages)
    assert ENV.verify(ep, root) == 1.0


def test_expert_rejects_bad_options():
    with pytest.raises(ValueError, match="parallel_prob"):
        TextCraftExpert(parallel_prob=2.0)
    with pytest.raises(ValueError, match="delegate_min_depth"):
        TextCraftExpert(delegate_min_depth=0)


async def test_recursing_expert_that_cannot_delegate_is_the_plain_expert():
    """``recurse`` changes only what a node that may delegate does: with max depth 0 (delegation off) the
    recursing expert writes exactly the plain expert's turns and crafts the whole tree itself."""
    tasks = ENV.generate_tasks(n=2, seed=8, difficulty="nest2") + ENV.generate_tasks(n=2, seed=8, difficulty="medium")
    for task in tasks:
        runs = []
        for recurse in (False, True):
            ep, rt, root = await _solve(task, TextCraftExpert(seed=4, max_depth=0, recurse=recurse), max_depth=0)
            assert len(rt.nodes) == 1 and ENV.verify(ep, root) == 1.0
            runs.append([m["content"] for m in root.messages])
        assert runs[0] == runs[1]
