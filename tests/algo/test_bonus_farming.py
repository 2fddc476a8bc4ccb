"""The delegation bonus cannot be farmed under any environment's default configuration.

Two kinds of check. Hand-built trees, scored as the judging stage scores them (rewards by Eq. 1 with the
configured rule, then Eq. 3-4 advantages over one group): solving directly, forwarding the whole goal to one
child that solves it, padding a solved task with five trivial successful children, forwarding and then not
finishing. Under ``algo.bonus: useful`` (the default) none of the last three earns more reward or advantage
than solving directly; under ``bonus: eq1`` (the paper's Eq. 1 as written, still selectable) forwarding and
padding earn lambda more, by hand: 1 + 0.5 * mean(1) = 1.5.

Trees grown through the real runtime on TextCraft-Synth (scripted policies, sandboxed REPLs, the
environment's verifier, the judging stage's scoring), where the anti-farming rules live in the environment:
the launch-time verdict ``bonus_exclusion`` (forwarding, padding with unrelated goals) and the verifier,
which credits a node only with what its own tree crafted. Idle children launched on parts of the goal while
the root crafts its targets (one shared inventory) earn s = 0 and the root no bonus; children that craft
their sub-goals earn s = 1 and the root the bonus; a child forwarding the whole goal earns the root nothing.
"""

from __future__ import annotations

import shutil

import pytest

from rao_core.config import load_config
from rao_core.envs import REGISTRY, Environment, env_class, get_env
from rao_core.envs.textcraft import TextCraftEnv
from rao_core.judge import JudgeConfig
from rao_core.judge.stage import judge_trees
from rao_core.paths import tiny_model_path
from rao_core.policies.scripted import ReplayPolicy, cell
from rao_core.rewards import delegation_bonus, local_node_reward, node_rewards
from rao_core.runtime import RuntimeConfig, run_tree
from rao_core.samples import AlgoSettings, build_samples
from rao_core.tree import EndReason, Node
from tests.algo.helpers import node, tree

FORWARD = "forwards its parent's goal"
PAD = "not part of its parent's goal"


def _direct(tid: str):
    return tree(tid, "g", [node("r", None, 0, 1.0)])


def _forward(tid: str, root_success: float = 1.0):
    child = node("c", "r", 1, 1.0)
    child.no_bonus = FORWARD
    return tree(tid, "g", [node("r", None, 0, root_success), child])


def _padded(tid: str):
    kids = [node(f"c{i}", "r", 1, 1.0) for i in range(5)]
    for k in kids:
        k.no_bonus = PAD
    return tree(tid, "g", [node("r", None, 0, 1.0), *kids])


def _root_rewards(trees, algo: AlgoSettings, env: str) -> dict[str, float]:
    w = algo.bonus_weight(env)
    return {t.tree_id: node_rewards(t, w, bonus=algo.bonus)[t.root_id] for t in trees}


@pytest.mark.parametrize("env", sorted(REGISTRY))
def test_farming_never_beats_solving_directly_under_every_default(env):
    algo = AlgoSettings()
    assert algo.bonus == "useful" and algo.lam is None
    trees = [_direct("direct"), _forward("forward"), _padded("padded"), _forward("forward_fail", root_success=0.0)]
    r = _root_rewards(trees, algo, env)
    assert r["forward"] <= r["direct"] and r["padded"] <= r["direct"] and r["forward_fail"] <= r["direct"]
    assert r == {"direct": 1.0, "forward": 1.0, "padded": 1.0, "forward_fail": 0.0}
    # advantages (Eq. 3-4) in a group where every tree solves the task: all equal, no push towards farming
    batch = build_samples(trees[:3], algo.bonus_weight(env), bonus=algo.bonus)
    roots = {s.tree_id: s.advantage for s in batch.samples if s.depth == 0}
    assert roots == {"direct": 0.0, "forward": 0.0, "padded": 0.0}


def test_the_paper_eq1_is_still_selectable_and_farmable_by_hand():
    algo = AlgoSettings(bonus="eq1")
    assert algo.bonus_weight("textcraft-synth") == 0.5  # lambda unset -> 0.5, as every earlier config
    trees = [_direct("direct"), _forward("forward"), _padded("padded"), _forward("forward_fail", root_success=0.0)]
    r = _root_rewards(trees, algo, "textcraft-synth")
    # Eq. 1 as written: s + 0.5 * mean(children s); the exclusion marks are ignored
    assert r == {"direct": 1.0, "forward": 1.5, "padded": 1.5, "forward_fail": 0.5}
    batch = build_samples(trees[:3], 0.5, bonus="eq1")
    roots = {s.tree_id: s.advantage for s in batch.samples if s.depth == 0}
    # LOO baselines: direct (1.5 + 1.5) / 2 = 1.5 -> -0.5; forward (1 + 1.5) / 2 = 1.25 -> +0.25
    assert roots == pytest.approx({"direct": -0.5, "forward": 0.25, "padded": 0.25})


def test_useful_bonus_is_cap_times_credited_successes_over_children():
    # 4 children: s = 1, 1, 0, NaN; the second is not credited -> 0.4 * 1 / 3 (the NaN child is left out)
    assert delegation_bonus([1.0, 1.0, 0.0, None], 0.4, bonus="useful",
                            credited=[True, False, True, True]) == pytest.approx(0.4 / 3)
    # the same children under eq1: 0.4 * mean(1, 1, 0) = 0.4 * 2/3
    assert delegation_bonus([1.0, 1.0, 0.0, None], 0.4, bonus="eq1",
                            credited=[True, False, True, True]) == pytest.approx(0.8 / 3)
    # a child that never finished is scored s = 0 by the judge: it counts as launched and failed
    assert local_node_reward(1.0, [1.0, 0.0], 0.4, bonus="useful") == pytest.approx(1.2)
    assert local_node_reward(0.0, [], 0.4, bonus="useful") == 0.0
    with pytest.raises(ValueError, match="unknown delegation-bonus rule"):
        delegation_bonus([1.0], 0.4, bonus="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="credited has 1 entries for 2 children"):
        delegation_bonus([1.0, 1.0], 0.4, bonus="useful", credited=[True])


def test_each_environment_has_its_cap_and_lam_overrides_it():
    caps = {name: env_class(name).delegation_cap for name in REGISTRY}
    assert caps["textcraft-synth"] == 0.0 and caps["oolong"] == 0.4 and caps["arte"] == 0.4
    assert caps["deepdive"] == 0.0
    assert AlgoSettings(lam=0.1).bonus_weight("deepdive") == 0.1
    with pytest.raises(ValueError, match="unknown environment"):
        AlgoSettings().bonus_weight("nope")


def test_the_cpu_configs_state_their_bonus():
    assert load_config("configs/cpu-smoke.yaml").algo.bonus == "useful"
    for c in ("configs/experiment-textcraft-tier1.yaml", "configs/experiment-textcraft-tier1x.yaml",
              "configs/experiment-textcraft-cpu.yaml"):  # their records were made with Eq. 1 as written
        algo = load_config(c).algo
        assert (algo.bonus, algo.lam) == ("eq1", 0.5), c


# ------------------------------------------------------------- the environments' exclusion rules at launch ----------
def _textcraft_parent(n_targets: int = 2):
    env = TextCraftEnv()
    task = env.generate_tasks(n=1, seed=3, difficulty="tier1x2" if n_targets == 2 else "tier1")[0]
    ep = env.new_episode(task)
    spec = env.root_goal(task)
    return env, ep, Node(node_id="0", goal=spec.goal, goal_args=spec.goal_args)


def test_textcraft_refuses_forwarding_and_padding_exactly():
    env, ep, root = _textcraft_parent()
    targets = root.goal_args["targets"]
    assert len(targets) == 2
    first, second = list(targets)
    spec = lambda t: env.child_spec(ep, root, [t, 5], {})  # noqa: E731
    assert env.bonus_exclusion(ep, root, spec(dict(targets))) == "forwards its parent's goal (all of its targets)"
    assert env.bonus_exclusion(ep, root, spec({first: targets[first], second: targets[second] + 1})) is not None
    assert env.bonus_exclusion(ep, root, spec({first: targets[first]})) is None  # a strict part: credited
    assert env.bonus_exclusion(ep, root, spec({second: targets[second]})) is None
    needed = set(targets)
    for t in targets:
        needed |= set(ep.graph.recipes[t].ingredients)
    unrelated = next(i for i, r in ep.graph.recipes.items() if i not in needed)
    assert env.bonus_exclusion(ep, root, spec({unrelated: 1})) == f"not part of its parent's goal ({unrelated})"


def test_textcraft_credits_an_ingredient_of_a_target_one_level_down():
    env = TextCraftEnv()
    task = env.generate_tasks(n=1, seed=5, difficulty="medium")[0]
    ep = env.new_episode(task)
    root_spec = env.root_goal(task)
    root = Node(node_id="0", goal=root_spec.goal, goal_args=root_spec.goal_args)
    target = next(iter(root.goal_args["targets"]))
    craftable = [i for i in ep.graph.recipes[target].ingredients if i in ep.graph.recipes]
    assert craftable, "a medium target has a craftable ingredient"
    assert env.bonus_exclusion(ep, root, env.child_spec(ep, root, [{craftable[0]: 1}, 5], {})) is None


@pytest.mark.parametrize("env_name", ["oolong", "arte", "deepdive"])
def test_free_text_environments_refuse_a_forwarded_goal(env_name):
    env = get_env(env_name)
    q = "How many times does  Alice mention the budget?"
    root = Node(node_id="0", goal=f"{q}\n\nThe transcript is in `context`.", goal_args={"question": q})
    child = Node(node_id="0.0", depth=1, goal="Count budget mentions", goal_args={"goal": "Count budget mentions"})
    assert env.bonus_exclusion(None, root, Environment.launch_subagent(env, "how many times does alice mention "
                                                                            "the budget?")) == FORWARD
    assert env.bonus_exclusion(None, root, Environment.launch_subagent(env, root.goal)) == FORWARD
    # the same question over a part of the input (given as context) is a split, left to the judge
    assert env.bonus_exclusion(None, root, Environment.launch_subagent(env, q, "lines 1-200: ...")) is None
    assert env.bonus_exclusion(None, root, Environment.launch_subagent(env, "Count budget mentions in part 1")) is None
    # a child forwarding its own goal one level down
    assert env.bonus_exclusion(None, child, Environment.launch_subagent(env, "count budget  mentions")) == FORWARD


def test_the_runtime_records_the_verdict_on_the_child():
    """A real rollout through the runtime with a scripted policy whose root forwards its goal: the child's
    ``no_bonus`` is set at launch, and the root earns no bonus under the default rule (Eq. 1 gives it 0.4)."""
    import asyncio

    env, ep, root = _textcraft_parent()
    targets = root.goal_args["targets"]
    policy = ReplayPolicy(by_depth={0: [cell(f"r = await launch_subagent({targets!r}, 3)\nfinish('done')")],
                                    1: [cell("finish('nothing')")]})
    cfg = RuntimeConfig(max_depth=1, max_steps_per_node=2, sandbox="bwrap" if shutil.which("bwrap") else "none")
    t = asyncio.run(run_tree(env, ep.task, policy, cfg, tokenizer=tiny_model_path()))
    assert t.root.end_reason == EndReason.FINISHED, (t.error, [(n.node_id, n.error) for n in t.nodes])
    child = next(n for n in t.nodes if n.depth == 1)
    assert child.no_bonus == "forwards its parent's goal (all of its targets)"
    for n in t.nodes:
        n.success = 1.0
    assert node_rewards(t, 0.4, bonus="useful")[t.root_id] == 1.0
    assert node_rewards(t, 0.4, bonus="eq1")[t.root_id] == pytest.approx(1.4)


# ------------------------------------------------- scripted trees through the real runtime (TextCraft-Synth) ---------
# Each tree is grown by ``rao_core.runtime.run_tree`` with a scripted policy, every node verified by the
# environment when it ends, and scored by the judging stage (``judge_trees``, the LLM judge off: TextCraft has
# an exact verifier for every node). Rewards use ``algo.bonus: useful`` with the cap ``algo.lam: 0.4``.
CAP = 0.4
TC = TextCraftEnv()
PADDING_TASK = TC.generate_tasks(n=1, seed=3, difficulty="tier1x2")[0]  # 2 x s1_i12, 2 x w1_i0: two tier-1 crafts
SPLIT_TASK = TC.generate_tasks(n=1, seed=3, difficulty="easy")[0]  # 1 x w2_i16 from 2 x w1_i1 and 2 x w1_i14


def _crafts(task, items=None) -> str:
    """Code crafting the gold-plan steps of ``task`` (those of ``items`` only, when given), in plan order."""
    return "\n".join(f"craft({s['ingredients']!r}, ({s['item']!r}, {s['total']}))"
                     for s in task.data["gold_plan"] if items is None or s["item"] in items)


def _scripts(root: list[str], by_targets: dict[tuple[str, ...], list[str]]) -> ReplayPolicy:
    """A replay policy: the root replays ``root``; a sub-agent the script of its sorted target items."""
    return ReplayPolicy(chooser=lambda n: root if n.depth == 0 else by_targets[tuple(sorted(n.goal_args["targets"]))])


async def _grow(task, policy, tree_id: str, max_depth: int = 1):
    """One scored tree of ``task`` (group = the task), every node finished and verified."""
    cfg = RuntimeConfig(max_depth=max_depth, max_steps_per_node=3, repl_pool_size=0,
                        sandbox="bwrap" if shutil.which("bwrap") else "none")
    t = await run_tree(TC, task, policy, cfg, tokenizer=tiny_model_path(), tree_id=tree_id, group_id=task.task_id)
    assert t.error is None and all(n.end_reason == EndReason.FINISHED for n in t.nodes), \
        (t.error, [(n.node_id, n.end_reason, n.error) for n in t.nodes])
    (scored,), _ = await judge_trees([t], None, JudgeConfig(enabled=False))
    assert all(n.success_source == "verifier" and n.success == n.verifier for n in scored.nodes)
    return scored


def _direct_policy(task) -> ReplayPolicy:
    """The root crafts the gold plan itself and finishes: no sub-agent."""
    return _scripts([cell(_crafts(task) + "\nfinish('done')")], {})


def _plan_totals(task) -> dict[str, int]:
    """Units of each target the gold plan crafts (a recipe yields result_count at a time: may exceed the need)."""
    return {s["item"]: s["total"] for s in task.data["gold_plan"] if s["item"] in task.data["targets"]}


def _root_advantages(trees) -> dict[str, float]:
    """Eq. 3-4 advantage of each tree's root in one group (``useful``, cap 0.4), by tree id."""
    batch = build_samples(trees, CAP, bonus="useful")
    return {s.tree_id: s.advantage for s in batch.samples if s.depth == 0}


needs_tokenizer = pytest.mark.skipif(not (tiny_model_path() / "tokenizer_config.json").exists(),
                                     reason="tiny model tokenizer not prepared (make setup)")


@needs_tokenizer
async def test_idle_children_get_no_credit_for_what_the_root_crafts_while_they_run():
    """Three children launched on credited parts of the goal only print and finish; the root crafts both
    targets while they run, so the shared inventory rises during each child's life. Each child is scored
    s = 0 (it crafted nothing), and the root earns no bonus: R 1.0, as solving directly (under the old
    rise-of-the-shared-inventory check: children s = 1, root R 1.4, advantage +0.4 over the direct solver)."""
    task = PADDING_TASK
    (a, na), (b, nb) = task.data["targets"].items()
    parts = [{a: na}, {b: nb}, {a: 1}]  # strict parts of the goal: bonus_exclusion credits each of them
    root = cell(f"kids = [asyncio.ensure_future(launch_subagent(p, 2)) for p in {parts!r}]\n"
                "await asyncio.sleep(1)  # the children start before the crafts\n"
                f"{_crafts(task)}\nawait asyncio.gather(*kids)\nfinish('done')")
    idle = [cell("await asyncio.sleep(3)  # alive while the root crafts\nprint('hi')"), cell("finish('ok')")]

    def rose(tree) -> bool:  # the loophole's condition: the shared inventory rose by each target in its child's life
        return all(k.env_info["end_counts"][i] - k.env_info["start_counts"][i] >= n
                   for k in tree.nodes if k.depth == 1 for i, n in k.goal_args["targets"].items())

    for _ in range(3):  # on a loaded machine a child may start after the crafts: grow the tree again
        padded = await _grow(task, _scripts([root], {(a,): idle, (b,): idle}), "padded")
        if rose(padded):
            break
    direct = await _grow(task, _direct_policy(task), "direct")

    kids = [n for n in padded.nodes if n.depth == 1]
    assert [n.goal_args["targets"] for n in kids] == parts
    for k in kids:
        (item, need), = k.goal_args["targets"].items()
        # the loophole's condition holds: the shared inventory rose by the target during the child's life
        assert k.env_info["end_counts"][item] - k.env_info["start_counts"][item] >= need
        assert k.env_info["made_counts"] == {item: 0} and k.no_bonus is None
        assert (k.verifier, k.success) == (0.0, 0.0)
    assert padded.root.success == 1.0 and padded.root.env_info["made_counts"] == _plan_totals(task)
    r = node_rewards(padded, CAP, bonus="useful")
    assert r[padded.root_id] == 1.0 == node_rewards(direct, CAP, bonus="useful")[direct.root_id]
    assert all(r[k.node_id] == 0.0 for k in kids)
    adv = _root_advantages([direct, padded])
    assert adv["padded"] <= adv["direct"] and adv == {"direct": 0.0, "padded": 0.0}


@needs_tokenizer
async def test_children_that_craft_their_sub_goals_succeed_and_earn_the_root_the_bonus():
    """Two children each craft one ingredient of the target; the root crafts the target from them: every
    node s = 1 and the root R = 1 + 0.4 * 2/2. The same split one level deeper (one child asks two
    grandchildren for the two ingredients and crafts nothing itself) also solves the child's goal: what a
    node's descendants crafted counts as its own, so the middle node s = 1 and R = 1.4 too."""
    task = SPLIT_TASK
    (target,) = task.data["targets"]
    *_, last = task.data["gold_plan"]
    ings = last["ingredients"]  # what the final craft consumes: 2 x w1_i1, 2 x w1_i14
    assert last["item"] == target and len(ings) == 2
    made = {st["item"]: st["total"] for st in task.data["gold_plan"] if st["item"] in ings}  # 4 of each
    leaf = {(i,): [cell(_crafts(task, {i}) + "\nfinish('made')")] for i in ings}
    final = _crafts(task, {target}) + "\nfinish('done')"
    gather = "await asyncio.gather(" + ", ".join(f"launch_subagent({{{i!r}: {c}}}, 2)" for i, c in ings.items()) + ")"
    split = await _grow(task, _scripts([cell(f"{gather}\n{final}")], leaf), "split")
    middle = {tuple(sorted(ings)): [cell(f"{gather}\nfinish('both made')")]}
    deep = await _grow(task, _scripts([cell(f"await launch_subagent({ings!r}, 2)\n{final}")], {**leaf, **middle}),
                       "deep", max_depth=2)
    direct = await _grow(task, _direct_policy(task), "direct")

    for t in (split, deep):
        assert all(n.success == 1.0 and n.no_bonus is None for n in t.nodes), t.tree_id
    assert [n.env_info["made_counts"] for n in split.nodes if n.depth == 1] == [{i: made[i]} for i in ings]
    assert node_rewards(split, CAP, bonus="useful")[split.root_id] == pytest.approx(1.4)
    mid = next(n for n in deep.nodes if n.depth == 1)
    assert len(deep.nodes) == 4 and mid.env_info["made_counts"] == made
    rd = node_rewards(deep, CAP, bonus="useful")
    assert rd[deep.root_id] == pytest.approx(1.4) and rd[mid.node_id] == pytest.approx(1.4)
    adv = _root_advantages([direct, split])
    assert adv == pytest.approx({"direct": -0.4, "split": 0.4})


@needs_tokenizer
async def test_a_child_forwarding_the_whole_goal_earns_the_root_nothing():
    """The child is given all of the root's targets and crafts them (s = 1: it did the work), but it
    forwards its parent's goal (``bonus_exclusion``, recorded at launch): the root, s = 1 since its tree
    solved the task, earns no bonus, R 1.0 as solving directly (Eq. 1 as written would pay it 1.4)."""
    task = PADDING_TASK
    targets = task.data["targets"]
    child = [cell(_crafts(task) + "\nfinish('all made')")]
    fwd = await _grow(task, _scripts([cell(f"await launch_subagent({targets!r}, 2)\nfinish('done')")],
                                     {tuple(sorted(targets)): child}), "forward")
    direct = await _grow(task, _direct_policy(task), "direct")
    (k,) = [n for n in fwd.nodes if n.depth == 1]
    assert k.success == 1.0 and k.no_bonus == "forwards its parent's goal (all of its targets)"
    assert fwd.root.success == 1.0 and fwd.root.env_info["made_counts"] == _plan_totals(task) == k.env_info[
        "made_counts"]
    assert node_rewards(fwd, CAP, bonus="useful")[fwd.root_id] == 1.0
    assert node_rewards(fwd, CAP, bonus="eq1")[fwd.root_id] == pytest.approx(1.4)
    assert _root_advantages([direct, fwd]) == {"direct": 0.0, "forward": 0.0}
