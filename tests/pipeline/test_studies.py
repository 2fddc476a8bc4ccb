"""The checkpoint studies of research/studies.py (generalisation, wall-clock).

`rao experiment textcraft-generalisation` / `textcraft-wallclock`: pure parts by hand-made points; the planning's
errors through the command line before any server starts; both studies end to end with the scripted TextCraft
expert in place of a served checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.cli import one_error_line, run_cli
from rao_core.paths import REPO_ROOT, tiny_model_path
from research.studies import (generalisation_markdown, generalisation_png, generalisation_table, last_checkpoints,
                              plan_generalisation, plan_text, plan_wallclock, run_study, study_name, study_point, tree_limit, trees_at_once,
                              wallclock_markdown, wallclock_pairs, wallclock_ratios, wallclock_table)

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
TINY = tiny_model_path()  # resolved before any test moves RAO_HOME
needs_tok = pytest.mark.skipif(not (TINY / "tokenizer_config.json").exists(),
                               reason="tiny model tokenizer not prepared (make setup)")
CONFIG = "configs/experiment-textcraft-ablation.yaml"


# -- pure functions -------------------------------------------------------------------------------------------
def test_trees_at_once_keeps_the_nodes_at_once_about_constant():
    # 16 trees of K = 2 are 16 x 3 = 48 nodes: 48 // 4 = 12, 48 // 5 = 9, 48 // 6 = 8, 48 // 7 = 6
    assert [trees_at_once(k, 16) for k in (2, 3, 4, 5, 6)] == [16, 12, 9, 8, 6]
    assert trees_at_once(12, 1) == 1  # never 0


def test_the_tree_limit_grows_with_the_nodes_of_a_tree():
    assert [tree_limit(k, 300.0) for k in (2, 3, 4, 5)] == [300.0, 400.0, 500.0, 600.0]
    assert tree_limit(5, None) is None


def test_study_name_follows_the_source_records_seed():
    assert study_name("textcraft-generalisation", {"experiment": "textcraft-ablation"}) == "textcraft-generalisation"
    assert study_name("textcraft-generalisation", {"experiment": "textcraft-ablation-seed2"}) == \
        "textcraft-generalisation-seed2"
    assert study_name("x", {}) == "x"


def test_last_checkpoints_take_each_arms_last_iteration_in_its_own_mode():
    rec = {"points": [
        {"arm": "recursive", "iteration": 0, "mode": "recursive", "checkpoint": "r0"},
        {"arm": "recursive", "iteration": 2, "mode": "recursive", "checkpoint": "r2"},
        {"arm": "recursive", "iteration": 3, "mode": "single", "checkpoint": "r3-single-mode"},  # another mode
        {"arm": "single", "iteration": 1, "mode": "single", "checkpoint": "s1"},
        {"arm": "single", "iteration": 2, "mode": "single", "checkpoint": None}]}  # no folder recorded
    assert last_checkpoints(rec) == {"recursive": ("r2", 2), "single": ("s1", 1)}


def _gen_point(arm, k, n, succ, lo, hi, misses, **kw):
    return {"arm": arm, "k": k, "mode": "single" if arm == "single" else "recursive", "n": n, "unscored": 0,
            "successes": succ, "success": succ / n, "ci95": [lo, hi], "misses": misses, **kw}


def test_generalisation_table_by_hand():
    points = [_gen_point("recursive", 2, 100, 56, 0.4623, 0.6532, {"child_failed": 30, "window": 11, "limit": 3},
                         delegation_rate=0.96, child_success=0.692, tokens_per_tree=1292.4, tree_wall_s_median=95.04),
              _gen_point("single", 3, 100, 0, 0.0, 0.037, {"window": 97, "other": 3}, delegation_rate=0.0,
                         child_success=None, tokens_per_tree=601.0, tree_wall_s_median=50.0)]
    lines = generalisation_table(points).splitlines()
    # 'other' gets a column because one point has it; missed = sum of the causes (30 + 11 + 3 = 44; 97 + 3)
    assert lines[0] == ("| arm | K | n | success | 95% CI | delegation rate | depth-1 success | tokens per tree | "
                        "tree wall median (s) | missed | child given 2+ targets | children failed | root's window | "
                        "limit | error | root finished wrong | other |")
    assert lines[2] == "| recursive | 2 | 100 | 0.56 | [0.46, 0.65] | 0.96 | 0.69 | 1292 | 95.0 | 44 | 0 | 30 | 11 | 3 | 0 | 0 | 0 |"
    assert lines[3] == "| single | 3 | 100 | 0.00 | [0.00, 0.04] | 0.00 |  | 601 | 50.0 | 100 | 0 | 0 | 97 | 0 | 0 | 0 | 3 |"
    assert "other" not in generalisation_table(points[:1]).splitlines()[0]  # no 'other' anywhere: no column


def _wall_point(setting, k, median, **kw):
    return {"setting": setting, "k": k, "n": 30, "unscored": 0, "successes": 15, "success": 0.5,
            "ci95": [0.3315, 0.6685], "tree_wall_s_median": median, **kw}


def test_wallclock_ratios_and_table_by_hand():
    points = [_wall_point("gather", 2, 20.0, tree_wall_s=22.0, tokens_per_tree=1200.4, parallel_share=0.9,
                          children_per_tree={"2": 27, "3": 3}, context_window=1536),
              _wall_point("sequential", 2, 30.0), _wall_point("gather", 6, 40.0), _wall_point("sequential", 6, 100.0),
              _wall_point("single", 2, 15.0, context_window=4096)]  # the study's order: single last
    r = wallclock_ratios(points)
    # K = 2: 30 / 20 = 1.5, 15 / 20 = 0.75; K = 6: 100 / 40 = 2.5, no single point
    assert r == [{"k": 2, "gather": 20.0, "sequential": 30.0, "single": 15.0, "sequential_over_gather": 1.5,
                  "single_over_gather": 0.75},
                 {"k": 6, "gather": 40.0, "sequential": 100.0, "single": None, "sequential_over_gather": 2.5,
                  "single_over_gather": None}]
    assert wallclock_ratios([_wall_point("gather", 2, 0.0), _wall_point("sequential", 2, 3.0)])[0][
        "sequential_over_gather"] is None  # a zero median divides nothing
    lines = wallclock_table(points).splitlines()
    # children per tree: (2 x 27 + 3 x 3) / 30 = 2.1
    assert lines[2] == "| 2 | gather | 30 | 0.50 | [0.33, 0.67] | 20.0 | 22.0 | 1200 | 2.10 | 0.90 | 1536 |"
    assert lines[3] == "| 2 | sequential | 30 | 0.50 | [0.33, 0.67] | 30.0 |  |  |  |  |  |"
    assert [ln.split(" | ")[:2] for ln in lines[4:7]] == [["| 2", "single"], ["| 6", "gather"], ["| 6", "sequential"]]
    assert lines[-2:] == ["| 2 | 20.0 / 30.0 / 15.0 | 1.50x | 0.75x |", "| 6 | 40.0 / 100.0 / - | 2.50x | - |"]


def test_wallclock_pairs_compare_each_task_with_its_gather_tree():
    from scipy import stats

    g = {"a": 10.0, "b": 20.0, "c": 40.0, "d": 5.0}
    seq = {"a": 15.0, "b": 30.0, "c": 20.0, "e": 99.0}  # e: not evaluated under gather, d: not under sequential
    points = [_wall_point("gather", 2, 15.0, per_task_wall_s=g), _wall_point("sequential", 2, 20.0, per_task_wall_s=seq),
              _wall_point("single", 2, 9.0, per_task_wall_s={"a": 10.0}),
              _wall_point("gather", 4, 1.0), _wall_point("sequential", 4, 2.0)]  # no per-task times: no row
    rows = wallclock_pairs(points)
    # a, b, c paired: ratios 1.5, 1.5, 0.5 -> median 1.5; gather faster on a and b
    p = round(float(stats.wilcoxon([5.0, 10.0, -20.0]).pvalue), 6)
    assert rows == [{"k": 2, "setting": "sequential", "pairs": 3, "ratio_median": 1.5, "ratio_min": 0.5,
                     "ratio_max": 1.5, "gather_faster": 2, "p": p},
                    {"k": 2, "setting": "single", "pairs": 1, "ratio_median": 1.0, "ratio_min": 1.0, "ratio_max": 1.0,
                     "gather_faster": 0, "p": None}]  # one pair: no test
    lines = wallclock_table(points).splitlines()
    assert lines[-3] == "|---|---|---|---|---|---|"
    assert lines[-2] == f"| 2 | sequential | 3 | 1.50x [0.50, 1.50] | 2 of 3 | {p:.2g} |"
    assert lines[-1] == "| 2 | single | 1 | 1.00x [1.00, 1.00] | 0 of 1 | - |"
    assert "task by task" not in wallclock_table(points[3:])  # no per-task times anywhere: no second table


def test_study_point_keeps_the_row_and_per_task_times():
    from rao_core.evaluation import summarise
    from rao_core.tree import EndReason, ExecutionTree, Node

    trees = [ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id=f"task-{i}", root_id="0", wall_s=w,
                           nodes=[Node(node_id="0", goal="g", verifier=v, end_reason=e, token_ids=[1, 2, 3],
                                       assistant_mask=[0, 1, 1])])
             for i, (v, w, e) in enumerate([(1.0, 10.123, EndReason.FINISHED), (0.0, 30.0, EndReason.CONTEXT_OVERFLOW),
                                            (0.0, 20.0, EndReason.FINISHED)])]
    row = summarise(trees, mode="recursive", difficulty="tier1x3")
    p = study_point(row, trees, arm="recursive", k=3)
    assert (p["arm"], p["k"], p["difficulty"], p["n"], p["successes"]) == ("recursive", 3, "tier1x3", 3, 1.0)
    assert p["ci95"] == [round(row.ci_low, 4), round(row.ci_high, 4)] and isinstance(p["ci95"], list)
    assert p["tree_wall_s_median"] == 20.0 and p["tree_wall_s"] == round((10.123 + 30 + 20) / 3, 2)
    assert p["misses"] == {"window": 1, "finished_wrong": 1} and p["per_task"] == {"task-0": 1, "task-1": 0, "task-2": 0}
    assert p["per_task_wall_s"] == {"task-0": 10.12, "task-1": 30.0, "task-2": 20.0}
    assert p["per_task_tokens"] == {"task-0": 2, "task-1": 2, "task-2": 2} and "trees" not in p


def test_markdown_and_plot_from_a_record(tmp_path):
    rec = {"experiment": "textcraft-generalisation-seed1", "command": "rao experiment textcraft-generalisation",
           "commit": "abc1234", "date": "2026-12-05", "wall_s": 600.0, "checkpoints": {"recursive": "r2"},
           "source_record": "docs/results/textcraft-ablation-seed1.json", "seed": 1, "n_tasks": 100,
           "eval_seed": 20261203, "split": "validation", "task_sets": {"training (seed 1)": 200},
           "points": [_gen_point("recursive", 2, 100, 56, 0.46, 0.65, {"window": 44}),
                      _gen_point("recursive", 3, 100, 20, 0.13, 0.29, {"child_failed": 80})]}
    md = generalisation_markdown(rec, img="img/x.png")
    assert md.startswith("## Generalisation: `textcraft-generalisation-seed1`\n")
    assert "wall time 10.0 min" in md and "![success vs K" in md and "| recursive | 3 | 100 | 0.20 |" in md
    assert "Incomplete" not in md and "Incomplete" in generalisation_markdown({**rec, "complete": False})
    png = generalisation_png(rec["points"], tmp_path / "g.png")
    assert png.stat().st_size > 1000
    wall = {**rec, "experiment": "textcraft-wallclock", "tree_timeout_s": 1800.0,
            "points": [_wall_point("gather", 2, 20.0), _wall_point("sequential", 2, 50.0)]}
    md = wallclock_markdown(wall)
    assert md.startswith("## Wall-clock, one tree at a time: `textcraft-wallclock`\n")
    assert "| 2 | 20.0 / 50.0 / - | 2.50x | - |" in md
    # a seed's study has its own section: no title is a prefix of another (replace_section finds its own)
    assert wallclock_markdown({**wall, "experiment": "textcraft-wallclock-seed1"}).startswith(
        "## Wall-clock, one tree at a time: `textcraft-wallclock-seed1`\n")


# -- planning: one clear error before any server -----------------------------------------------------------
def _record(tmp_path: Path, name: str = "textcraft-ablation", arms=("recursive", "single"), seed: int = 0) -> Path:
    """A small experiment record: the ablation's config as run, each arm's iterations 0 and 2 with checkpoint
    folders (the tiny model; the single arm's through a link, so the two are served separately)."""
    from rao_core.config import load_config

    cfg = load_config(REPO_ROOT / CONFIG, [f"seed={seed}"], check_paths=False)
    (tmp_path / "single-ckpt").symlink_to(TINY, target_is_directory=True)
    ckpt = {"recursive": str(TINY), "outcome": str(TINY), "single": str(tmp_path / "single-ckpt")}
    points = [{"arm": a, "iteration": i, "difficulty": "tier1x2", "mode": "single" if a == "single" else "recursive",
               "n": 100, "successes": 40, "success": 0.4, "checkpoint": ckpt[a] if i == 2 else str(tmp_path / "old")}
              for a in arms for i in (0, 2)]
    rec = {"experiment": name, "config": CONFIG, "seed": seed, "config_values": cfg.model_dump(mode="json"),
           "single_max_steps": 42, "points": points}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(rec))
    return path


@pytest.mark.parametrize("args,needle", [
    (["--arm", "both"], "unknown arm 'both' (expected one of recursive, outcome, single)"),
    (["--arm", "single", "--arm", "single"], "--arm: arm repeated in ['single', 'single']"),
    (["--model", "best=/x"], "unknown arm 'best' (expected one of recursive, outcome, single)"),
    (["--arm", "outcome"], "has no checkpoint of arm 'outcome'; pass --model outcome=PATH"),
    (["--model", "single=/no/such/folder"], "checkpoint folder of arm single not found: /no/such/folder has no config.json"),
    (["--model", "single=/h/campaigns/abl-single/checkpoints/iter-2"], "/h/campaigns/abl-single/checkpoints/iter-2 has no "
     "config.json; a campaign's checkpoint removed locally comes back from S3 with `RAO_HOME=/h rao campaigns fetch "
     "abl-single --iteration 2 --weights-only`"),
    (["--model", "single"], "expected ARM=PATH"),
    (["--model", "outcome=/x"], "--model outcome=...: arm 'outcome' is not evaluated (add --arm outcome)"),
    (["--k", "1"], "no TextCraft-Synth shape tier1x<K> for K = [1]"),
    (["--k", "3", "--k", "3"], "K repeated in [3, 3]"),
    (["--set", "runtime.context_window=99999"], "runtime.context_window (99999) exceeds serving.max_model_len (1536)"),
])
def test_generalisation_input_errors_are_one_line_before_any_server(capsys, tmp_path, no_server, args, needle):
    rec = _record(tmp_path)
    code, out, err = run_cli(capsys, "experiment", "textcraft-generalisation", "--record", str(rec), *args)
    assert code == 2 and needle in one_error_line(err), err
    assert out == ""


def test_missing_record_and_wallclock_errors(capsys, tmp_path, no_server):
    code, _, err = run_cli(capsys, "experiment", "textcraft-generalisation", "--record", str(tmp_path / "none.json"))
    assert code == 2 and err.strip() == (f"error: record not found: {tmp_path / 'none.json'}; run `rao experiment "
                                         "textcraft-ablation` first, or name one with --record")
    (tmp_path / "bad.json").write_text("{not json")
    code, _, err = run_cli(capsys, "experiment", "textcraft-wallclock", "--record", str(tmp_path / "bad.json"))
    assert code == 2 and "bad.json: not a JSON record" in err and len(err.strip().splitlines()) == 1
    rec = _record(tmp_path, arms=("recursive",))
    for args, needle in ((["--setting", "fast"], "unknown setting 'fast'"),
                         (["--setting", "gather", "--setting", "gather"], "--setting: setting repeated in"),
                         (["--n", "0"], "Invalid value for '--n'"),
                         ([], "has no checkpoint of arm 'single'; pass --single-model PATH"),
                         (["--model", str(tmp_path)], "checkpoint folder of the recursive agent not found"),
                         (["--k", "13"], "K = [13]")):
        code, out, err = run_cli(capsys, "experiment", "textcraft-wallclock", "--record", str(rec), *args)
        assert code == 2 and err.startswith("error: ") and needle in err and len(err.strip().splitlines()) == 1, err


def test_dry_run_prints_the_plan_and_serves_nothing(capsys, tmp_path, no_server):
    rec = _record(tmp_path)
    code, out, err = run_cli(capsys, "experiment", "textcraft-wallclock", "--record", str(rec), "--dry-run",
                          "--k", "2", "--k", "6", "--n", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("textcraft-wallclock: record docs/results/textcraft-wallclock.json from ")
    assert "training (seed 0): 200" in lines[1] and "evaluation (eval.seed 20261203): 6" in lines[1]
    # the recursive checkpoint once (gather and sequential interleaved per K), then the single agent's at 4096
    assert lines[2] == f"serve {TINY} once (max_model_len 1536):"
    assert [ln.split(":")[0].strip() for ln in lines[3:7]] == [
        "gather, 3 tier1x2 tasks, one tree at a time", "sequential, 3 tier1x2 tasks, one tree at a time",
        "gather, 3 tier1x6 tasks, one tree at a time", "sequential, 3 tier1x6 tasks, one tree at a time"]
    assert "1 trees at once, sequential children on, tree limit 1800 s" in lines[4]
    assert lines[7] == f"serve {tmp_path / 'single-ckpt'} once (max_model_len 4096):"
    assert "window 4096, 42 steps per node" in lines[8]


def test_a_seeds_wallclock_study_has_its_own_record(tmp_path):
    """--record of a seed's ablation writes textcraft-wallclock-seed<S> (it wrote textcraft-wallclock, over seed 0's
    record and section, and deleted seed 0's stored trees)."""
    rec = _record(tmp_path, name="textcraft-ablation-seed1", seed=1)
    plan = plan_wallclock(record=str(rec), n=2, ks=[2], command="c")
    assert plan.name == "textcraft-wallclock-seed1" and plan.meta["experiment"] == "textcraft-wallclock-seed1"
    (tmp_path / "s0").mkdir()
    assert plan_wallclock(record=str(_record(tmp_path / "s0")), n=2, ks=[2], command="c").name == "textcraft-wallclock"


def test_the_generalisation_plan(tmp_path):
    rec = _record(tmp_path, name="textcraft-ablation-seed1", arms=("recursive", "outcome", "single"), seed=1)
    plan = plan_generalisation(record=str(rec), arms=["outcome", "single"], n=5, ks=[2, 4], command="c",
                               models={"outcome": str(TINY)})
    assert plan.name == "textcraft-generalisation-seed1" and plan.meta["seed"] == 1
    assert plan.meta["checkpoint_iterations"] == {"outcome": None, "single": 2}  # --model: iteration unknown
    assert [r.checkpoint for r in plan.runs] == [str(TINY), str(tmp_path / "single-ckpt")]
    out, single = plan.runs
    assert [j.config.difficulties for j in out.jobs] == [["tier1x2"], ["tier1x4"]]
    assert [j.config.modes for j in single.jobs] == [["single"], ["single"]]
    assert [j.runtime.max_concurrent_trees for j in out.jobs] == [16, 9]  # trees_at_once(16)
    base = out.jobs[0].runtime.tree_timeout_s
    assert [j.runtime.tree_timeout_s for j in out.jobs] == [base, base * 5 / 3]  # tree_limit: K = 2 as trained
    assert all(j.runtime.tree_timeout_s == base for j in single.jobs)  # one node per tree: the limit as trained
    assert [j.runtime.max_concurrent_trees for j in single.jobs] == [16, 16]  # one node per tree at any K
    assert single.jobs[0].runtime.max_steps_per_node == 42 and out.jobs[0].runtime.max_steps_per_node == 6
    assert out.jobs[0].config.seed == 20261203 and out.jobs[0].config.n_tasks == 5
    assert plan.meta["task_sets"]["training (seed 1)"] == 200  # checked against the record's own seed's pool


# -- end to end with a scripted policy ---------------------------------------------------------------------
def _expert(single_ckpt: str):
    from rao_core.policies.textcraft_expert import TextCraftExpert

    def policy_for(path: str):
        if path == single_ckpt:
            return TextCraftExpert(seed=0, max_depth=0, suboptimal_prob=0.0, child_steps=6)
        return TextCraftExpert(seed=0, max_depth=1, split_targets_min=2, parallel_prob=1.0, suboptimal_prob=0.0,
                               child_steps=6)
    return policy_for


@needs_tok
def test_generalisation_end_to_end_with_the_scripted_expert(tmp_path):
    rec = _record(tmp_path)
    plan = plan_generalisation(record=str(rec), n=2, ks=[2, 3], command="rao experiment textcraft-generalisation",
                               overrides=[f"runtime.sandbox={SANDBOX}"])
    said: list[str] = []
    out = run_study(plan, root=tmp_path, policy_for=_expert(str(tmp_path / "single-ckpt")), say=said.append)
    r = json.loads((tmp_path / "docs/results/textcraft-generalisation.json").read_text())
    assert r == out["record"] and r["complete"] is True and r["eval_seed"] == 20261203 and r["n_tasks"] == 2
    assert [(p["arm"], p["k"], p["mode"], p["difficulty"]) for p in r["points"]] == [
        ("recursive", 2, "recursive", "tier1x2"), ("recursive", 3, "recursive", "tier1x3"),
        ("single", 2, "single", "tier1x2"), ("single", 3, "single", "tier1x3")]
    by = {(p["arm"], p["k"]): p for p in r["points"]}
    # the expert with delegation launches one child per target and solves every task at 1536 tokens
    assert by["recursive", 2]["successes"] == 2 and by["recursive", 3]["successes"] == 2
    assert by["recursive", 3]["children_per_tree"] == {"3": 2} and by["recursive", 3]["misses"] == {}
    # alone, the expert fits two targets in the window, not three: every K = 3 miss is the root's window
    assert by["single", 2]["successes"] == 2 and by["single", 3]["successes"] == 0
    assert by["single", 3]["misses"] == {"window": 2} and by["single", 3]["end_reasons"] == {"context_overflow": 2}
    assert all(len(p["per_task"]) == 2 and p["n"] == 2 and len(p["ci95"]) == 2 for p in r["points"])
    assert all((tmp_path / p["trees_file"]).exists() for p in r["points"])
    assert (tmp_path / "docs/img/textcraft-generalisation.png").exists()
    md = (tmp_path / "docs/results.md").read_text()
    assert "## Generalisation: `textcraft-generalisation`" in md
    assert "| single | 3 | 2 | 0.00 |" in md
    assert any(s.startswith("evaluating arm single, 2 tier1x3 tasks") for s in said)


@needs_tok
def test_wallclock_end_to_end_with_the_scripted_expert(tmp_path):
    rec = _record(tmp_path)
    plan = plan_wallclock(record=str(rec), n=2, ks=[2, 3], command="rao experiment textcraft-wallclock",
                          overrides=[f"runtime.sandbox={SANDBOX}"])
    run_study(plan, root=tmp_path, policy_for=_expert(str(tmp_path / "single-ckpt")), say=lambda m: None)
    r = json.loads((tmp_path / "docs/results/textcraft-wallclock.json").read_text())
    assert [(p["setting"], p["k"]) for p in r["points"]] == [("gather", 2), ("sequential", 2), ("gather", 3),
                                                             ("sequential", 3), ("single", 2), ("single", 3)]
    by = {(p["setting"], p["k"]): p for p in r["points"]}
    # the expert gathers its children; the runtime switch runs them one at a time, same trees otherwise
    assert by["gather", 3]["parallel_share"] > 0 and by["sequential", 3]["parallel_share"] == 0
    assert by["sequential", 3]["sequential_children"] is True and by["gather", 3]["sequential_children"] is False
    assert all(by[s, k]["successes"] == 2 for s in ("gather", "sequential") for k in (2, 3))
    # at a 4096-token window the single expert fits three targets
    assert by["single", 3]["context_window"] == 4096 and by["single", 3]["successes"] == 2
    assert by["single", 3]["depth_hist"] == {"0": 2}
    assert all(set(p["per_task_wall_s"]) == set(p["per_task"]) for p in r["points"])
    assert r["tree_timeout_s"] == 1800.0 and r["runtime"]["single"]["context_window"] == 4096
    # a root and all its children at the largest K find their REPLs started (gathering is not charged start-ups)
    assert all(j.runtime.repl_pool_size == 4 for run in plan.runs for j in run.jobs)
    md = (tmp_path / "docs/benchmarks.md").read_text()
    assert "## Wall-clock, one tree at a time: `textcraft-wallclock`" in md
    assert "| K | median tree wall" in md


# -- a study stopped midway: resumed, not redone; a dead server stops it --------------------------------------
@needs_tok
def test_an_interrupted_study_resumes_from_its_partial_record(tmp_path):
    rec = _record(tmp_path)
    plan = plan_generalisation(record=str(rec), n=2, ks=[2, 3], command="rao experiment textcraft-generalisation",
                               overrides=[f"runtime.sandbox={SANDBOX}"])
    policy_for = _expert(str(tmp_path / "single-ckpt"))
    run_study(plan, root=tmp_path, policy_for=policy_for, say=lambda m: None)
    path = tmp_path / "docs/results/textcraft-generalisation.json"
    full = json.loads(path.read_text())
    # as an interruption during the single arm's K = 3 leaves it: three points, complete false
    path.write_text(json.dumps({**full, "complete": False, "points": full["points"][:3], "wall_s": 100.0}))
    said: list[str] = []
    served: list[str] = []
    run_study(plan, root=tmp_path, policy_for=lambda p: served.append(p) or policy_for(p), say=said.append)
    r = json.loads(path.read_text())
    assert [s for s in said if s.startswith("evaluating")] == ["evaluating arm single, 2 tier1x3 tasks, mode single"]
    assert served == [str(tmp_path / "single-ckpt")]  # the recursive checkpoint: nothing left to do, not served
    assert r["complete"] is True and r["points"][:3] == full["points"][:3] and r["wall_s"] >= 100.0
    assert [(p["arm"], p["k"]) for p in r["points"]] == [("recursive", 2), ("recursive", 3), ("single", 2),
                                                         ("single", 3)]
    assert all((tmp_path / p["trees_file"]).exists() for p in r["points"])  # the resumed points keep their trees
    # a complete record, or one of another plan (here another n), is never resumed: every evaluation runs again
    said.clear()
    run_study(plan, root=tmp_path, policy_for=policy_for, say=said.append)
    assert len([s for s in said if s.startswith("evaluating")]) == 4
    path.write_text(json.dumps({**full, "complete": False, "points": full["points"][:3]}))
    other = plan_generalisation(record=str(rec), n=1, ks=[2, 3], command="rao experiment textcraft-generalisation --n 1",
                                overrides=[f"runtime.sandbox={SANDBOX}"])
    said.clear()
    run_study(other, root=tmp_path, policy_for=policy_for, say=said.append)
    assert len([s for s in said if s.startswith("evaluating")]) == 4
    assert all(p["n"] == 1 for p in json.loads(path.read_text())["points"])


@needs_tok
def test_a_dead_server_stops_the_study_and_records_no_point_from_it(tmp_path):
    from infra.process import ServiceError
    from rao_core.policies.base import Policy, PolicyError

    class Dead(Policy):
        async def generate(self, request):
            raise PolicyError("connection refused")

    rec = _record(tmp_path)
    plan = plan_wallclock(record=str(rec), n=2, ks=[2], settings=["gather", "sequential"], command="c",
                          overrides=[f"runtime.sandbox={SANDBOX}"])
    with pytest.raises(ServiceError, match=r"gather, 2 tier1x2 tasks.*2 of 2 trees ended by infrastructure failures"):
        run_study(plan, root=tmp_path, policy_for=lambda p: Dead(), say=lambda m: None)
    r = json.loads((tmp_path / "docs/results/textcraft-wallclock.json").read_text()) \
        if (tmp_path / "docs/results/textcraft-wallclock.json").exists() else {"points": []}
    assert r["points"] == []  # the failed evaluation's zeros are not measured points


@needs_tok
def test_a_job_without_tasks_evaluates_the_held_out_set_its_campaign_generates(tmp_path, monkeypatch):
    """serve_and_evaluate (behind rao eval and the studies) generates a job's tasks with the config's
    tasks.generator_options, as the campaign's held-out set was generated; a job's own tasks are kept."""
    import rao_core.evaluation as evaluation
    from rao_core.config import load_config
    from rao_core.envs import get_env
    from infra.checkpoint_eval import EvalJob, serve_and_evaluate

    cfg = load_config(REPO_ROOT / CONFIG, check_paths=False)
    cfg = cfg.model_copy(update={"tasks": cfg.tasks.model_copy(update={"generator_options": {"graph_seed": 7}})})
    env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
    ev = cfg.eval.model_copy(update={"difficulties": ["tier1"], "n_tasks": 3})
    given = evaluation.eval_tasks(env, ev)[:1]
    seen = []

    def fake_eval(config, **kw):  # each tree finished is reported: the first of the three solved
        seen.append(kw["tasks"])
        for d in (1, 2, 3):
            kw["progress"](d, 3, SimpleNamespace(root=SimpleNamespace(verifier=float(d == 1))))
        return evaluation.EvalReport.model_construct(rows=[], trees=[])

    monkeypatch.setattr(evaluation, "run_evaluation", fake_eval)

    class Closable:
        async def aclose(self):
            pass

    jobs = [EvalJob(label="a", config=ev, runtime=cfg.runtime), EvalJob(label="b", config=ev, runtime=cfg.runtime,
                                                                         tasks=given)]
    said: list[str] = []
    serve_and_evaluate(cfg, TINY, jobs, env=env, policy=Closable(), say=said.append)
    # a line per tree below 20 trees, the solved count from each job's (and mode's) first tree
    assert said == [line for job in "ab" for line in (f"evaluating {job}", *(f"  {job}: trees {d}/3, solved 1"
                                                                               for d in (1, 2, 3)))]
    want = evaluation.eval_tasks(env, ev, graph_seed=7)
    assert [t.model_dump() for t in seen[0]] == [t.model_dump() for t in want]
    assert [t.model_dump() for t in seen[0]] != [t.model_dump() for t in evaluation.eval_tasks(env, ev)]
    assert seen[1] == given


def test_a_missing_campaign_checkpoint_names_the_fetch_command_for_its_home(tmp_path, monkeypatch):
    from research.studies import _checkpoint

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    mine = tmp_path / "campaigns" / "abl-recursive" / "checkpoints" / "iter-0"
    with pytest.raises(FileNotFoundError) as e:
        _checkpoint(str(mine), "arm recursive", tmp_path)
    assert str(e.value).endswith("comes back from S3 with `rao campaigns fetch abl-recursive --iteration 0 --weights-only`")
    with pytest.raises(FileNotFoundError) as e:  # not a campaign's folder: no command to offer
        _checkpoint(str(tmp_path / "mine"), "arm recursive", tmp_path)
    assert str(e.value) == f"checkpoint folder of arm recursive not found: {tmp_path / 'mine'} has no config.json"


@needs_tok
def test_arms_measured_in_separate_runs_share_one_record(tmp_path):
    """Each arm retrained and evaluated in its own session (a machine's checkpoints do not outlive it): a run of
    --arm single after a complete --arm recursive record keeps the recursive points and adds the single arm's,
    with each arm's own command and source record; an interrupted second run resumes its own arm only; a record
    of another evaluation (another n) keeps nothing."""
    rec_a = _record(tmp_path)
    (tmp_path / "b").mkdir()
    rec_b = _record(tmp_path / "b", name="textcraft-ablation-retrain")  # another record: the single arm retrained
    policy_for = _expert(str(tmp_path / "b" / "single-ckpt"))
    sandbox = [f"runtime.sandbox={SANDBOX}"]
    first = plan_generalisation(record=str(rec_a), arms=["recursive"], n=2, ks=[2, 3], command="first",
                                overrides=sandbox)
    run_study(first, root=tmp_path, policy_for=policy_for, say=lambda m: None)
    path = tmp_path / "docs/results/textcraft-generalisation.json"
    rec_first = json.loads(path.read_text())
    second = plan_generalisation(record=str(rec_b), arms=["single"], n=2, ks=[2, 3], command="second",
                                 overrides=sandbox)
    assert second.name == first.name  # the retrain record has no seed suffix: the same study record
    said: list[str] = []
    out = run_study(second, root=tmp_path, policy_for=policy_for, say=said.append)
    r = json.loads(path.read_text())
    assert [(p["arm"], p["k"]) for p in r["points"]] == [("recursive", 2), ("recursive", 3), ("single", 2),
                                                         ("single", 3)]
    assert r["points"][:2] == rec_first["points"] and r["arms"] == ["recursive", "single"] and r["complete"] is True
    assert [s for s in said if s.startswith("evaluating")] == ["evaluating arm single, 2 tier1x2 tasks, mode single",
                                                               "evaluating arm single, 2 tier1x3 tasks, mode single"]
    assert any(s.startswith("textcraft-generalisation.json: keeping the points of arm(s) recursive") for s in said)
    assert {a: v["command"] for a, v in r["sources"].items()} == {"recursive": "first", "single": "second"}
    assert r["sources"]["single"]["source_record"] == str(rec_b) and r["sources"]["recursive"]["source_record"] == str(rec_a)
    assert set(r["checkpoints"]) == {"recursive", "single"} and set(r["runtime"]) == {"recursive", "single"}
    assert all((tmp_path / p["trees_file"]).exists() for p in r["points"])  # the first run's trees are kept
    assert "Arms measured by separate runs: recursive: `first`" in out["markdown"]
    # --dry-run says which arms a run keeps
    assert "kept from that record (measured by an earlier run): arm(s) recursive (2 points)" in plan_text(
        plan_generalisation(record=str(rec_b), arms=["single"], n=2, ks=[2, 3], overrides=sandbox), root=tmp_path)
    assert "| recursive | 3 | 2 |" in out["markdown"] and "| single | 3 | 2 |" in out["markdown"]
    # interrupted during the single arm's K = 3: resumed, the recursive points kept, only that evaluation runs
    path.write_text(json.dumps({**r, "complete": False, "points": r["points"][:3]}))
    said.clear()
    run_study(second, root=tmp_path, policy_for=policy_for, say=said.append)
    assert [s for s in said if s.startswith("evaluating")] == ["evaluating arm single, 2 tier1x3 tasks, mode single"]
    assert json.loads(path.read_text())["points"][:3] == r["points"][:3]
    # another evaluation (n = 1): the recursive arm's n = 2 points are not kept
    other = plan_generalisation(record=str(rec_b), arms=["single"], n=1, ks=[2, 3], command="third", overrides=sandbox)
    run_study(other, root=tmp_path, policy_for=policy_for, say=lambda m: None)
    r = json.loads(path.read_text())
    assert r["arms"] == ["single"] and [p["arm"] for p in r["points"]] == ["single", "single"]
