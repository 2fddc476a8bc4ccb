"""TextCraft-Synth: recipe graph rules, task generation, tools, shared inventory and the exact verifier."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from rao_core.envs import get_env, write_tasks
from rao_core.envs.base import ToolError
from rao_core.envs.textcraft.tasks import MULTI_TARGET
from rao_core.envs.textcraft import (
    DIFFICULTIES, TextCraftEnv, expanded_base_needs, generate_textcraft_tasks, plan_crafts, recipe_graph, split_items,
)
from rao_core.tree import EndReason, Node

ENV = TextCraftEnv()


def _node(env, ep, targets, node_id="n0", parent=None, depth=0) -> Node:
    spec = env.child_spec(ep, None, [targets, 10], {})
    node = Node(node_id=node_id, parent_id=parent, depth=depth, goal=spec.goal, goal_args=spec.goal_args)
    env.on_node_start(ep, node)
    return node


def _craft(ep, node, step):
    return ENV.call_tool(ep, node, "craft", [step["ingredients"], [step["item"], step["total"]]], {})


# ---------------------------------------------------------------- recipe graph ----------------------------------------
def test_graph_follows_the_spec_rules():
    g = recipe_graph(0, 25)
    assert sorted(g.by_tier) == list(range(13))
    assert len(g.by_tier[0]) == 5 * 25 and len(g.by_tier[12]) == 5 * 25 + 12  # + cross-domain items
    assert any(i.startswith("x") for i in g.by_tier[10]) and not any(i.startswith("x") for i in g.by_tier[9])
    for item, r in g.recipes.items():
        t = g.tier[item]
        tiers = [g.tier[i] for i in r.ingredients]
        assert t - 1 in tiers, item  # one ingredient from the tier just below: depth == tier
        assert all(t - 4 <= x <= t - 1 for x in tiers), item
        assert sum(1 for x in tiers if x < t - 2) <= 1  # at most one "far" ingredient
        assert 1 <= len(r.ingredients) <= 6
        near = sum(1 for x in tiers if x >= t - 2)
        base_n = 1 if t == 1 else 2 if t <= 7 else 3 if t <= 11 else 4
        assert near in (base_n, base_n + 1), (item, near)
        assert all(1 <= c <= (2 if t <= 3 else 1) for c in r.ingredients.values())
        lo, hi = {1: (2, 4), 2: (2, 3), 3: (1, 2), 4: (1, 2), 5: (1, 2)}.get(t, (1, 1))
        assert lo <= r.result_count <= hi
        dom = item[0]
        if dom != "x":  # single-domain items use their own domain only
            assert all(i[0] == dom for i in r.ingredients)
    assert all(g.is_base(i) and i not in g.recipes for i in g.by_tier[0])


def test_graph_is_seeded():
    a, b, c = recipe_graph(3, 8), recipe_graph(3, 8), recipe_graph(4, 8)
    assert a is b  # cached
    recipe_graph.cache_clear()
    assert recipe_graph(3, 8).recipes == a.recipes
    assert c.recipes != a.recipes


def test_plan_crafts_aggregates_needs_before_rounding():
    g = recipe_graph(0, 25)
    # pick a tier-3 item and check the plan by hand-simulation: every need is covered, nothing is crafted twice
    item = g.by_tier[3][0]
    crafts, leaves = plan_crafts(g, {item: 2})
    assert len({c["item"] for c in crafts}) == len(crafts)
    assert crafts[-1]["item"] == item and crafts[-1]["total"] >= 2
    assert all(g.is_base(i) for i in leaves)
    # the expanded tree bound is never below the aggregated plan's base use
    bound = expanded_base_needs(g, {item: 2})
    assert all(bound[i] >= n for i, n in leaves.items())


# ---------------------------------------------------------------- task generation -------------------------------------
def test_same_seed_gives_byte_identical_task_files(tmp_path):
    a = write_tasks(tmp_path / "a.jsonl", ENV.generate_tasks(n=20, seed=7, difficulty=None)).read_bytes()
    recipe_graph.cache_clear()
    b = write_tasks(tmp_path / "b.jsonl", ENV.generate_tasks(n=20, seed=7, difficulty=None)).read_bytes()
    c = write_tasks(tmp_path / "c.jsonl", ENV.generate_tasks(n=20, seed=8, difficulty=None)).read_bytes()
    assert a == b and a != c
    assert len(a) < 20 * 40_000  # task files stay small (graph is rebuilt from its seed)


def test_task_fields_and_difficulty_depths():
    for level, (lo, hi) in DIFFICULTIES.items():
        for t in ENV.generate_tasks(n=30, seed=1, difficulty=level):
            d = t.data
            assert t.env == "textcraft-synth" and t.difficulty == level
            assert lo <= d["depth"] <= hi and d["depth"] == max(int(i.split("_")[0][1:]) for i in d["targets"])
            assert d["num_gold_crafts"] == len(d["gold_plan"]) > 0
            assert all(v >= 1 for v in d["targets"].values())
            g = recipe_graph(d["graph"]["seed"], d["graph"]["items_per_tier"])
            assert all(g.is_base(i) for i in d["inventory"])
            need = expanded_base_needs(g, d["targets"])
            assert all(d["inventory"][i] >= n for i, n in need.items())  # full tree + buffer
            assert 1 <= len(set(d["inventory"]) - set(need)) <= 3  # 1..3 distractors
    with pytest.raises(ValueError, match="unknown difficulty"):
        ENV.generate_tasks(n=1, seed=0, difficulty="impossible")
    with pytest.raises(ValueError, match="unknown generator option"):
        ENV.generate_tasks(n=1, seed=0, foo=1)


def test_validation_split_holds_out_targets():
    g = recipe_graph(0, 25)
    split = split_items(g)
    for tier in range(1, 13):
        tr, va = set(split["train"][tier]), set(split["validation"][tier])
        assert not tr & va and tr | va == set(g.by_tier[tier])
        assert abs(len(va) / len(g.by_tier[tier]) - 0.2) < 0.03
    val_items = {i for t in split["validation"].values() for i in t}
    train_tasks = generate_textcraft_tasks(n=100, seed=2, difficulty=None, split="train")
    val_tasks = generate_textcraft_tasks(n=100, seed=2, difficulty=None, split="validation")
    assert not any(i in val_items for t in train_tasks for i in t.data["targets"])
    assert all(i in val_items for t in val_tasks for i in t.data["targets"])
    assert all(t.split == "validation" for t in val_tasks)


@pytest.mark.parametrize("level", list(DIFFICULTIES))
def test_every_task_is_solvable_by_replaying_its_gold_plan(level):
    tasks = ENV.generate_tasks(n=200, seed=11, difficulty=level)
    crafts = []
    for t in tasks:
        ep = ENV.new_episode(t)
        node = _node(ENV, ep, t.data["targets"])
        for step in t.data["gold_plan"]:
            _craft(ep, node, step)
        node.end_reason = EndReason.FINISHED
        ENV.on_node_end(ep, node)
        assert ENV.verify(ep, node) == 1.0, t.task_id
        crafts.append(len(t.data["gold_plan"]))
    # the reference generator's medians: easy 3, medium 19, hard 87, extreme 170; ours are in the same ballpark
    ref = {"tier1": 1, "easy": 3, "medium": 19, "hard": 87, "extreme": 170, **MULTI_TARGET, "nest1": 3, "nest2": 7}[level]  # tier1xK: K
    assert ref / 2 <= statistics.median(crafts) <= ref * 2


# ---------------------------------------------------------------- tools -----------------------------------------------
@pytest.fixture
def episode():
    task = ENV.generate_tasks(n=1, seed=5, difficulty="medium")[0]
    return task, ENV.new_episode(task)


def test_get_info_reports_recipes_and_held_counts(episode):
    task, ep = episode
    node = _node(ENV, ep, task.data["targets"])
    base = next(iter(task.data["inventory"]))
    info = ENV.call_tool(ep, node, "get_info", [[base, task.data["gold_plan"][0]["item"]]], {})
    assert info[0] == {"item": base, "craftable": False, "base": True, "held": task.data["inventory"][base],
                       "depth": 0, "recipes": []}
    step = task.data["gold_plan"][0]
    assert info[1]["craftable"] and info[1]["held"] == 0
    r = info[1]["recipes"][0]
    assert {i: c * step["executions"] for i, c in r["ingredients"].items()} == step["ingredients"]
    assert ENV.call_tool(ep, node, "get_info", [], {"items": base})[0]["item"] == base  # a single name is fine


def test_tool_errors_are_clear(episode):
    task, ep = episode
    node = _node(ENV, ep, task.data["targets"])
    step = task.data["gold_plan"][0]
    item, total, ings = step["item"], step["total"], step["ingredients"]
    rc = total // step["executions"]
    before = dict(ep.inventory)
    cases = [
        (("get_info", [["nope_1"]], {}), "unknown item"),
        (("get_info", [[]], {}), "must be a list"),
        (("craft", [ings, ["zz", 1]], {}), "craft: unknown item 'zz'"),
        (("craft", [{}, [next(iter(task.data["inventory"])), 1]], {}), "base material"),
        (("craft", [ings, [item, 0]], {}), "positive int"),
        (("craft", [ings, item], {}), "pair"),
        (("craft", [{k: v + 1 for k, v in ings.items()}, [item, total]], {}), "wrong ingredients"),
        (("craft", [ings], {}), "missing argument"),
        (("craft", [ings, [item, total]], {"bogus": 1}), "unexpected argument"),
        (("teleport", [], {}), "unknown tool"),
    ]
    if rc > 1:
        cases.append((("craft", [ings, [item, total + 1]], {}), "not a multiple"))
    for (name, args, kwargs), msg in cases:
        with pytest.raises(ToolError, match=msg):
            ENV.call_tool(ep, node, name, args, kwargs)
    # not enough ingredients: a later craft before its inputs exist
    last = task.data["gold_plan"][-1]
    with pytest.raises(ToolError, match="not enough ingredients"):
        _craft(ep, node, last)
    assert ep.inventory == before  # failed calls change nothing


def test_launch_subagent_maps_to_child_spec(episode):
    task, ep = episode
    item = task.data["gold_plan"][0]["item"]
    spec = ENV.child_spec(ep, None, [{item: 2}, 7], {"context": "recipe known"})
    assert spec.max_steps == 7 and spec.goal_args == {"targets": {item: 2}, "context": "recipe known"}
    assert f"2 x {item}" in spec.goal and "recipe known" in spec.goal
    assert ENV.child_spec(ep, None, [], {"targets": {item: 1}, "num_steps": 3}).max_steps == 3
    base = next(iter(task.data["inventory"]))
    for args, kwargs, msg in [([{}, 3], {}, "non-empty dict"), ([{"q": 1}, 3], {}, "unknown item"),
                              ([{base: 1}, 3], {}, "base material"), ([{item: -1}, 3], {}, "positive int"),
                              ([{item: 1}, 0], {}, "num_steps"), ([{item: 1}, 2], {"goal": "x"}, "unexpected"),
                              ([], {}, "missing argument")]:
        with pytest.raises(ToolError, match=msg):
            ENV.child_spec(ep, None, args, kwargs)


# ---------------------------------------------------------------- shared inventory and verify -------------------------
async def test_interleaved_children_share_one_consistent_inventory():
    """Two sibling nodes craft concurrently (yielding between every craft) from the same inventory."""
    tasks = ENV.generate_tasks(n=2, seed=3, difficulty="medium")
    # one episode holding both tasks' inventories, as if one parent had delegated both targets
    ep = ENV.new_episode(tasks[0])
    for k, v in tasks[1].data["inventory"].items():
        ep.inventory[k] = ep.inventory.get(k, 0) + v
    start_total = dict(ep.inventory)
    nodes = [_node(ENV, ep, t.data["targets"], node_id=f"c{i}", parent="r", depth=1) for i, t in enumerate(tasks)]

    async def child(node, task):
        for step in task.data["gold_plan"]:
            _craft(ep, node, step)
            await asyncio.sleep(0)  # let the sibling craft in between
        node.end_reason = EndReason.FINISHED
        ENV.on_node_end(ep, node)

    await asyncio.gather(*(child(n, t) for n, t in zip(nodes, tasks)))
    assert [ENV.verify(ep, n) for n in nodes] == [1.0, 1.0]
    # conservation: final inventory = start - all consumed + all produced (same as running them one after another)
    expected = dict(start_total)
    for t in tasks:
        for step in t.data["gold_plan"]:
            for i, c in step["ingredients"].items():
                expected[i] -= c
            expected[step["item"]] = expected.get(step["item"], 0) + step["total"]
    assert ep.inventory == {k: v for k, v in expected.items() if v}
    assert all(v > 0 for v in ep.inventory.values())


def test_verify_semantics(episode):
    task, ep = episode
    targets = task.data["targets"]
    node = _node(ENV, ep, targets)
    for step in task.data["gold_plan"]:
        _craft(ep, node, step)
    node.end_reason = EndReason.MAX_STEPS
    assert ENV.verify(ep, node) == 0.0  # crafted, but never called finish
    node.end_reason = EndReason.FINISHED
    ENV.on_node_end(ep, node)
    assert ENV.verify(ep, node) == 1.0
    # the parent consuming the products later does not change the child's verdict (end snapshot)
    item = next(iter(targets))
    ep.inventory[item] = 0
    assert ENV.verify(ep, node) == 1.0
    # a node started when the targets were already held must raise the count again
    late = _node(ENV, ep, {item: 1}, node_id="late")
    late.end_reason = EndReason.FINISHED
    ENV.on_node_end(ep, late)
    assert late.env_info["start_counts"] == {item: 0} and ENV.verify(ep, late) == 0.0
    ep.inventory[item] = 5
    held = _node(ENV, ep, {item: 1}, node_id="held")
    held.end_reason = EndReason.FINISHED
    ENV.on_node_end(ep, held)
    assert ENV.verify(ep, held) == 0.0  # 5 - 5 = 0 < 1: holding is not crafting
    with pytest.raises(ValueError, match="start_counts"):
        ENV.verify(ep, Node(node_id="x", goal="g", goal_args={"targets": {item: 1}}, end_reason=EndReason.FINISHED))



def test_verify_counts_only_what_the_nodes_own_tree_crafted():
    """One shared inventory; each craft is booked to the crafting node and its ancestors. A node's success
    needs its targets' net units made by its own tree (its crafts and its descendants'): what its parent or a
    sibling crafted during its life raises the shared count but never counts for it. For the root, the
    tree's net units equal the inventory's rise, so the root's rule is the rise alone, as before."""
    task = ENV.generate_tasks(n=1, seed=3, difficulty="easy")[0]  # 1 x w2_i16 from w1_i1 and w1_i14
    ep = ENV.new_episode(task)
    start_inv = dict(ep.inventory)
    steps = {st["item"]: st for st in task.data["gold_plan"]}
    assert list(steps) == ["w1_i1", "w1_i14", "w2_i16"]
    root = _node(ENV, ep, task.data["targets"], node_id="0")
    idle = _node(ENV, ep, {"w1_i1": 2}, node_id="0.0", parent="0", depth=1)
    worker = _node(ENV, ep, {"w1_i1": 2}, node_id="0.1", parent="0", depth=1)
    middle = _node(ENV, ep, {"w1_i14": 2}, node_id="0.2", parent="0", depth=1)
    leaf = _node(ENV, ep, {"w1_i14": 2}, node_id="0.2.0", parent="0.2", depth=2)

    def end(node):
        node.end_reason = EndReason.FINISHED
        ENV.on_node_end(ep, node)
        return ENV.verify(ep, node)

    _craft(ep, worker, steps["w1_i1"])  # a sibling crafts idle's target while idle runs
    assert end(worker) == 1.0 and worker.env_info["made_counts"] == {"w1_i1": 4}
    _craft(ep, leaf, steps["w1_i14"])  # a grandchild crafts for its parent
    assert end(leaf) == 1.0
    assert end(middle) == 1.0 and middle.env_info["made_counts"] == {"w1_i14": 4}  # its descendant's work counts
    _craft(ep, root, steps["w2_i16"])  # the parent crafts while idle still runs
    assert end(idle) == 0.0  # the shared count rose by 4 during its life, but it crafted nothing
    assert idle.env_info["end_counts"]["w1_i1"] - idle.env_info["start_counts"]["w1_i1"] == 2
    assert idle.env_info["made_counts"] == {"w1_i1": 0}
    assert end(root) == 1.0 and root.env_info["made_counts"] == {"w2_i16": 2}
    # the ledger is net (units produced minus units consumed as ingredients); the root's is the net change
    # of the whole inventory
    rise = {i: ep.inventory.get(i, 0) - start_inv.get(i, 0) for i in set(ep.inventory) | set(start_inv)}
    assert {i: d for i, d in ep.made["0"].items() if d} == {i: d for i, d in rise.items() if d}
    assert ep.made["0.2"] == {"w1_i14": 4, "w0_i11": -1} and "0.0" not in ep.made
    # a craft outside any rollout (no node) is booked to nobody
    before = {k: dict(v) for k, v in ep.made.items()}
    ENV.call_tool(ep, None, "craft", [steps["w1_i1"]["ingredients"], ["w1_i1", 4]], {})
    assert ep.made == before

def test_registry_and_root_goal():
    env = get_env("textcraft-synth")
    assert isinstance(env, TextCraftEnv) and env.exact_subtask_verifier
    assert {t.name for t in env.tools()} == {"get_info", "craft", "view_inventory"}
    assert env.subagent_tool().signature.startswith("launch_subagent(targets: dict, num_steps: int")
    task = env.generate_tasks(n=1, seed=0, difficulty="easy")[0]
    spec = env.root_goal(task)
    assert spec.goal_args == {"targets": task.data["targets"]}
