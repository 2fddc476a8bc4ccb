"""Evaluation: Wilson intervals, summaries, regressions, and scripted policies through the real runtime."""

from __future__ import annotations

import math
import shutil

import pytest
from rich.console import Console

from rao_core.envs import get_env
from rao_core.envs.base import Task
from rao_core.evaluation import (EvalConfig, EvalReport, EvalRow, compare, eval_tasks, evaluate_policy,
                                 evaluate_suite, mode_runtime, render_report, run_evaluation, summarise,
                                 wilson_interval)
from rao_core.paths import tiny_model_path
from rao_core.policies.scripted import ReplayPolicy, cell
from rao_core.policies.textcraft_expert import TextCraftExpert
from rao_core.runtime import RuntimeConfig
from rao_core.tree import EndReason, ExecutionTree, Node

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
needs_tok = pytest.mark.skipif(not (tiny_model_path() / "tokenizer_config.json").exists(),
                               reason="tiny model tokenizer not prepared (make setup)")


# -- Wilson interval: values computed by hand from the formula (z = 1.959964) -------------------------------
@pytest.mark.parametrize("k,n,lo,hi", [
    (7, 10, 0.396778, 0.892209),   # p=.7: (.892073 -/+ .342874) / 1.384146
    (0, 10, 0.0, 0.277533),        # p=0: hi = (z^2/2n + z^2/2n) / (1 + z^2/n) = .384146/1.384146
    (10, 10, 0.722467, 1.0),       # symmetric to 0/10
    (1, 2, 0.094531, 0.905469),    # p=.5, n=2: (1.460365 -/+ 1.184265) / 2.920729
])
def test_wilson_interval_hand_computed(k, n, lo, hi):
    a, b = wilson_interval(k, n)
    assert a == pytest.approx(lo, abs=2e-6)
    assert b == pytest.approx(hi, abs=2e-6)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="outside"):
        wilson_interval(3, 2)
    lo, hi = wilson_interval(2.5, 5)  # graded: fractional successes allowed
    assert lo < 0.5 < hi and math.isclose(lo + hi, 1.0, abs_tol=1e-9)


# -- summaries from hand-made trees ------------------------------------------------------------------------
def _tree(i: int, success: float | None, children: int = 0, depth2: bool = False) -> ExecutionTree:
    root = Node(node_id="0", goal="g", end_reason=EndReason.FINISHED, verifier=success,
                token_ids=[1, 2, 3, 4], assistant_mask=[0, 0, 1, 1], behaviour_logprobs=[0.0] * 4)
    nodes = [root]
    for c in range(children):
        nodes.append(Node(node_id=f"0.{c}", parent_id="0", depth=1, goal="c", end_reason=EndReason.FINISHED,
                          token_ids=[1, 2, 3], assistant_mask=[0, 1, 1], behaviour_logprobs=[0.0] * 3))
        root.children.append(f"0.{c}")
    if depth2 and children:
        nodes.append(Node(node_id="0.0.0", parent_id="0.0", depth=2, goal="d", end_reason=EndReason.MAX_STEPS))
    return ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id=f"k{i}", root_id="0", nodes=nodes,
                         wall_s=2.0)


def test_summarise_counts_successes_depth_delegation_tokens():
    trees = [_tree(0, 1.0, children=2, depth2=True), _tree(1, 0.0), _tree(2, 1.0, children=1), _tree(3, None)]
    r = summarise(trees, mode="recursive", difficulty="medium", wall_s=5.0)
    assert (r.n, r.unscored, r.successes) == (4, 1, 2.0)
    assert r.success == pytest.approx(2 / 3)
    assert (r.ci_low, r.ci_high) == pytest.approx(wilson_interval(2, 3))
    assert r.mean_depth == pytest.approx((2 + 0 + 1 + 0) / 4)
    assert r.delegation_rate == pytest.approx(0.5)
    assert r.mean_nodes == pytest.approx((4 + 1 + 2 + 1) / 4)
    assert r.mean_tokens == pytest.approx((2 + 2 + 2 + 2 + 2 + 2 + 2) / 4)  # 2 per root, 2 per child
    assert r.wall_s == 5.0 and r.end_reasons == {"finished": 4}


def test_summarise_graded_uses_mean_value():
    trees = [_tree(0, 0.5), _tree(1, 0.25), _tree(2, 1.0)]
    binary = summarise(trees, mode="single", difficulty="all", graded=False)
    graded = summarise(trees, mode="single", difficulty="all")  # graded is the default
    assert binary.success == pytest.approx(1 / 3) and binary.successes == 1.0
    assert graded.success == pytest.approx(1.75 / 3) and graded.mean_score == pytest.approx(1.75 / 3)
    assert graded.successes == pytest.approx(1.75)
    assert (graded.ci_low, graded.ci_high) == pytest.approx(wilson_interval(1.75, 3))


def test_graded_equals_fraction_solved_for_binary_verifiers():
    trees = [_tree(0, 1.0), _tree(1, 0.0), _tree(2, 1.0), _tree(3, 0.0), _tree(4, 0.0)]
    assert summarise(trees, mode="recursive", difficulty="x") == summarise(trees, mode="recursive",
                                                                           difficulty="x", graded=False)


def test_depth1_success_parallel_share_and_tokens_per_success():
    """The delegation columns of an evaluation row: depth-1 nodes' success, the share of them that
    ran beside a sibling, generated tokens per solved root."""
    from rao_core.metrics import overlapping_children, parallel_share

    trees = [_tree(0, 1.0, children=3), _tree(1, 0.0, children=2), _tree(2, 0.0)]
    for t, verdicts in zip(trees, ([1.0, 1.0, 0.0], [0.0, None])):
        for n, v in zip(t.nodes[1:], verdicts):
            n.verifier = v
    a, b, c = trees[0].nodes[1:]
    a.timings.started_at, a.timings.wall_s = 0.0, 5.0  # a and b overlap, c runs after both
    b.timings.started_at, b.timings.wall_s = 1.0, 3.0
    c.timings.started_at, c.timings.wall_s = 6.0, 1.0
    for i, n in enumerate(trees[1].nodes[1:]):  # one after the other
        n.timings.started_at, n.timings.wall_s = 10.0 * i, 1.0
    assert overlapping_children(trees[0], "0") == (2, 3)
    assert overlapping_children(trees[1], "0") == (0, 2)
    assert parallel_share(trees) == pytest.approx(2 / 5)
    r = summarise(trees, mode="recursive", difficulty="tier1x3")
    assert r.child_nodes == 5
    assert r.child_success == pytest.approx(1 / 2)  # 1, 1, 0, 0 over the 4 scored children
    assert r.tokens_per_success == pytest.approx((2 + 3 * 2 + 2 + 2 * 2 + 2) / 1)
    assert summarise([_tree(0, 0.0)], mode="single", difficulty="x").tokens_per_success is None
    m = EvalReport(rows=[r]).metrics()
    assert m["eval/recursive/tier1x3/child_success"] == pytest.approx(0.5)
    assert m["eval/recursive/tier1x3/parallel_share"] == pytest.approx(0.4)


def test_row_summary_is_the_eval_json():
    trees = [_tree(0, 1.0, children=1), _tree(1, 0.0), _tree(2, None), _tree(3, 1.0)]
    s = summarise(trees, mode="recursive", difficulty="all").summary()
    assert list(s) == ["n", "successes", "success", "ci95", "mean_depth", "delegation_rate", "child_success",
                       "tree_wall_s", "tokens_per_success"]
    lo, hi = wilson_interval(2, 3)
    assert s == {"n": 3, "successes": 2, "success": round(2 / 3, 6), "ci95": [round(lo, 6), round(hi, 6)],
                 "mean_depth": 0.25, "delegation_rate": 0.25, "child_success": None, "tree_wall_s": 2.0,
                 "tokens_per_success": 5.0}  # an unscored child; 10 generated tokens / 2 solved
    assert isinstance(s["successes"], int)  # whole counts print as integers
    graded = summarise([_tree(0, 0.75), _tree(1, 1.0)], mode="single", difficulty="all").summary()
    assert graded["successes"] == 1.75 and graded["n"] == 2


def _report(**succ: float) -> EvalReport:
    return EvalReport(rows=[EvalRow(mode=k.split("_")[0], difficulty=k.split("_")[1], n=10, success=v)
                            for k, v in succ.items()])


def test_metrics_names_and_compare_regressions():
    rep = _report(recursive_easy=0.9, recursive_medium=0.4, single_medium=0.2)
    m = rep.metrics()
    for k in ("eval/recursive/easy/success", "eval/recursive/easy/success_ci_low",
              "eval/recursive/easy/success_ci_high", "eval/recursive/easy/depth",
              "eval/recursive/easy/delegation_rate", "eval/single/medium/success"):
        assert k in m
    champ = {"eval/recursive/easy/success": 0.92, "eval/recursive/medium/success": 0.6,
             "eval/single/medium/success": 0.25, "eval/recursive/hard/success": 0.9}
    regs = compare(rep, champ, tolerance=0.05)
    assert regs == ["eval/recursive/medium/success: 0.400 < champion 0.600 - tolerance 0.050"]
    assert compare(rep, champ, tolerance=0.25) == []
    assert len(compare(m, champ, tolerance=0.0)) == 3  # dict input; exact drops count at tolerance 0
    with pytest.raises(ValueError):
        compare(rep, champ, tolerance=-1)


def test_eval_config_validation():
    with pytest.raises(ValueError):
        EvalConfig(modes=["recursive", "recursive"])
    with pytest.raises(ValueError):
        EvalConfig(modes=["both"])
    with pytest.raises(ValueError):
        EvalConfig(n=3)  # the count is n_tasks everywhere; unknown fields are rejected
    with pytest.raises(ValueError):
        EvalConfig(n_tasks=0)
    rc = RuntimeConfig(context_window=2048, max_new_tokens=256, delegation=False)
    assert mode_runtime(rc, "single").delegation is False and mode_runtime(rc, "recursive").delegation is True
    assert mode_runtime(rc, "single").context_window == 2048 == mode_runtime(rc, "recursive").context_window
    with pytest.raises(ValueError, match="mode"):
        mode_runtime(rc, "both")


def test_campaign_eval_section_is_the_eval_config():
    from rao_core.config import EvalSettings, load_config

    assert issubclass(EvalSettings, EvalConfig)
    cfg = load_config(None, {"eval.n_tasks": 3, "eval.graded": False})
    assert cfg.eval.n_tasks == 3 and cfg.eval.graded is False and cfg.eval.split == "validation"
    assert EvalSettings().model_dump(include=set(EvalConfig.model_fields)) == EvalConfig().model_dump()


def test_eval_tasks_are_validation_per_difficulty():
    env = get_env("textcraft-synth")
    tasks = eval_tasks(env, EvalConfig(difficulties=["easy", "medium"], n_tasks=3, seed=4))
    assert [t.difficulty for t in tasks] == ["easy"] * 3 + ["medium"] * 3
    assert all(t.split == "validation" for t in tasks)
    again = eval_tasks(env, EvalConfig(difficulties=["easy", "medium"], n_tasks=3, seed=4))
    assert [t.task_id for t in tasks] == [t.task_id for t in again]
    # a difficulty's tasks do not depend on which other difficulties are listed, nor on their order
    medium = eval_tasks(env, EvalConfig(difficulties=["medium"], n_tasks=3, seed=4))
    swapped = eval_tasks(env, EvalConfig(difficulties=["medium", "easy"], n_tasks=3, seed=4))
    assert [t.task_id for t in medium] == [t.task_id for t in tasks[3:]] == [t.task_id for t in swapped[:3]]
    other = eval_tasks(env, EvalConfig(difficulties=["easy"], n_tasks=3, seed=5))
    assert [t.task_id for t in other] != [t.task_id for t in tasks[:3]]


# -- scripted policies through the real runtime -----------------------------------------------------------
@needs_tok
async def test_expert_succeeds_and_immediate_finish_fails():
    env = get_env("textcraft-synth")
    tasks = eval_tasks(env, EvalConfig(difficulties=["easy", "medium"], n_tasks=2, seed=11))
    cfg = RuntimeConfig(sandbox=SANDBOX, context_window=4096, max_new_tokens=768)
    good = await evaluate_policy(env, tasks, TextCraftExpert(seed=0), cfg, tokenizer=tiny_model_path(),
                                 mode="recursive")
    assert [r.difficulty for r in good.rows] == ["easy", "medium"]
    assert all(r.success == 1.0 and r.n == 2 for r in good.rows)
    assert good.row("recursive", "medium").delegation_rate > 0  # the expert delegates medium tasks
    assert good.row("recursive", "medium").mean_depth >= 1
    quitter = ReplayPolicy(default=[cell("finish('done')")])
    bad = await evaluate_policy(env, tasks, quitter, cfg, tokenizer=tiny_model_path(), mode="recursive")
    assert all(r.success == 0.0 and r.successes == 0 for r in bad.rows)
    assert all(r.delegation_rate == 0 and r.mean_nodes == 1 and r.end_reasons == {"finished": 2} for r in bad.rows)
    assert bad.row("recursive", "easy").ci_high == pytest.approx(wilson_interval(0, 2)[1])
    assert compare(bad, good.metrics(), tolerance=0.1) == [
        "eval/recursive/easy/success: 0.000 < champion 1.000 - tolerance 0.100",
        "eval/recursive/medium/success: 0.000 < champion 1.000 - tolerance 0.100"]


@needs_tok
async def test_suite_runs_both_modes_single_has_no_children():
    env = get_env("textcraft-synth")
    cfg = EvalConfig(difficulties=["easy", "medium"], n_tasks=1, seed=3, modes=["recursive", "single"])
    rc = RuntimeConfig(sandbox=SANDBOX, context_window=4096, max_new_tokens=768)
    rep = await evaluate_suite(cfg, env=env, runtime=rc, tokenizer=tiny_model_path(),
                               policy=TextCraftExpert(seed=0, max_depth=0))
    assert [(r.mode, r.difficulty) for r in rep.rows] == [(m, d) for m in ("recursive", "single")
                                                          for d in ("easy", "medium")]
    single = [t for t in rep.trees if t.meta["eval_mode"] == "single"]
    assert single and all(len(t.nodes) == 1 and t.meta["delegation"] is False for t in single)
    pooled = rep.pooled("single")
    assert (pooled.difficulty, pooled.n, pooled.delegation_rate, pooled.success) == ("all", 2, 0.0, 1.0)
    console = Console(record=True, width=160)
    render_report(rep, console=console)
    text = console.export_text()
    assert "recursive" in text and "single" in text and "95% CI" in text


async def test_suite_needs_policy_or_url():
    with pytest.raises(ValueError, match="base_url"):
        await evaluate_suite(EvalConfig(n_tasks=1, difficulties=["easy"]), env="textcraft-synth",
                             runtime=RuntimeConfig(), tokenizer=None)


# -- graded environments: Oolong's partial credit 0.75^|delta| is kept ---------------------------------------
def oolong_tasks(answers: list[str]) -> list[Task]:
    """Hand-made Oolong tasks (tiny transcripts) whose gold answers are ``answers``."""
    return [Task(task_id=f"o{i}", env="oolong", split="validation", difficulty="singledoc_rolls",
                 data={"context": f"Ada: {10 + i} for perception.", "question": f"Question {i}: how many rolls?",
                       "answer": a}) for i, a in enumerate(answers)]


def answering(replies: dict[str, str]) -> ReplayPolicy:
    """A policy that finishes at once with ``\\boxed{reply}``, the reply chosen by a substring of the goal."""
    return ReplayPolicy(by_goal={k: [cell(f"finish({chr(92) + 'boxed{' + v + '}'!r})")] for k, v in replies.items()})


@needs_tok
def test_oolong_partial_credit_is_kept():
    # gold 4, 10, 7; answers 4, 11, 9 -> 1, 0.75^1, 0.75^2 (Oolong's integer rule)
    tasks = oolong_tasks(["4", "10", "7"])
    policy = answering({"Question 0": "4", "Question 1": "11", "Question 2": "9"})
    rc = RuntimeConfig(sandbox=SANDBOX, context_window=2048, max_new_tokens=128)
    rep = run_evaluation(EvalConfig(), env="oolong", tasks=tasks, runtime=rc, tokenizer=tiny_model_path(),
                         policy=policy)
    row = rep.row("recursive", "singledoc_rolls")
    assert row.successes == pytest.approx(1 + 0.75 + 0.5625) and row.success == pytest.approx(2.3125 / 3)
    exact = run_evaluation(EvalConfig(graded=False), env="oolong", tasks=tasks, runtime=rc,
                           tokenizer=tiny_model_path(), policy=policy)
    assert exact.row("recursive", "singledoc_rolls").success == pytest.approx(1 / 3)


@needs_tok
async def test_seeded_evaluation_gives_each_tree_its_task_seed_and_every_request_its_own():
    """With ``seeded`` the nightly's two evaluations of the same tasks ask for the same
    per-request seeds (the policy decides whether to send them); without it, as in ``rao eval``, none."""
    from rao_core.runtime.agent import request_seed
    from rao_core.task_sampling import eval_tree_seed

    class Recording(ReplayPolicy):
        def __init__(self):
            super().__init__(default=[cell("x = 1"), cell("finish('done')")])
            self.seen: list[tuple[str, int, int | None]] = []

        async def generate(self, request):
            self.seen.append((request.node.node_id, len(request.node.turns), request.seed))
            return await super().generate(request)

    env = get_env("textcraft-synth")
    cfg = EvalConfig(difficulties=["easy"], n_tasks=3, seed=21, modes=["recursive", "single"])
    rc = RuntimeConfig(sandbox=SANDBOX, context_window=4096, max_new_tokens=64)
    runs = []
    for seeded in (True, True, False):
        pol = Recording()
        rep = await evaluate_suite(cfg, env=env, runtime=rc, tokenizer=tiny_model_path(), policy=pol, seeded=seeded)
        runs.append((rep, sorted(pol.seen)))
    (a, seen_a), (b, seen_b), (off, seen_off) = runs
    want = {(t.meta["eval_mode"], t.group_id): eval_tree_seed(21, t.meta["eval_mode"], t.group_id) for t in a.trees}
    assert [t.seed for t in a.trees] == [want[(t.meta["eval_mode"], t.group_id)] for t in a.trees]
    assert len(set(want.values())) == 6  # 3 tasks x 2 modes, all different
    assert {s for _, _, s in seen_a} == {request_seed(t.seed, t.root.node_id, k) for t in a.trees for k in (0, 1)}
    assert seen_a == seen_b and len(seen_a) == 12 and all(s is not None for _, _, s in seen_a)  # 6 trees x 2 turns
    assert len({s for _, _, s in seen_a}) == 12
    assert all(t.seed is None for t in off.trees) and all(s is None for _, _, s in seen_off)
    assert eval_tree_seed(21, "recursive", "t0") != eval_tree_seed(22, "recursive", "t0")
