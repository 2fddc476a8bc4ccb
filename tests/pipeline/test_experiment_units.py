"""An experiment as units (research/units.py): the plan, the status, the record written only at a unit's end, and a
tiny unit run from an empty RAO_HOME (real vLLM, marked as the campaign tests are)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from tests.cli import one_error_line, run_cli

DEEPER = "configs/experiment-textcraft-deeper.yaml"


def test_status_lists_the_units_of_textcraft_deeper_with_their_times(capsys):
    """`rao experiment textcraft-deeper --status`: the two warm-start units first (the next command is the recursive
    one's), the nine arm x seed units, each with its estimate in minutes (from the config and research.units.Pace:
    warm-recursive = 20 demonstrations x 1 epoch x 16 s + 120 s + a vLLM start 160 s + 200 trees x 7.5 s = 35 min),
    none over 100 min; the 12 iterations first preregistered are flagged."""
    code, out, err = run_cli(capsys, "experiment", "textcraft-deeper", "--status")
    assert code == 0, err
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.split() and ln.split()[0].endswith(
        ("-recursive", "-single", "-seed0", "-seed1", "-seed2"))}
    assert list(rows) == ["warm-recursive", "warm-single"] + [f"{a}-seed{s}" for a in ("recursive", "outcome", "single")
                                                              for s in (0, 1, 2)]
    assert rows["warm-recursive"].split()[1:5] == ["to", "do", "35", "est."]
    # single: 20 x 4 epochs x 16 s + 120 + 160 + 200 trees x 7.5 x 1.5 = 64 min
    assert rows["warm-single"].split()[3] == "64"
    # outcome: 320 s SFT + 120 + campaign (160 + 3 x (48 x 4.0 + 283 + 82)) + an evaluation point (160 + 1500) = 66 min
    assert rows["outcome-seed0"].split()[3] == "66" and rows["outcome-seed0"].split()[5] == "93"
    assert "next: rao experiment textcraft-deeper --unit warm-recursive" in out
    assert "every unit's time is within 100 min" in out and "OVER" not in out
    assert "done: 0 of 11" in out and "research.units.Pace" in out
    # the design first preregistered: 12 iterations per arm and seed do not fit a unit
    code, out, err = run_cli(capsys, "experiment", "textcraft-deeper", "--status", "--set", "iterations=12",
                             "--set", "eval.every=6")
    assert code == 0, err
    over = [ln.split()[0] for ln in out.splitlines() if "OVER 100 min" in ln]
    assert over == [f"{a}-seed{s}" for a in ("recursive", "outcome", "single") for s in (0, 1, 2)]
    assert "units over 100 min: recursive-seed0," in out
    assert "next: rao experiment textcraft-deeper --unit warm-recursive --set iterations=12 --set eval.every=6" in out


def test_an_arm_shares_its_warm_start_unit_s_evaluation_only_where_it_is_the_same():
    """An arm unit takes its iteration 0 from the warm-start unit only when that unit evaluated as the arm does (the
    same modes and runtime): every textcraft-deeper arm does; textcraft-tier1's single arm, which starts from the
    recursive warm start but evaluates in single mode with a whole tree's steps, evaluates its own (its estimate
    holds that point: 12 min more than with the shared one)."""
    from research.units import estimate_unit, plan_units

    deeper = plan_units("textcraft-deeper", DEEPER)
    assert all(deeper.shares_warm_eval.values()) and len(deeper.shares_warm_eval) == 9
    tier1 = plan_units("textcraft-tier1", "configs/experiment-textcraft-tier1.yaml")
    assert tier1.shares_warm_eval == {"recursive-seed0": True, "single-seed0": False}
    single = estimate_unit(tier1, tier1.unit("single-seed0"))
    assert single["total"] == single["total_if_differs"] > single["warm_start"] + single["campaign"] + 2 * 160


def test_a_bad_unit_is_one_error_line_before_anything_runs(capsys, no_server):
    code, _, err = run_cli(capsys, "experiment", "textcraft-deeper", "--unit", "recursive-seed7")
    assert code == 2
    assert one_error_line(err).startswith("error: --unit 'recursive-seed7': no such unit of textcraft-deeper (units: "
                                          "warm-recursive, warm-single, recursive-seed0")


def _tiny_plan(model: Path, extra: list[str] = ()):
    from research.designs import UnitDesign
    from research.units import plan_units

    ov = {"serving.max_model_len": 2048, "runtime.context_window": 2048, "runtime.max_new_tokens": 256,
          "runtime.max_steps_per_node": 5, "runtime.max_depth": 1, "runtime.tree_timeout_s": 120,
          "tasks.pool_size": 4, "tasks.tasks_per_iteration": 2, "tasks.difficulties": ["easy"], "algo.G": 2,
          "iterations": 1, "model.path": str(model), "warm_start.mode": "demos", "warm_start.n_tasks": 2,
          "warm_start.difficulties": ["easy"], "warm_start.trainer.micro_batch_tokens": 4096,
          "eval.n_tasks": 2, "eval.difficulties": ["easy"], "trainer.loss_type": "ppo", "trainer.lr": 1e-3,
          "trainer.micro_batch_tokens": 4096, "trainer.dtype": "float32", "tracking.max_traces_per_iteration": 8}
    # the tiny model trains in fp32, as the served copy of the vLLM tests is
    return plan_units("tiny-units", "configs/cpu-smoke.yaml", [f"{k}={json.dumps(v)}" for k, v in ov.items()]
                      + list(extra), UnitDesign(arms=("recursive",), seeds=(0,)))


def _row(status: str, unit: str) -> list[str]:
    """The words of ``unit``'s row of a status text."""
    (row,) = [ln.split() for ln in status.splitlines() if ln.split()[:1] == [unit]]
    return row


def _checkpoint(folder: Path, weights: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)


def test_a_killed_unit_leaves_no_record_and_runs_again_from_its_start(tmp_path, monkeypatch):
    """A unit killed in its campaign writes no record (status: to do); the next run removes the killed attempt's
    campaign (its local folder and its S3 objects) and starts a new one from a rebuilt warm start; the record,
    written at the end, holds the rebuilt and the recorded warm start's sha256 (they differ: false, and the unit
    evaluated its own warm start, iteration 0, as well as its last checkpoint); a write killed before its
    os.replace leaves the old state."""
    import hashlib

    import flows.campaign
    import infra.storage
    import research.units as ru

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    _checkpoint(tmp_path / "model", b"base")
    plan = _tiny_plan(tmp_path / "model")
    built, campaigns, deleted, evaluated = [], [], [], []
    monkeypatch.setattr(ru, "build_warm_start", lambda cfg, out, say: (
        built.append(out), _checkpoint(out, b"rebuilt"), {"sft_steps": 1, "demo_s": 1.0, "sft_s": 2.0})[2])

    def killed(params):
        campaigns.append(params.name)
        (ru.rao_home() / "campaigns" / params.name / "checkpoints").mkdir(parents=True)
        raise KeyboardInterrupt  # the machine went away mid-campaign

    class Store:
        def __init__(self, s3, name):
            self.name = name

        def list(self):
            return [f"iter-0/{self.name}"]

        def delete(self, key):
            deleted.append(key)

    monkeypatch.setattr(flows.campaign, "rao_campaign", killed)
    @contextlib.contextmanager
    def storage(cfg):
        yield None

    monkeypatch.setattr(flows.campaign, "storage", storage)
    monkeypatch.setattr(infra.storage, "ArtifactStore", Store)
    root = tmp_path / "repo"
    ref = ru.record_path("tiny-units", "warm-recursive", root)
    ru.write_record(ref, {"complete": True, "wall_s": 60.0, "warm_start": {"sha256": "0" * 64}})
    with pytest.raises(KeyboardInterrupt):
        ru.run_unit(plan, "recursive-seed0", root=root, say=lambda m: None)
    assert not ru.record_path("tiny-units", "recursive-seed0", root).exists()
    assert _row(ru.status_text(plan, root), "recursive-seed0")[:3] == ["recursive-seed0", "to", "do"]
    first = campaigns[0]

    def campaign(params):
        campaigns.append(params.name)
        assert "warm_start.mode=checkpoint" in params.overrides and "eval.enabled=false" in params.overrides
        assert f"warm_start.checkpoint={built[-1]}" in params.overrides and "seed=0" in params.overrides
        last = tmp_path / "iter-1"
        _checkpoint(last, b"trained")
        return {"iterations": [{"iteration": 1, "checkpoint_local": str(last), "metrics": {"success/root": 0.5}}],
                "timeline": {"rows": []}, "guard": {"stopped_at": None}}

    monkeypatch.setattr(flows.campaign, "rao_campaign", campaign)
    monkeypatch.setattr(ru, "evaluate_checkpoints", lambda cfg, todo, say, control=None, tasks=None: (
        evaluated.append([i for i, _ in todo]),
        [{"iteration": i, "difficulty": "easy", "per_task": {"t0": 1.0}} for i, _ in todo], {"evaluate_s": 1.0})[1:])
    rec = ru.run_unit(plan, "recursive-seed0", root=root, say=lambda m: None)
    assert deleted == [f"iter-0/{first}"] and not (ru.rao_home() / "campaigns" / first).exists()
    assert len(campaigns) == 2 and campaigns[1] != first and len(built) == 2
    on_disk = json.loads(ru.record_path("tiny-units", "recursive-seed0", root).read_text())
    assert on_disk == json.loads(json.dumps(rec, default=str)) and rec["complete"] is True
    rebuilt = hashlib.sha256(b"rebuilt").hexdigest()
    assert (rec["warm_start"]["sha256"], rec["started_from_sha256"]) == (rebuilt, rebuilt)
    assert rec["warm_start_reference_sha256"] == "0" * 64 and rec["warm_start_sha256_matches"] is False
    assert rec["warm_start"]["base_model_sha256"] == hashlib.sha256(b"base").hexdigest()
    assert rec["last_checkpoint_sha256"] == hashlib.sha256(b"trained").hexdigest()
    assert evaluated == [[0, 1]] and [p["iteration"] for p in rec["points"]] == [0, 1]
    assert rec["command"] == plan.command("recursive-seed0") and rec["config_values"]["seed"] == 0
    assert set(rec["stages"]) >= {"warm_start_s", "campaign_s", "total_s"} and rec["commit"] != "unknown"
    assert _row(ru.status_text(plan, root), "recursive-seed0")[:5] == ["recursive-seed0", "done,", "warm", "start",
                                                                      "differs"]
    # the rebuilt warm start matches the record: no iteration-0 evaluation in the unit
    ru.write_record(ref, {"complete": True, "wall_s": 60.0, "warm_start": {"sha256": rebuilt}})
    rec = ru.run_unit(plan, "recursive-seed0", root=root, say=lambda m: None)
    assert rec["warm_start_sha256_matches"] is True and evaluated[-1] == [1]
    # a write killed before its os.replace: the record on disk is the one before
    before = ru.record_path("tiny-units", "recursive-seed0", root).read_text()
    monkeypatch.setattr(ru.os, "replace", lambda a, b: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        ru.write_record(ru.record_path("tiny-units", "recursive-seed0", root), {"complete": False})
    assert ru.record_path("tiny-units", "recursive-seed0", root).read_text() == before


@pytest.mark.vllm
@pytest.mark.services
@pytest.mark.slow
def test_a_tiny_unit_runs_from_an_empty_rao_home_and_writes_its_record(tmp_path, tiny_model_path, s3_server,
                                                                       prefect_harness, monkeypatch):
    """The tiny experiment's arm unit with RAO_HOME an empty folder (no var/): it builds its warm start (real
    demonstrations and SFT), runs its campaign (real vLLM, one RL iteration), evaluates its warm start (no
    warm-start record yet) and its last checkpoint, and writes its record; --status then lists it as done."""
    import rao_core.evaluation  # noqa: F401  (binds the real run_trees: the evaluations are the model's own)
    import research.units as ru
    from tests.pipeline.test_campaign import _mixed

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("RAO_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for k, v in s3_server.settings().env().items():
        monkeypatch.setenv(k, v)
    _mixed(monkeypatch)  # rollout 0 of each group from the scripted expert: the update is a real one
    plan = _tiny_plan(tiny_model_path)
    root = tmp_path / "repo"
    rec = ru.run_unit(plan, "recursive-seed0", root=root, say=print)
    path = ru.record_path("tiny-units", "recursive-seed0", root)
    assert json.loads(path.read_text()) == json.loads(json.dumps(rec, default=str))
    assert rec["warm_start_sha256_matches"] is None and rec["warm_start_reference_sha256"] is None
    assert rec["warm_start"]["sha256"] == ru.weights_sha256(home / "units/tiny-units/recursive-seed0/warm-start")
    assert rec["warm_start"]["base_model_sha256"] == ru.weights_sha256(tiny_model_path)
    assert [(p["iteration"], p["difficulty"], p["n"], len(p["per_task"])) for p in rec["points"]] == [
        (0, "easy", 2, 2), (1, "easy", 2, 2)]
    assert rec["points"][0]["checkpoint_sha256"] == rec["warm_start"]["sha256"]
    assert rec["points"][1]["checkpoint_sha256"] == rec["last_checkpoint_sha256"] != rec["warm_start"]["sha256"]
    assert [t["iteration"] for t in rec["training"]] == [1] and rec["iterations"] == 1
    assert rec["stages"]["total_s"] == rec["wall_s"] > rec["stages"]["campaign_s"] > 0
    status = ru.status_text(plan, root)
    assert _row(status, "recursive-seed0")[:2] == ["recursive-seed0", "done"]
    assert "next: rao experiment tiny-units --config configs/cpu-smoke.yaml --unit warm-recursive" in status
    assert not list(path.parent.glob(".*.tmp")) and os.stat(path).st_mode & 0o077 == 0


def test_the_seeds_and_the_verdict_are_read_from_the_unit_records(tmp_path):
    """research.units.seed_records assembles textcraft-deeper's unit records into one record per seed: each arm
    unit's last point and, as its iteration 0, the warm-start unit's evaluation, or the unit's own where its rebuilt
    warm start differed (seed 2's recursive unit here); the control's points are left out. The preregistered verdict
    is computed from them: recursive 60/100 on nest2 at iteration 3 vs 10/100 at its warm start and vs the single
    agent's 20/100, in every seed: supported."""
    import research.units as ru
    from research.experiment import write_seeds_section

    plan = ru.plan_units("textcraft-deeper", DEEPER)

    def point(it, diff, mode, solved, **extra):
        return {"iteration": it, "difficulty": diff, "mode": mode, "n": 100, "successes": float(solved),
                "success": solved / 100, "ci95": [0.0, 1.0], "depth_hist": {"0": 100 - solved, "2": solved},
                "per_task": {f"{diff}-{i}": float(i < solved) for i in range(100)}, **extra}

    def write(unit, points, **extra):
        ru.write_record(ru.record_path("textcraft-deeper", unit, tmp_path),
                        {"unit": unit, "complete": True, "wall_s": 3000.0, "points": points, **extra})

    write("warm-recursive", [point(0, d, "recursive", 10) for d in ("nest1", "nest2")])
    write("warm-single", [point(0, d, "single", 5) for d in ("nest1", "nest2")])
    for s in (0, 1, 2):
        own = [point(0, d, "recursive", 12) for d in ("nest1", "nest2")] if s == 2 else []
        write(f"recursive-seed{s}", own + [point(3, d, "recursive", 60) for d in ("nest1", "nest2")]
              + [point(3, "nest2", "recursive", 30, control=True)], warm_start_sha256_matches=s != 2)
        write(f"single-seed{s}", [point(3, d, "single", 20) for d in ("nest1", "nest2")],
              warm_start_sha256_matches=True)
    recs = ru.seed_records(plan, tmp_path)
    assert [(r["experiment"], r["seed"], r["arms"]) for r in recs] == [
        ("textcraft-deeper", 0, ["recursive", "single"]), ("textcraft-deeper-seed1", 1, ["recursive", "single"]),
        ("textcraft-deeper-seed2", 2, ["recursive", "single"])]
    nest2 = {(p["arm"], p["iteration"]): p["successes"] for p in recs[2]["points"] if p["difficulty"] == "nest2"}
    assert nest2 == {("recursive", 0): 12.0, ("recursive", 3): 60.0, ("single", 0): 5.0, ("single", 3): 20.0}
    assert recs[0]["endpoint"]["against"] == "warm_start" and len(recs[0]["points"]) == 8
    (tmp_path / "docs/results.md").write_text("# Results\n")
    md = write_seeds_section("textcraft-deeper", recs, root=tmp_path)
    verdict = json.loads((tmp_path / "docs/results/textcraft-deeper-verdict.json").read_text())
    assert "Depth-limited control per seed" not in md  # no control given: read from files, none there
    md = write_seeds_section("textcraft-deeper", recs, root=tmp_path, controls=ru.control_records(plan, recs, tmp_path))
    verdict = json.loads((tmp_path / "docs/results/textcraft-deeper-verdict.json").read_text())
    assert verdict["verdict"] == "supported" and "Preregistered verdict" in md
    # the control: each recursive unit's 30/100 at max_depth 1 vs its 60/100 at full depth on the same problems
    assert "### Depth-limited control per seed" in md and "| 0 | 3 | 60/100" in md
    ctrl = verdict["control"]
    assert (ctrl["seeds"], ctrl["full"], ctrl["control"], ctrl["depth_shown"]) == ([0, 1, 2], [180, 300], [90, 300],
                                                                                    True)
    assert [p["holds"] for p in verdict["primaries"]] == [True, True]


SMOKE = "configs/cpu-smoke.yaml"


def _variant_design(**extra):
    from research.designs import UnitDesign

    return UnitDesign(arms=("recursive",), seeds=(0, 1), variants={
        "slow": ("trainer.lr=1.0e-5",),
        "fast-mb4": ("trainer.lr=1.0e-4", "trainer.steps_per_batch=4", "trainer.max_grad_norm=0.5")}, **extra)


def test_a_design_with_variants_has_a_unit_per_variant_and_seed_each_with_its_overrides():
    """Config variants of one arm (a sweep): the arm's warm start, then <variant>-seed<S> in the design's order, each
    config carrying its variant's overrides after the command's --set (which does not undo them) and its seed's;
    every variant starts from the one warm start and shares its evaluation. The estimate counts passes over the
    batch, however many minibatches: the 4-minibatch variant is estimated as the one-step one, 41 min (32 x 2 x 16 s
    SFT + 120 + a vLLM start 160 + 2 x (24 trees x 4.0 + 283 + 82) + an evaluation point 160 + 8 x 7.5)."""
    from research.units import estimate_unit, plan_units, status_text, unit_overrides

    plan = plan_units("tiny-sweep", SMOKE, ["trainer.lr=5.0e-5"], _variant_design())
    assert [u.name for u in plan.units] == ["warm-recursive", "slow-seed0", "slow-seed1", "fast-mb4-seed0",
                                            "fast-mb4-seed1"]
    assert [(u.arm, u.variant, u.seed, u.warm, u.label) for u in plan.units[3:]] == [
        ("recursive", "fast-mb4", 0, "recursive", "fast-mb4"), ("recursive", "fast-mb4", 1, "recursive", "fast-mb4")]
    t = {name: cfg.trainer for name, cfg in plan.configs.items()}
    assert (t["slow-seed1"].lr, t["slow-seed1"].steps_per_batch, t["slow-seed1"].max_grad_norm) == (1e-5, 1, 1.0)
    mb4 = t["fast-mb4-seed0"]
    assert (mb4.lr, mb4.steps_per_batch, mb4.max_grad_norm) == (1e-4, 4, 0.5)
    assert t["warm-recursive"].lr == 5e-5  # the warm start's config: the command's --set, no variant's
    assert (plan.configs["fast-mb4-seed1"].seed, t["fast-mb4-seed1"].seed) == (1, 1)
    ov = unit_overrides(plan, plan.unit("fast-mb4-seed1"), checkpoint="/w")
    assert ov.index("trainer.lr=5.0e-5") < ov.index("trainer.lr=1.0e-4") < ov.index("seed=1")
    assert "warm_start.checkpoint=/w" in ov and "eval.enabled=false" in ov
    assert plan.shares_warm_eval == {u.name: True for u in plan.units[1:]}
    slow, fast = (estimate_unit(plan, plan.unit(n)) for n in ("slow-seed0", "fast-mb4-seed0"))
    assert slow == fast and round(fast["total"] / 60) == 41
    status = status_text(plan)
    assert "5 units (1 warm start(s) with their evaluation, 4 variant x seed)" in status
    assert "variants (each the recursive arm from warm-recursive, with these overrides):" in status
    assert "\n  fast-mb4         trainer.lr=1.0e-4 trainer.steps_per_batch=4 trainer.max_grad_norm=0.5\n" in status
    assert _row(status, "fast-mb4-seed1")[1:5] == ["to", "do", "41", "est."]
    assert ("next: rao experiment tiny-sweep --config configs/cpu-smoke.yaml --unit warm-recursive "
            "--set trainer.lr=5.0e-5") in status


def test_a_design_s_variants_are_checked_when_it_is_made():
    from research.designs import UnitDesign

    with pytest.raises(ValueError, match="a design with variants has one arm"):
        UnitDesign(arms=("recursive", "single"), variants={"a": ("trainer.lr=1.0e-5",)})
    for bad in ("Lr1", "warm-x", "a b", "-a", ""):
        with pytest.raises(ValueError, match="not a variant name"):
            UnitDesign(arms=("recursive",), variants={bad: ("trainer.lr=1.0e-5",)})
    with pytest.raises(ValueError, match="override 'trainer.lr' is not KEY=VALUE"):
        UnitDesign(arms=("recursive",), variants={"a": ("trainer.lr",)})
    with pytest.raises(ValueError, match="has no depth-limited control"):
        UnitDesign(arms=("recursive",), eval_on_training=True, depth_control=("recursive",))
    assert list(UnitDesign(arms=("recursive",), variants={"lr1e-5-mb1": ("trainer.lr=1.0e-5",)}).variants) == [
        "lr1e-5-mb1"]


def test_a_design_on_training_split_problems_evaluates_one_set_that_no_unit_trains_on(tmp_path, monkeypatch):
    """eval_on_training: every unit evaluates the same 100 training-split problems, none of them in any unit's RL
    pool or demonstrations (seeds 0 and 1: two pools), where the plain draw of the same config shares problems with
    training; the config must say eval.split train and no unit may evaluate otherwise. The warm-start unit and a
    variant unit evaluate the plan's tasks; the variant's campaign gets its overrides, its record names the variant,
    and the seed records label its points with it (iteration 0 from the warm-start unit's record: the same weights)."""
    import flows.campaign
    import research.units as ru
    from rao_core.task_sampling import task_identity
    from rao_core.task_sets import check_task_sets, training_problems

    _checkpoint(tmp_path / "model", b"base")
    sets = ["eval.split=train", "eval.n_tasks=100", f"model.path={tmp_path / 'model'}"]
    plan = ru.plan_units("tiny-sweep", SMOKE, sets, _variant_design(eval_on_training=True))
    tasks = plan.eval_tasks
    ids = {task_identity(t) for t in tasks}
    assert len(tasks) == len(ids) == 100 and {(t.split, t.difficulty) for t in tasks} == {("train", "tier1")}
    trained = set().union(*(training_problems(cfg) for cfg in plan.configs.values()))
    assert not ids & trained and trained > training_problems(plan.configs["slow-seed0"])  # seed 1's pool too
    with pytest.raises(ValueError, match=r"evaluation \(eval.seed 1234\) and training \(seed 0\) share \d+ task"):
        check_task_sets(plan.configs["slow-seed0"])  # the plain draw of the same config
    assert ru.plan_units("tiny-sweep", SMOKE, sets, _variant_design(eval_on_training=True)).eval_tasks == tasks
    assert ("evaluation set: 100 problems of the training split (eval.seed 1234, tier1, recursive mode), none of them "
            "in any unit's RL task pool or demonstrations") in ru.status_text(plan, tmp_path)
    with pytest.raises(ValueError, match="eval.split is 'validation'; set eval.split: train"):
        ru.plan_units("tiny-sweep", SMOKE, sets[1:], _variant_design(eval_on_training=True))
    from research.designs import UnitDesign

    with pytest.raises(ValueError, match="unit b-seed0's eval section differs from unit warm-recursive's"):
        ru.plan_units("tiny-sweep", SMOKE, sets, UnitDesign(arms=("recursive",), seeds=(0,), eval_on_training=True,
                                                             variants={"b": ("eval.n_tasks=50",)}))
    # the units: the warm start, then a variant from it, each evaluating the plan's tasks
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    evaluated, campaigns = [], []
    monkeypatch.setattr(ru, "build_warm_start", lambda cfg, out, say: (
        _checkpoint(out, b"rebuilt"), {"sft_steps": 1, "demo_s": 1.0, "sft_s": 2.0})[1])
    monkeypatch.setattr(ru, "evaluate_checkpoints", lambda cfg, todo, say, control=None, tasks=None: (
        evaluated.append(([i for i, _ in todo], tasks)),
        [{"iteration": i, "difficulty": "tier1", "mode": "recursive", "per_task": {t.task_id: float(i > 0)
                                                                                   for t in tasks}}
         for i, _ in todo], {"evaluate_s": 1.0})[1:])

    def campaign(params):
        campaigns.append(params)
        last = tmp_path / "iter-2"
        _checkpoint(last, b"trained")
        return {"iterations": [{"iteration": 2, "checkpoint_local": str(last), "metrics": {}}],
                "timeline": {"rows": []}, "guard": None}

    monkeypatch.setattr(flows.campaign, "rao_campaign", campaign)
    root = tmp_path / "repo"
    warm = ru.run_unit(plan, "warm-recursive", root=root, say=lambda m: None)
    rec = ru.run_unit(plan, "fast-mb4-seed1", root=root, say=lambda m: None)
    assert [(its, got is tasks) for its, got in evaluated] == [([0], True), ([2], True)]
    assert warm["eval_on_training"] is True and warm["variant"] is None
    assert (rec["variant"], rec["variant_overrides"], rec["seed"]) == (
        "fast-mb4", ["trainer.lr=1.0e-4", "trainer.steps_per_batch=4", "trainer.max_grad_norm=0.5"], 1)
    assert rec["warm_start_sha256_matches"] is True and rec["config_values"]["trainer"]["steps_per_batch"] == 4
    (params,) = campaigns
    assert params.name.startswith("tiny-sweep-fast-mb4-seed1-") and "trainer.max_grad_norm=0.5" in params.overrides
    (seed1,) = ru.seed_records(plan, root)
    assert (seed1["seed"], seed1["arms"]) == (1, ["fast-mb4"])
    assert [(p["arm"], p["iteration"], sum(p["per_task"].values())) for p in seed1["points"]] == [
        ("fast-mb4", 0, 0.0), ("fast-mb4", 2, 100.0)]
