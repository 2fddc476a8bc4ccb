"""The ``nest<L>`` nested shape: a target whose craftable ingredients are sub-goals of the same kind one
level down, the expert that recurses on it (one sub-agent per craftable ingredient, then its own craft), through
the stand-in and the real runtime, and the window that fits the recursing tree but not one node doing it all."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from rao_core.envs.textcraft import TextCraftEnv, split_items
from rao_core.envs.textcraft.tasks import NEST_BRANCHING, NESTED, craftable_ingredients, graph_of, nest_items
from rao_core.paths import default_model_path, tiny_model_path
from rao_core.policies.textcraft_expert import TextCraftExpert
from rao_core.runtime import RuntimeConfig, run_trees
from rao_core.tree import EndReason, Node
from tests.envs.textcraft_driver import FakeRuntime, LazyChildren

ENV = TextCraftEnv()
SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
needs_tiny = pytest.mark.skipif(not (tiny_model_path() / "tokenizer_config.json").exists(),
                                reason="tiny model tokenizer not prepared (make setup)")


def _is_nest(graph, item: str, level: int) -> bool:
    """The definition, written out again: level 0 = a tier-1 item; level L = tier L+1, exactly 2 craftable
    ingredients, each of level L-1."""
    if level == 0:
        return graph.tier[item] == 1
    kids = craftable_ingredients(graph, item)
    return graph.tier[item] == level + 1 and len(kids) == 2 and all(_is_nest(graph, k, level - 1) for k in kids)


def _subtree(graph, item: str) -> list[str]:
    return [x for k in craftable_ingredients(graph, item) for x in (k, *_subtree(graph, k))]


# ---------------------------------------------------------------- generation ------------------------------------------
@pytest.mark.parametrize("level", ["nest1", "nest2"])
def test_nested_targets_have_the_shape_of_a_tree(level):
    lv = NESTED[level]
    for split in ("train", "validation"):
        tasks = ENV.generate_tasks(n=30, seed=5, difficulty=level, split=split)
        graph = graph_of(tasks[0])
        for t in tasks:
            ((target, count),) = t.data["targets"].items()
            assert _is_nest(graph, target, lv) and 1 <= count <= 3, t.task_id
            sub = _subtree(graph, target)
            # 2 + 4 craftable items under a nest2 target, all distinct: 2^(L+1) - 2 sub-goals, a tree not a DAG
            assert len(sub) == len(set(sub)) == 2 ** (lv + 1) - 2
            assert t.data["depth"] == lv + 1 and t.difficulty == level
            ENV.validate_task(t)  # craftable from the starting inventory
    assert NEST_BRANCHING == 2
    again = ENV.generate_tasks(n=30, seed=5, difficulty=level, split="validation")
    assert [t.data for t in again] == [t.data for t in tasks]  # seeded


@pytest.mark.parametrize("level", ["nest1", "nest2"])
def test_held_out_nested_targets_are_disjoint_from_training_ones(level):
    lv = NESTED[level]
    train = ENV.generate_tasks(n=200, seed=2, difficulty=level, split="train")
    val = ENV.generate_tasks(n=100, seed=2, difficulty=level, split="validation")
    graph = graph_of(train[0])
    held_out = set(split_items(graph)["validation"][lv + 1])
    train_targets = {i for t in train for i in t.data["targets"]}
    val_targets = {i for t in val for i in t.data["targets"]}
    assert not train_targets & held_out and val_targets <= held_out and not train_targets & val_targets
    # every eligible item is drawn: 71 / 14 nest1 and 28 / 8 nest2 items on the default graph
    eligible = set(nest_items(graph, lv))
    assert val_targets == eligible & held_out and train_targets == eligible - held_out
    assert (len(train_targets), len(val_targets)) == {1: (71, 14), 2: (28, 8)}[lv]


@pytest.mark.parametrize("level", ["nest1", "nest2"])
def test_every_nested_task_is_solved_by_replaying_its_gold_plan(level):
    for t in ENV.generate_tasks(n=60, seed=11, difficulty=level):
        ep = ENV.new_episode(t)
        spec = ENV.child_spec(ep, None, [t.data["targets"], 10], {})
        node = Node(node_id="n0", goal=spec.goal, goal_args=spec.goal_args)
        ENV.on_node_start(ep, node)
        for step in t.data["gold_plan"]:
            ENV.call_tool(ep, node, "craft", [step["ingredients"], [step["item"], step["total"]]], {})
        node.end_reason = EndReason.FINISHED
        ENV.on_node_end(ep, node)
        assert ENV.verify(ep, node) == 1.0, t.task_id
        assert t.data["num_gold_crafts"] == 2 ** (NESTED[level] + 1) - 1  # one craft per item of the tree: 3, 7


def test_no_deeper_nested_level_and_unknown_names_are_refused():
    assert nest_items(graph_of(ENV.generate_tasks(n=1, seed=0, difficulty="nest1")[0]), 3) == []
    with pytest.raises(ValueError, match="nest3"):
        ENV.generate_tasks(n=1, seed=0, difficulty="nest3")


# ---------------------------------------------------------------- the recursing expert (stand-in runtime) -------------
def _check_tree_mirrors_task(nodes: list[Node], graph) -> None:
    """Every node with a target of tier >= 2 has one child per craftable ingredient of it; tier-1 nodes none."""
    by_id = {n.node_id: n for n in nodes}
    for n in nodes:
        ((item, _),) = n.goal_args["targets"].items()
        kids = [next(iter(by_id[c].goal_args["targets"])) for c in n.children]
        assert sorted(kids) == sorted(craftable_ingredients(graph, item)), n.node_id


@pytest.mark.parametrize("parallel", [0.0, 1.0])
async def test_recursing_expert_launches_one_child_per_craftable_ingredient(parallel):
    for level in ("nest1", "nest2"):
        for task in ENV.generate_tasks(n=3, seed=7, difficulty=level):
            ep = ENV.new_episode(task)
            rt = FakeRuntime(ENV, ep, TextCraftExpert(seed=1, parallel_prob=parallel, recurse=True, max_depth=4,
                                                      child_steps=6), max_depth=4)
            root = await rt.run(task)
            assert [ENV.verify(ep, n) for n in rt.nodes] == [1.0] * (2 ** (NESTED[level] + 1) - 1)
            assert max(n.depth for n in rt.nodes) == NESTED[level]
            _check_tree_mirrors_task(rt.nodes, graph_of(task))
            cell = root.messages[1]["content"]
            assert ("asyncio.gather" in cell) == bool(parallel) and "craft(need" in cell
            assert sum(m["role"] == "assistant" for m in root.messages) == 2  # one cell, then finish


async def test_at_the_depth_limit_a_node_crafts_its_sub_tree_itself():
    """nest2 with max depth 1: the root still recurses, each depth-1 node makes its nest1 item alone."""
    task = ENV.generate_tasks(n=1, seed=7, difficulty="nest2")[0]
    ep = ENV.new_episode(task)
    rt = FakeRuntime(ENV, ep, TextCraftExpert(seed=1, recurse=True, max_depth=1), max_depth=1)
    await rt.run(task)
    assert len(rt.nodes) == 3 and [ENV.verify(ep, n) for n in rt.nodes] == [1.0] * 3
    assert all(not n.children for n in rt.nodes[1:])


async def test_recursing_expert_repairs_when_its_children_fail():
    task = ENV.generate_tasks(n=1, seed=7, difficulty="nest1")[0]
    ep = ENV.new_episode(task)
    rt = FakeRuntime(ENV, ep, LazyChildren(seed=1, recurse=True, max_depth=4), max_depth=4)
    root = await rt.run(task)
    assert [ENV.verify(ep, n) for n in rt.nodes[1:]] == [0.0, 0.0]
    assert any("# repair" in m["content"] for m in root.messages if m["role"] == "assistant")
    assert ENV.verify(ep, root) == 1.0 and root.result.startswith("Crafted")


# ---------------------------------------------------------------- the real runtime ------------------------------------
async def _run(tasks, policy, config):
    return await run_trees(ENV, [(t, 1) for t in tasks], policy, config, tokenizer=tiny_model_path())


@needs_tiny
async def test_recursing_expert_through_the_real_runtime():
    """nest1 gives trees of depth 1 (3 nodes), nest2 trees of depth 2 (7 nodes); every node verified exactly."""
    tasks = ENV.generate_tasks(n=2, seed=31, difficulty="nest1") + ENV.generate_tasks(n=1, seed=31, difficulty="nest2")
    config = RuntimeConfig(max_depth=4, sandbox=SANDBOX)
    trees = await _run(tasks, TextCraftExpert(seed=0, recurse=True, max_depth=4), config)
    for task, tree in zip(tasks, trees):
        assert tree.error is None, tree.error
        assert [n.verifier for n in tree.nodes] == [1.0] * len(tree.nodes), task.task_id
        lv = NESTED[task.difficulty]
        assert tree.depth == lv and len(tree.nodes) == 2 ** (lv + 1) - 1
        _check_tree_mirrors_task(tree.nodes, graph_of(task))
        assert tree.root.end_reason == EndReason.FINISHED and tree.root.result.startswith("Crafted")


@needs_tiny
async def test_with_delegation_off_the_recursing_expert_does_everything_itself():
    tasks = ENV.generate_tasks(n=1, seed=31, difficulty="nest2")
    config = RuntimeConfig(max_depth=4, delegation=False, sandbox=SANDBOX)
    (tree,) = await _run(tasks, TextCraftExpert(seed=0, recurse=True, max_depth=config.effective_max_depth), config)
    assert len(tree.nodes) == 1 and tree.root.verifier == 1.0
    code = " ".join(u.code or "" for u in tree.root.turns)
    assert "launch_subagent" not in code and code.count("craft(") >= 7  # the whole tree of crafts, written out


def test_the_window_fits_the_recursing_tree_but_not_one_node():
    """docs/environments/textcraft.md, "The nested shape": at 1344 tokens (256 for the reply), SmolLM2's tokenizer
    and the real runtime, one node crafting a nest1 or nest2 target alone runs out of the window; the recursing tree
    (max depth 4, never binding) solves both with every node verified, at depths 1 and 2."""
    from rao_core.warmstart import DemoConfig
    from scripts.shape_fit import arm_row
    from rao_core.runtime import load_tokenizer

    if not (default_model_path() / "tokenizer.json").exists():
        pytest.skip("SmolLM2 not prepared (make setup)")
    tok = load_tokenizer(str(default_model_path()))
    demo = DemoConfig(parallel_prob=0.5, suboptimal_prob=0.0)
    for level in ("nest1", "nest2"):
        tasks = ENV.generate_tasks(n=3, seed=0, difficulty=level)
        rows = {}
        for arm in ("single", "recursive"):
            rc = RuntimeConfig(context_window=1344, max_new_tokens=256, max_depth=4, delegation=arm == "recursive",
                               max_steps_per_node=40 if arm == "single" else 6, sandbox=SANDBOX)
            rows[arm] = asyncio.run(arm_row(ENV, tasks, tok, rc, demo, recurse=True))
        assert rows["single"]["ok"] == 0 and rows["single"]["ends"] == {EndReason.CONTEXT_OVERFLOW.value: 3}
        lv = NESTED[level]
        assert rows["recursive"]["ok"] == 3 and rows["recursive"]["depths"] == {lv: 3}
        assert rows["recursive"]["nodes_ok"] == rows["recursive"]["nodes_all"] == 3 * (2 ** (lv + 1) - 1)
        assert rows["recursive"]["longest_reply"] < 256  # a policy could write the expert's cell
