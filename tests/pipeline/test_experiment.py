"""The experiment flow's pure parts: per-arm overrides, table rows, markdown and plot (no services)."""

from __future__ import annotations

import json

import pytest

from flows.campaign import CampaignParams
from research.designs import arm_overrides
from research.experiment import ExperimentParams, _rows
from research.records import learning_curve_png, results_markdown

CONFIG = "configs/experiment-textcraft-cpu.yaml"


def test_arm_overrides_share_the_warm_start_and_separate_the_registry(tmp_path):
    rec = arm_overrides("recursive", ["algo.G=2"], "rao-policy-x", None)
    assert rec == ["algo.G=2", "eval.modes=[recursive]"]
    # --set name=X names the arms' prefix: kept, it would give both arms one campaign
    assert arm_overrides("single", [" name =x", "algo.G=2"], "m-{campaign}", None)[:1] == ["algo.G=2"]
    single_x = arm_overrides("single", ["name=x"], "m-{campaign}", None)
    assert CampaignParams(config=CONFIG, name="x-single", overrides=single_x).resolve().name == "x-single"
    ckpt = tmp_path / "iter-0"  # the recursive arm's warm-start checkpoint (the config checks that it exists)
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    single = arm_overrides("single", [], "rao-policy-x", str(ckpt))
    cfg = CampaignParams(config=CONFIG, overrides=single).resolve()
    assert cfg.runtime.delegation is False and cfg.runtime.effective_max_depth == 0
    assert cfg.eval.modes == ["single"] and cfg.model.registered_model.endswith("-single")
    assert cfg.warm_start.mode == "checkpoint" and cfg.warm_start.checkpoint == str(ckpt)
    first = CampaignParams(config=CONFIG, overrides=rec).resolve()
    assert first.warm_start.mode == "demos" and first.runtime.delegation is True and first.algo.G == 2
    with pytest.raises(ValueError, match="unknown arm"):
        arm_overrides("tree", [], "m", None)
    with pytest.raises(ValueError):
        ExperimentParams(arms=["recursive", "singel"])


def _row(mode: str, diff: str, success: float) -> dict:
    return {"mode": mode, "difficulty": diff, "n": 10, "success": success, "ci95": "[0.00, 0.40]",
            "mean_depth": 0.5, "delegation_rate": 0.3}


def test_rows_markdown_and_plot(tmp_path):
    summary = {"base_eval": [_row("recursive", "medium", 0.1)],
               "iterations": [{"iteration": 1, "times": {"generate_s": 100.0, "train_s": 20.5},
                               "eval_rows": [_row("recursive", "medium", 0.3)]}]}
    rows = _rows("recursive", summary) + _rows("single", {"base_eval": [_row("single", "medium", 0.0)],
                                                          "iterations": []})
    assert [(r["arm"], r["iteration"], r["success"]) for r in rows] == [
        ("recursive", 0, 0.1), ("recursive", 1, 0.3), ("single", 0, 0.0)]
    assert rows[1]["iteration_wall_s"] == 120.5 and "iteration_wall_s" not in rows[0]
    md = results_markdown(rows, {"command": "rao experiment textcraft-cpu", "config": CONFIG, "seed": 0,
                                 "commit": "abc1234", "date": "2026-11-29", "wall_s": 600.0, "n_tasks": 10})
    assert md.startswith("## Learning curve: recursive vs single agent")
    assert "| recursive | 1 | recursive | medium | 10 | 0.30 | [0.00, 0.40] | 0.5 | 0.3 | 120.5 |" in md
    assert "commit `abc1234`" in md and "10.0 min" in md
    png = learning_curve_png(rows, tmp_path / "img" / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_two_proportion_test_values():
    from rao_core.evaluation import two_proportion_test

    t = two_proportion_test(10, 50, 20, 50)  # 0.2 -> 0.4, pooled 0.3
    assert t["z"] == pytest.approx(0.2 / (0.3 * 0.7 * 0.04) ** 0.5)
    assert t["p_value"] == pytest.approx(0.01455, abs=1e-4) and t["p_value_two_sided"] == pytest.approx(0.0291, abs=1e-4)
    assert two_proportion_test(20, 50, 10, 50)["p_value"] == pytest.approx(1 - 0.01455, abs=1e-4)  # one-sided
    assert two_proportion_test(0, 50, 0, 50) == {"z": 0.0, "p_value": 0.5, "p_value_two_sided": 1.0}
    with pytest.raises(ValueError):
        two_proportion_test(0, 0, 1, 1)


def test_experiment_record_points_and_test(tmp_path):
    from research.records import experiment_record
    from rao_core.paths import REPO_ROOT

    def row(arm, it, mode, s):
        return {"arm": arm, "iteration": it, "mode": mode, "difficulty": "tier1", "n": 50, "successes": s,
                "success": s / 50, "ci95": "[0, 1]", "mean_depth": 0.1, "delegation_rate": 0.1}

    rows = [row("recursive", 0, "recursive", 10), row("recursive", 1, "recursive", 14),
            row("recursive", 2, "recursive", 21), row("single", 0, "single", 11)]
    ck = {("recursive", 0): str(REPO_ROOT / "var/x/iter-0"), ("recursive", 2): "/elsewhere/iter-2"}
    meta = {"command": "rao experiment textcraft-tier1", "config": "c.yaml", "seed": 0, "commit": "abc",
            "date": "2026-12-01", "wall_s": 100.0}
    rec = experiment_record("textcraft-tier1", rows, meta, ck, {"name": "x"})
    assert {k for k in rec} >= {"experiment", "command", "config", "seed", "commit", "wall_s", "points", "test"}
    p0 = rec["points"][0]
    assert {k for k in p0} >= {"arm", "iteration", "difficulty", "mode", "n", "successes", "checkpoint"}
    assert p0["checkpoint"] == "var/x/iter-0" and rec["points"][2]["checkpoint"] == "/elsewhere/iter-2"
    t = rec["test"]
    assert (t["arm"], t["difficulty"], t["baseline_iteration"], t["final_iteration"]) == ("recursive", "tier1", 0, 2)
    assert t["final"] == [21, 50] and t["difference"] == pytest.approx(0.22) and 0 < t["p_value"] < 0.05


def test_experiment_flow_run_is_named_after_the_experiment(monkeypatch):
    """The experiment's Prefect flow run is named after it (it got a random name such as 'elusive-termite')."""
    import prefect.runtime.flow_run as fr

    from research.experiment import experiment_run_name

    monkeypatch.setitem(fr.FIELDS, "parameters", lambda: {"params": {"experiment": "textcraft-tier1"}})
    assert experiment_run_name() == "textcraft-tier1"
    monkeypatch.setitem(fr.FIELDS, "parameters", lambda: {"params": ExperimentParams(name="mine")})
    assert experiment_run_name() == "mine"


def test_write_results_rewrites_only_its_own_section_and_logs_to_mlflow(tmp_path, monkeypatch):
    """The results task replaces this experiment's section of docs/results.md (other sections kept), writes
    the JSON record and the plot, and logs both to the MLflow run."""
    import json

    import mlflow

    from research.records import write_results

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    run_id = mlflow.MlflowClient().create_run(mlflow.create_experiment("e")).info.run_id
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/results.md").write_text("# Results\n\n## Before\nkept\n\n## Learning curve: tier-x\nOLD\n\n"
                                             "## After\nalso kept\n")
    rows = [{"arm": "recursive", "iteration": i, "mode": "recursive", "difficulty": "tier1", "n": 50,
             "successes": s, "success": s / 50, "ci95": "[0.1, 0.5]", "mean_depth": 0.0, "delegation_rate": 0.0}
            for i, s in ((0, 5), (1, 20))]
    meta = {"command": "rao experiment tier-x", "config": "c.yaml", "seed": 0, "commit": "abc",
            "date": "2026-12-01", "wall_s": 60.0, "n_tasks": 50}
    out = write_results.fn("tier-x", rows, meta, {}, {"name": "x"}, run_id, out_root=tmp_path)
    doc = (tmp_path / "docs/results.md").read_text()
    assert "OLD" not in doc and "kept" in doc and "also kept" in doc and doc.count("## Learning curve: tier-x") == 1
    assert "| recursive | 1 | recursive | tier1 | 50 | 0.40 |" in doc
    rec = json.loads((tmp_path / "docs/results/tier-x.json").read_text())
    assert rec["test"]["final"] == [20, 50] and out["record"] == rec
    assert (tmp_path / "docs/img/tier-x.png").stat().st_size > 1000
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "experiment")}
    assert arts == {"experiment/results.json", "experiment/tier-x.png"}


def test_arm_tests_seeds_and_the_delegation_table(tmp_path):
    """Recursive vs single at the last iteration per difficulty, the seeded run's names and
    overrides, the single arm's step limit, the side-by-side / pooled seeds table, the depth-1 columns."""
    from research.records import arm_tests, experiment_record, seeds_markdown

    def row(arm, it, diff, s, child=None):
        return {"arm": arm, "iteration": it, "mode": arm, "difficulty": diff, "n": 50, "successes": s,
                "success": s / 50, "ci95": "[0, 1]", "mean_depth": 1.0 if arm == "recursive" else 0.0,
                "delegation_rate": 1.0 if arm == "recursive" else 0.0, "child_success": child,
                "parallel_share": 0.5, "tree_wall_s": 30.0, "tokens_per_success": 900}

    rows = [row("recursive", 0, "tier1x3", 5, 0.4), row("recursive", 0, "tier1x5", 1, 0.3),
            row("recursive", 2, "tier1x3", 20, 0.7), row("recursive", 2, "tier1x5", 8, 0.6),
            row("single", 0, "tier1x3", 0), row("single", 2, "tier1x3", 2), row("single", 2, "tier1x5", 0)]
    tests = arm_tests(rows)
    assert [(t["difficulty"], t["recursive"], t["single"]) for t in tests] == [
        ("tier1x3", [20, 50], [2, 50]), ("tier1x5", [8, 50], [0, 50])]
    assert tests[0]["p_value"] < 0.001 and tests[0]["difference"] == pytest.approx(0.36)
    assert arm_tests([r for r in rows if r["arm"] == "recursive"]) == []
    meta = {"command": "rao experiment textcraft-tier1x", "config": "c.yaml", "seed": 0, "commit": "abc",
            "date": "2026-12-02", "wall_s": 60.0, "n_tasks": 50}
    rec = experiment_record("textcraft-tier1x", rows, meta, {}, {})
    assert rec["arm_tests"] == tests and rec["points"][2]["child_success"] == 0.7
    md = results_markdown(rows, meta, experiment="textcraft-tier1x", test=rec["test"], arm_tests_=tests)
    assert "depth-1 success" in md and "| recursive | 2 | recursive | tier1x3 | 50 | 0.40 | [0, 1] | 1.0 | 1.0 | 0.7 |" in md
    assert "Arms (pooled two-proportion z-test, one-sided (recursive > single)), tier1x3" in md
    png = learning_curve_png(rows, tmp_path / "c.png")  # two panels: roots, and depth-1 nodes
    assert png.stat().st_size > 5000

    rec1 = dict(rec, seed=1, experiment="textcraft-tier1x-seed1")
    seeds = seeds_markdown("textcraft-tier1x", [rec, rec1])
    assert "| pooled | 2 seeds | 10/100 = 0.10" in seeds and "40/100 = 0.40" in seeds and "4/100 = 0.04" in seeds
    # a record older than arm_tests (its arms from its points); a seed with one arm is left out of recursive vs single
    old_rec = {k: v for k, v in rec.items() if k != "arm_tests"}
    rec2 = dict(rec, seed=2, experiment="textcraft-tier1x-seed2", arm_tests=[],
                points=[dict(r, successes=0, success=0.0) if r["iteration"] == 2 else r
                        for r in rec["points"] if r["arm"] == "recursive"])
    from rao_core.evaluation import two_proportion_test

    mixed = seeds_markdown("textcraft-tier1x", [old_rec, rec2])
    assert "| 0 | `docs/results/textcraft-tier1x.json` | 5/50 = 0.10 [0.04, 0.21] | 20/50 = 0.40" in mixed
    p_seed0 = two_proportion_test(2, 50, 20, 50)["p_value"]
    assert mixed.splitlines()[4].endswith(f"| 2/50 = 0.04 [0.01, 0.13] | {p_seed0:.4f} |")  # from its points
    assert mixed.splitlines()[5].endswith("|  | nan |")  # seed 2: no single arm
    p_all = two_proportion_test(2, 50, 20, 100)["p_value"]  # what pooling seed 2's recursive roots would give
    assert f"{p_all:.4f}" != f"{p_seed0:.4f}" and mixed.splitlines()[-1].endswith(f"| 2/50 = 0.04 [0.01, 0.13] | {p_seed0:.4f} |")
    # seeds run in separate sessions: `rao experiment seeds` reads the stored records, ordered by seed
    from research.experiment import write_seeds_section
    from research.records import seed_records

    (tmp_path / "docs/results").mkdir(parents=True)
    for r in (rec1, rec):
        (tmp_path / f"docs/results/{r['experiment']}.json").write_text(json.dumps(r))
    (tmp_path / "docs/results/textcraft-tier1x-run1.json").write_text(json.dumps(dict(rec, seed=7)))  # not a seed
    assert [r["seed"] for r in seed_records("textcraft-tier1x", tmp_path)] == [0, 1]
    (tmp_path / "docs/results.md").write_text("# Results\n\n## Other\n\nkept\n")
    assert write_seeds_section("textcraft-tier1x", seed_records("textcraft-tier1x", tmp_path), root=tmp_path) == seeds
    doc = (tmp_path / "docs/results.md").read_text()
    assert "## Other\n\nkept" in doc and doc.rstrip().endswith(seeds.rstrip())
    with pytest.raises(FileNotFoundError, match="no record of tier-none under"):
        seed_records("tier-none", tmp_path)

    p = ExperimentParams(experiment="textcraft-tier1x", seed=1)
    assert p.seeded_name(0) == "textcraft-tier1x-seed1" and p.seeded_name(1) == "textcraft-tier1x"
    assert ExperimentParams(experiment="e").seed_overrides() == []
    cfg = CampaignParams(config="configs/experiment-textcraft-tier1x.yaml", overrides=p.seed_overrides()).resolve()
    assert (cfg.seed, cfg.trainer.seed, cfg.warm_start.trainer.seed) == (1, 1, 1)
    assert cfg.eval.seed == 1234  # the held-out tasks are the same for every seed
    single = arm_overrides("single", [], "rao-policy-{campaign}", None, single_max_steps=42)
    assert "runtime.max_steps_per_node=42" in single
    assert not any("max_steps" in o for o in arm_overrides("recursive", [], "m", None, single_max_steps=42))


# -- records a reader can audit -------------------------------------------------------------------------------
def _eval_trees(n: int, text_chars: int = 600) -> list:
    """``n`` delegating tier1x2-like trees (root + 2 children, 4 turns each, ~300 generated tokens per turn);
    the first three solved."""
    import random

    from rao_core.tree import EndReason, ExecutionTree, Node, Turn

    rng = random.Random(0)

    def words(k: int) -> str:  # text that compresses like text, not like one repeated letter
        return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(k // 6))

    def node(nid, parent, depth, v):
        turns = [Turn(prompt_token_ids=list(range(900)), completion_token_ids=list(range(300)),
                      completion_logprobs=[-0.25] * 300, text=f"turn {k} " + words(text_chars),
                      code="craft({'a': 1}, ('b', 1))", observation="inventory: " + words(300)) for k in range(4)]
        return Node(node_id=nid, parent_id=parent, depth=depth, goal=f"craft {nid}", verifier=v, turns=turns,
                    end_reason=EndReason.FINISHED if v else EndReason.MAX_STEPS, token_ids=list(range(2100)),
                    assistant_mask=[0] * 900 + [1] * 1200, behaviour_logprobs=[-0.25] * 2100,
                    messages=[{"role": "system", "content": "s" * 3000}],
                    children=[f"{nid}.0", f"{nid}.1"] if not depth else [])

    return [ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id=f"tcs-validation-tier1x2-{i:05d}",
                          root_id="0", nodes=[node("0", None, 0, 1.0 if i < 3 else 0.0), node("0.0", "0", 1, 1.0),
                                 node("0.1", "0", 1, 1.0 if i < 5 else 0.0)], wall_s=10.0 + i) for i in range(n)]


def test_stored_trees_file_is_small_stripped_and_readable(tmp_path):
    from rao_core.evaluation import tree_sample
    from research.records import TREE_FILE_MAX_BYTES, read_tree_sample, write_tree_sample

    trees = _eval_trees(20)
    full = sum(len(t.model_dump_json()) for t in trees[:10])
    sample = tree_sample(trees, 10)
    assert len(sample) == 10 and [t.task_id[-2:] for t in sample] == [f"{i:02d}" for i in range(10)]
    path = tmp_path / "recursive-it1-tier1x2-recursive.jsonl.gz"
    assert write_tree_sample(path, [t.model_dump(mode="json") for t in sample]) == 10  # JSON dicts, as in rows
    size = path.stat().st_size
    assert size < TREE_FILE_MAX_BYTES and size < full / 20  # 1.8 MB of whole trees -> ~56 KB
    back = read_tree_sample(path)
    assert [t.tree_id for t in back] == [t.tree_id for t in sample] and back == sample  # round trip
    n0 = back[0].nodes[0]
    assert n0.token_ids == [] and n0.behaviour_logprobs == [] and n0.turns[0].completion_logprobs == []
    assert n0.turns[0].text == trees[0].nodes[0].turns[0].text and n0.turns[0].observation.startswith("inventory")
    assert back[0].meta["compact"]["completion_tokens"]["0"] == 1200
    assert path.read_bytes() == (write_tree_sample(tmp_path / "again.jsonl.gz", sample) and
                                 (tmp_path / "again.jsonl.gz").read_bytes())  # same trees, same bytes
    # the byte bound: trees at the end are dropped until the file fits; none fits -> no file
    assert 0 < write_tree_sample(tmp_path / "cut.jsonl.gz", sample, max_bytes=size // 3) < 10
    assert (tmp_path / "cut.jsonl.gz").stat().st_size <= size // 3
    assert write_tree_sample(tmp_path / "none.jsonl.gz", sample, max_bytes=50) == 0
    assert not (tmp_path / "none.jsonl.gz").exists()
    (tmp_path / "bad.jsonl.gz").write_bytes(__import__("gzip").compress(b'{"tree_id": 1}\n'))
    with pytest.raises(ValueError, match=r"bad.jsonl.gz:1: not a valid execution tree record"):
        read_tree_sample(tmp_path / "bad.jsonl.gz")


def test_iteration_stats_from_the_logged_metrics():
    from research.records import iteration_stats

    m = {"success/root": 0.25, "success/depth_1": 0.5, "samples/num_trees": 48.0, "tokens/completion_total": 9000.0,
         "tree/delegation_rate": 0.9, "end/finished": 0.8, "end/max_steps": 0.2, "samples/num_samples": 140.0,
         "samples/num_signal_samples": 120.0, "samples/depth_0/samples": 48.0, "samples/depth_0/signal_samples": 40.0,
         "samples/depth_0/mean_abs_advantage": 0.4, "samples/depth_0/assistant_tokens": 3000.0,
         "samples/depth_1/samples": 92.0, "samples/depth_10/samples": 1.0, "train/loss": 0.1, "eval/x/y/success": 0.3}
    s = iteration_stats(m)
    assert (s["rollout_root_success"], s["rollout_depth1_success"], s["rollout_trees"], s["rollout_tokens"]) == (
        0.25, 0.5, 48.0, 9000.0)
    assert s["rollout_end_reasons"] == {"finished": 0.8, "max_steps": 0.2}
    assert (s["samples"], s["signal_samples"], s["rollout_delegation_rate"]) == (140.0, 120.0, 0.9)
    assert s["samples_per_depth"] == {"0": {"samples": 48.0, "signal_samples": 40.0, "mean_abs_advantage": 0.4,
                                            "assistant_tokens": 3000.0}, "1": {"samples": 92.0},
                                      "10": {"samples": 1.0}}  # depths in numeric order
    assert s["train"] == {"loss": 0.1} and s["staleness"] == {} and s["optimizer_steps"] == 0  # no step logged
    assert iteration_stats({"train/step": 1.0, "train/optimizer_steps_total": 3.0})["optimizer_steps"] == 1
    lagged = iteration_stats({"staleness/lag_10_samples": 1.0, "staleness/lag_0_samples": 30.0,
                              "staleness/lag_1_samples": 12.0, "train/behaviour_weight_mean": 0.97})
    assert list(lagged["staleness"].items()) == [("0", 30.0), ("1", 12.0), ("10", 1.0)]  # numeric order
    assert lagged["train"] == {"behaviour_weight_mean": 0.97}
    empty = iteration_stats({})  # an iteration that logged nothing (e.g. a crashed log stage): None, not an error
    assert empty["rollout_root_success"] is None and empty["samples_per_depth"] == {}


def test_record_has_per_point_audit_fields_training_and_stored_trees(tmp_path, monkeypatch):
    """A campaign summary -> rows, training statistics and stored trees -> the record."""
    import mlflow

    from research.experiment import _training, _trees
    from rao_core.evaluation import summarise
    from research.records import read_tree_sample, write_results

    trees = _eval_trees(6)
    row0 = summarise(trees, mode="recursive", difficulty="tier1x2", keep_trees=4).table_row()
    row1 = summarise(trees[:3], mode="recursive", difficulty="tier1x2", keep_trees=0).table_row()
    metrics = {"success/root": 0.3, "success/depth_1": 0.6, "samples/depth_1/signal_samples": 7.0}
    summary = {"base_eval": [row0], "iterations": [{"iteration": 1, "times": {"generate": 5.0}, "metrics": metrics,
                                                     "eval_rows": [row1]}]}
    rows = _rows("recursive", summary)
    assert all("trees" not in r for r in rows) and rows[0]["per_task"]["tcs-validation-tier1x2-00004"] == 0
    samples = _trees("recursive", summary)
    assert list(samples) == [("recursive", 0, "tier1x2", "recursive")] and len(samples[list(samples)[0]]) == 4
    training = _training("recursive", summary)
    assert training[0]["arm"] == "recursive" and training[0]["iteration"] == 1
    assert training[0]["rollout_depth1_success"] == 0.6
    assert training[0]["samples_per_depth"]["1"]["signal_samples"] == 7.0

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    run_id = mlflow.MlflowClient().create_run(mlflow.create_experiment("e")).info.run_id
    stale = tmp_path / "docs/results/trees/tier-x/recursive-it9-tier1x2-recursive.jsonl.gz"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    endpoint = {"arm": "recursive", "difficulty": "tier1x2", "mode": "recursive", "iteration": "last",
                "against": "warm_start", "test": "two_proportion_z", "n": 100}
    meta = {"command": "rao experiment tier-x", "config": "c.yaml", "seed": 1, "commit": "abc", "date": "2026-12-09",
            "wall_s": 60.0, "n_tasks": 6, "arms": ["recursive"], "eval_seed": 4321, "dev_seed": 77,
            "config_commit": "def", "config_dirty": False, "endpoint": endpoint, "task_sets": {"evaluation": 6}}
    out = write_results.fn("tier-x", rows, meta, {}, {"name": "x"}, run_id, out_root=tmp_path, training=training,
                           trees=samples)
    rec = json.loads((tmp_path / "docs/results/tier-x.json").read_text())
    assert rec == out["record"]
    assert (rec["arm"], rec["arms"], rec["seed"], rec["eval_seed"], rec["dev_seed"]) == (
        "recursive", ["recursive"], 1, 4321, 77)
    assert (rec["commit"], rec["config_commit"], rec["config_dirty"]) == ("abc", "def", False)
    assert rec["endpoint"] == endpoint
    assert rec["training"] == training and rec["task_sets"] == {"evaluation": 6}
    p0, p1 = rec["points"]
    # per task: the first three roots solved; six trees at iteration 0, three at iteration 1
    assert p0["per_task"] == {f"tcs-validation-tier1x2-{i:05d}": int(i < 3) for i in range(6)}
    assert p1["per_task"] == {f"tcs-validation-tier1x2-{i:05d}": 1 for i in range(3)}
    assert p0["end_reasons"] == {"finished": 3, "max_steps": 3} and p0["children_per_tree"] == {"2": 6}
    assert p0["depth_hist"] == {"1": 6} and p0["tokens_per_tree"] == 3600.0 and p0["tokens_total"] == 21600
    assert p0["tree_wall_s_median"] == 12.5 and p0["tree_wall_s"] == 12.5  # walls 10..15
    # depth 1: 12 children, 6 + 5 solved (the second child of trees 5 fails)
    assert p0["per_depth"]["1"]["nodes"] == 12 and p0["per_depth"]["1"]["success"] == round(11 / 12, 6)
    assert "tokens_per_success" not in p0
    assert p0["trees"] == "docs/results/trees/tier-x/recursive-it0-tier1x2-recursive.jsonl.gz"
    assert p0["trees_stored"] == 4
    assert "trees" not in p1  # no sample kept at that point
    stored = read_tree_sample(tmp_path / p0["trees"])
    assert [t.task_id[-1] for t in stored] == ["0", "1", "3", "4"]  # failures and successes alternately
    assert not stale.exists()  # a re-run replaces the experiment's stored trees
    doc = (tmp_path / "docs/results.md").read_text()
    assert "tokens per tree" in doc and "tokens per success" not in doc and "eval.seed 4321" in doc
    assert "Preregistered endpoint: arm recursive, tier1x2, recursive mode, iteration last against warm_start" in doc
    # a record of a campaign evaluated before audit fields existed still reads (tokens per solved task, no audit fields)
    old = experiment_record_of([dict(rows[1], tokens_per_success=900, per_task=None)])
    assert old["points"][0]["tokens_per_success"] == 900 and old["eval_seed"] is None and old["training"] == []


def experiment_record_of(rows: list[dict]) -> dict:
    from research.records import experiment_record

    meta = {"command": "c", "config": "c.yaml", "seed": 0, "commit": "abc", "date": "2026-12-01", "wall_s": 1.0}
    return experiment_record("old", rows, meta, {}, {})


def test_the_experiment_stops_before_any_campaign_on_an_overlap(monkeypatch):
    """The evaluation set is checked against the training pool and the demonstrations before any campaign:
    an overlap is a ValueError naming it (one ``error:`` line from ``rao experiment``)."""
    import logging

    import research.experiment as fe

    def no_campaign(*a, **k):
        raise AssertionError("a campaign started")

    monkeypatch.setattr(fe, "rao_campaign", no_campaign)
    monkeypatch.setattr(fe, "get_run_logger", lambda: logging.getLogger("test"))
    params = fe.ExperimentParams(experiment="textcraft-tier1", config="configs/experiment-textcraft-tier1.yaml",
                                 overrides=["eval.split=train"])
    with pytest.raises(ValueError, match="held-out tasks are not disjoint from the others: evaluation"):
        fe.rao_experiment.fn(params)


def test_the_flow_writes_the_audit_fields_from_the_campaign_summaries(tmp_path, monkeypatch):
    """``rao_experiment`` with campaigns replaced by their summaries: the record gets the seeds, the config's
    commit, the endpoint, the task-set sizes, the training statistics and the stored trees."""
    import logging

    import mlflow

    import research.experiment as fe
    from rao_core.evaluation import summarise
    from research.records import write_results

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    run_id = mlflow.MlflowClient().create_run(mlflow.create_experiment("e")).info.run_id
    trees = _eval_trees(4)

    def campaign(params):
        mode = "single" if params.name.endswith("-single") else "recursive"
        row = summarise(trees, mode=mode, difficulty="tier1x2", keep_trees=2).table_row()
        return {"mlflow_run_id": run_id, "warm_start": {"mode": "demos", "stats": {"trees": 48}, "sft_steps": 7,
                                                        "checkpoint_local": None},
                "base_eval": [row], "iterations": [{"iteration": 1, "times": {"generate": 1.0},
                                                    "metrics": {"success/root": 0.5}, "eval_rows": [row]}]}

    monkeypatch.setattr(fe, "rao_campaign", campaign)
    monkeypatch.setattr(fe, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(fe, "write_results", lambda *a, **k: write_results.fn(*a, **{**k, "out_root": tmp_path}))
    ep = ("eval.endpoint={arm: recursive, difficulty: tier1x2, mode: recursive, against: single, test: mcnemar, "
          "n: 50}")
    out = fe.rao_experiment.fn(fe.ExperimentParams(experiment="tier1x-test", config="configs/experiment-textcraft-"
                                                   "tier1x.yaml", overrides=[ep, "eval.dev={seed: 5}"]))
    rec = json.loads((tmp_path / "docs/results/tier1x-test.json").read_text())
    assert rec == out["record"] and (rec["arm"], rec["arms"]) == (None, ["recursive", "single"])
    assert (rec["seed"], rec["eval_seed"], rec["dev_seed"]) == (0, 1234, 5)
    assert rec["endpoint"]["against"] == "single" and rec["endpoint"]["iteration"] == "last"
    assert rec["config_commit"] and rec["config_dirty"] in (True, False)  # the config file is tracked by git
    # per difficulty (tier1x2, tier1x3): 50 evaluation and 20 development tasks
    assert rec["task_sets"] == {"evaluation (eval.seed 1234)": 100, "development (eval.dev.seed 5)": 40,
                                "training (seed 0)": 200, "demonstrations (seed 0)": 48}
    assert [(t["arm"], t["iteration"], t["rollout_root_success"]) for t in rec["training"]] == [
        ("recursive", 1, 0.5), ("single", 1, 0.5)]
    assert rec["warm_start"]["recursive"] == {"mode": "demos", "stats": {"trees": 48}, "sft_steps": 7}
    assert len(rec["points"]) == 4 and all(p["trees_stored"] == 2 for p in rec["points"])
    assert sorted(p.name for p in (tmp_path / "docs/results/trees/tier1x-test").iterdir()) == [
        f"{arm}-it{i}-tier1x2-{arm}.jsonl.gz" for arm in ("recursive", "single") for i in (0, 1)]
    assert all("trees" not in r for r in out["rows"])  # the flow's rows do not carry the trees


def test_the_outcome_arm_is_rao_without_its_credit_assignment():
    """The ablation's arm (b): recursive, every node scored by its root (root_proxy), no bonus, no depth weights."""
    out = arm_overrides("outcome", ["algo.G=2"], "rao-policy-x", "/ckpt")
    assert out == ["algo.G=2", "eval.modes=[recursive]", "judge.child_source=root_proxy", "algo.lam=0",
                   "algo.depth_weights=false", "model.registered_model=rao-policy-x-outcome",
                   "warm_start.mode=checkpoint", "warm_start.checkpoint=/ckpt"]
    from rao_core.config import load_config
    from rao_core.rewards import node_rewards
    from tests.algo.helpers import node, tree

    cfg = load_config("configs/experiment-textcraft-tier1x.yaml", out[:5])
    assert (cfg.judge.child_source, cfg.algo.bonus_weight("textcraft-synth"), cfg.algo.depth_weights) == (
        "root_proxy", 0.0, False)
    # with the root's success copied to every child (the judge's proxy), every node's R is the root's outcome
    t = tree("t", "g", [node("r", None, 0, 1.0), node("c", "r", 1, 1.0)])
    assert node_rewards(t, cfg.algo.bonus_weight("textcraft-synth"), bonus=cfg.algo.bonus) == {"r": 1.0, "c": 1.0}


def _fake_arms(monkeypatch) -> tuple[dict[str, list[str]], dict]:
    """``rao_experiment``'s campaigns replaced by a stand-in: returns (arm -> the overrides its campaign got, the
    record's meta once written); each arm's warm start is ``/ck/<campaign>``."""
    import logging

    import research.experiment as fe

    seen: dict[str, list[str]] = {}
    meta: dict = {}

    def campaign(params):
        seen[params.name.rsplit("-", 1)[1]] = list(params.overrides)
        return {"mlflow_run_id": "x", "warm_start": {"checkpoint_local": f"/ck/{params.name}"}, "base_eval": [],
                "iterations": []}

    monkeypatch.setattr(fe, "rao_campaign", campaign)
    monkeypatch.setattr(fe, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(fe, "write_results", lambda name, rows, m, *a, **k: meta.update(m) or {"markdown": "",
                                                                                              "record": {}})
    return seen, meta


def test_the_single_arm_can_build_its_own_warm_start(tmp_path, monkeypatch):
    """single_warm_start 'own': the single arm gets no shared checkpoint and demonstrates without delegation;
    the outcome arm still shares the recursive arm's."""
    import research.experiment as fe

    seen, _ = _fake_arms(monkeypatch)
    fe.rao_experiment.fn(fe.ExperimentParams(experiment="abl", config="configs/experiment-textcraft-tier1x.yaml",
                                             arms=["recursive", "outcome", "single"], single_warm_start="own",
                                             write_docs=False))
    assert not any(o.startswith("warm_start.") for o in seen["recursive"])
    assert "warm_start.checkpoint=/ck/textcraft-tier1x-recursive" in seen["outcome"]
    assert "warm_start.options.single_agent_fraction=1.0" in seen["single"]
    assert not any(o.startswith("warm_start.checkpoint") for o in seen["single"])


def test_one_warm_start_per_agent_kind_is_shared_by_every_seed(tmp_path, monkeypatch):
    """The recursive warm start given to every arm by --set and the single agent's by single_checkpoint: the
    single arm's checkpoint comes last (the last override wins), the outcome arm shares the recursive arm's
    iteration-0 folder, and the record's command names both."""
    import research.experiment as fe
    from rao_core.config import load_config

    seen, meta = _fake_arms(monkeypatch)
    monkeypatch.setattr(fe, "check_task_sets", lambda cfg: {})
    for kind in ("recursive", "single"):  # checkpoint folders (the config checks the paths)
        (tmp_path / f"warm-{kind}").mkdir()
        (tmp_path / f"warm-{kind}" / "config.json").write_text("{}")
    shared = ["warm_start.mode=checkpoint", f"warm_start.checkpoint={tmp_path}/warm-recursive"]
    fe.rao_experiment.fn(fe.ExperimentParams(experiment="textcraft-deeper",
                                             config="configs/experiment-textcraft-deeper.yaml",
                                             arms=["recursive", "outcome", "single"], single_warm_start="own",
                                             single_checkpoint=f"{tmp_path}/warm-single", overrides=shared,
                                             write_docs=False))
    def last_checkpoint(overrides: list[str]) -> str:  # the last override of a key wins
        return [o for o in overrides if o.startswith("warm_start.checkpoint=")][-1].partition("=")[2]

    assert last_checkpoint(seen["recursive"]) == f"{tmp_path}/warm-recursive"
    assert last_checkpoint(seen["outcome"]) == "/ck/textcraft-deeper-recursive"
    assert last_checkpoint(seen["single"]) == f"{tmp_path}/warm-single"
    cfg = load_config("configs/experiment-textcraft-deeper.yaml", seen["single"], check_paths=False)
    assert cfg.warm_start.checkpoint == f"{tmp_path}/warm-single" and cfg.runtime.max_steps_per_node == 30
    assert meta["command"].endswith(f"--single-checkpoint {tmp_path}/warm-single --set warm_start.mode=checkpoint "
                                    f"--set warm_start.checkpoint={tmp_path}/warm-recursive")


def test_a_named_variant_has_its_own_record_and_campaigns(monkeypatch):
    """`--name textcraft-tier1-async` (with algo.max_staleness=1) writes its own record and runs its
    own campaigns, per seed, so it overwrites neither the synchronous record nor resumes its campaigns."""
    import logging

    import research.experiment as fe

    seen, written = [], []

    def campaign(params):
        seen.append(params.name)
        return {"mlflow_run_id": "x", "warm_start": {"checkpoint_local": "/ck"}, "base_eval": [], "iterations": []}

    monkeypatch.setattr(fe, "rao_campaign", campaign)
    monkeypatch.setattr(fe, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(fe, "write_results", lambda experiment, rows, meta, *a, **k: (
        written.append((experiment, meta["command"])), {"markdown": "", "record": {}})[1])
    for seed in (None, 1):
        fe.rao_experiment.fn(fe.ExperimentParams(experiment="textcraft-tier1", config="configs/experiment-textcraft-"
                                                 "tier1.yaml", arms=["recursive"], name="textcraft-tier1-async",
                                                 seed=seed, overrides=["algo.max_staleness=1"], write_docs=False))
    fe.rao_experiment.fn(fe.ExperimentParams(experiment="textcraft-tier1", config="configs/experiment-textcraft-"
                                             "tier1.yaml", arms=["recursive"], seed=1, write_docs=False))
    assert seen == ["textcraft-tier1-async-recursive", "textcraft-tier1-async-seed1-recursive",
                    "textcraft-tier1-seed1-recursive"]
    assert [w[0] for w in written] == ["textcraft-tier1-async", "textcraft-tier1-async-seed1", "textcraft-tier1-seed1"]
    assert written[1][1].endswith("--seed 1 --arm recursive --name textcraft-tier1-async --set algo.max_staleness=1")
    with pytest.raises(ValueError, match="name"):
        fe.ExperimentParams(name="Tier1 async")


def _record(seed, outcomes):
    """A record with last points per arm from ``outcomes``: {(arm, iteration): [0/1 per task]}."""
    from research.designs import ARM_MODES

    pts = [{"arm": a, "iteration": i, "difficulty": "tier1x2", "mode": ARM_MODES[a], "n": len(v),
            "successes": float(sum(v)), "success": sum(v) / len(v), "per_task": {f"t{k}": x for k, x in enumerate(v)}}
           for (a, i), v in outcomes.items()]
    return {"seed": seed, "experiment": "abl", "points": pts,
            "endpoint": {"arm": "recursive", "against": "outcome"}}


def test_rerun_comparison_pairs_the_same_tasks_of_two_runs_by_hand():
    """Two runs of one seed: per point the successes, the discordant tasks each way and McNemar's exact test."""
    from research.records import rerun_comparison, rerun_markdown

    # 10 tasks; iteration 2: run 1 solves t0-t5, run 2 solves t0-t1 and t6: 4 tasks only run 1, 1 only run 2
    a = _record(0, {("recursive", 2): [1] * 6 + [0] * 4, ("recursive", 0): [1] * 3 + [0] * 7})
    b = _record(1, {("recursive", 2): [1, 1, 0, 0, 0, 0, 1, 0, 0, 0], ("single", 2): [1] * 10})
    out = rerun_comparison(a, b)  # another training seed, the same held-out tasks: allowed
    assert len(out["rows"]) == 1  # iteration 0 only in run 1, the single arm only in run 2: nothing to pair
    assert out["unmatched"] == [("recursive", 0, "recursive", "tier1x2"), ("single", 2, "single", "tier1x2")]
    r = out["rows"][0]
    assert (r["n"], r["first"], r["second"], r["second_better"], r["first_better"]) == (10, 6, 3, 1, 4)
    assert r["p_two_sided"] == pytest.approx(2 * (1 + 5) / 2 ** 5)  # P(X <= 1 | 5, 1/2) = 6/32, doubled
    md = rerun_markdown(a, b, ("a.json", "b.json"))
    assert "| recursive | 2 | recursive | tier1x2 | 10 | 6/10 |" in md
    assert "Not paired (in one record only): recursive 0 recursive tier1x2; single 2 single tier1x2." in md
    # a checkpoint study's point (no iteration: its checkpoint's) pairs with the experiment's point of that iteration
    study = {"eval_seed": None, "points": [{**b["points"][0], "checkpoint_iteration": 2, "k": 2}]}
    del study["points"][0]["iteration"]
    assert rerun_comparison(a, study)["rows"][0]["second_better"] == 1
    with pytest.raises(ValueError, match="did not evaluate the same tasks \\(eval_seed"):
        rerun_comparison(a, {**b, "eval_seed": 7})
    with pytest.raises(ValueError, match="no point of the first record"):
        rerun_comparison(a, _record(0, {("outcome", 2): [1] * 10}))
    with pytest.raises(ValueError, match="other than 0 and 1"):
        rerun_comparison(a, _record(0, {("recursive", 2): [0.5] * 10}))


def test_seed_comparison_pairs_tasks_across_seeds_by_hand():
    from research.records import comparisons_markdown, seed_comparison

    # 10 tasks, 3 seeds; recursive solves tasks 0-5 in every seed, outcome solves 0-1 (seed 0, 1) or 0-2 (seed 2)
    recs = [_record(s, {("recursive", 2): [1] * 6 + [0] * 4, ("recursive", 0): [1] * 2 + [0] * 8,
                        ("outcome", 2): [1] * (2 + (s == 2)) + [0] * (8 - (s == 2))}) for s in (0, 1, 2)]
    c = seed_comparison(recs, "recursive", "outcome", "tier1x2")
    # per seed: 0.6 - 0.2, 0.6 - 0.2, 0.6 - 0.3; tasks 2-5 better on average (task 2: (1 + 1 + 0) / 3 > 0)
    assert [round(s["difference"], 2) for s in c["per_seed"]] == [0.4, 0.4, 0.3]
    assert (c["tasks_paired"], c["tasks_arm_better"], c["tasks_against_better"]) == (10, 4, 0)
    assert c["p_tasks_sign_test"] == pytest.approx(0.5 ** 4)  # 4 of 4 non-zero tasks better: 1/16
    assert c["pooled"] == {"arm": [18.0, 30], "against": [7.0, 30]}
    assert c["mean_difference"] == pytest.approx(1.1 / 3) and c["difference_range"] == pytest.approx([0.3, 0.4])
    assert c["supported"] is False  # p = 0.0625 >= 0.05: not supported, whatever the seeds say
    w = seed_comparison(recs, "recursive", "warm_start", "tier1x2")
    assert w["tasks_arm_better"] == 4 and w["p_tasks_sign_test"] == pytest.approx(0.0625)
    # one seed going the other way fails the preregistered rule even with a small p over tasks
    recs2 = [_record(s, {("recursive", 2): [1] * 8 + [0] * 2, ("outcome", 2): [0] * 10}) for s in (0, 1)]
    recs2.append(_record(2, {("recursive", 2): [0] * 10, ("outcome", 2): [1] * 2 + [0] * 8}))
    c2 = seed_comparison(recs2, "recursive", "outcome", "tier1x2")
    assert c2["tasks_arm_better"] == 8 and c2["p_tasks_sign_test"] < 0.05 and c2["supported"] is False
    md = comparisons_markdown("abl", recs)
    assert "| recursive vs outcome (preregistered) | 3 |" in md and "| recursive vs warm_start | 3 |" in md
    assert seed_comparison([_record(0, {("single", 1): [1]})], "recursive", "outcome", "tier1x2") is None


def test_the_next_arm_shares_the_warm_start_s_s3_copy_when_its_folder_is_on_another_machine(tmp_path):
    """The outcome arm starts from the recursive arm's iteration-0 checkpoint: its folder while it is a
    checkpoint here, its S3 copy when the recursive campaign ran on a machine that kept the folder."""
    from research.experiment import shared_warm_start

    here = tmp_path / "iter-0"
    here.mkdir()
    (here / "config.json").write_text("{}")
    uri = "s3://rao/textcraft-deeper-recursive/iter-0/checkpoint"
    assert shared_warm_start({"checkpoint_local": str(here), "checkpoint_uri": uri}) == str(here)
    assert shared_warm_start({"checkpoint_local": str(tmp_path / "gone"), "checkpoint_uri": uri}) == uri
    assert shared_warm_start({"checkpoint_local": None, "checkpoint_uri": uri}) == uri
    assert shared_warm_start({"checkpoint_local": "/ck/x"}) == "/ck/x"  # no S3 copy recorded: the path as it was
    assert shared_warm_start({}) is None
