"""``eval.every``: a campaign evaluates its held-out set after iteration 0, every iteration k with k % every == 0
and the last one (rao_core.evaluation.EvalConfig.evaluates). The schedule, the skipped ``evaluate`` stage
(tasks.stages.skip_evaluation), the collapse guard's walk to the last evaluated iteration of a lineage
(flows.campaign.guard_reference), registration (never champion) and the real campaign loops (synchronous with a
rollback, and overlapped) with the stages that need a model replaced by resumable fakes and S3 by an in-memory
store (no vLLM, no Prefect API, no SeaweedFS); and the experiment's table, record and plots with points at some
iterations only."""

from __future__ import annotations

import json
import logging

import pytest

from infra.stage_records import Checkpoint, EvalOutput, ValidateOutput
from rao_core.evaluation import EvalConfig
from tests.pipeline.campaign_fakes import MemoryStore, eval_output, eval_row, fake_campaign

MODEL = "rao-policy-every"
STEADY = [1, 0] * 10  # tier1 (the primary metric): 10/20 at every evaluation
SKILL = [1] * 18 + [0] * 2  # tier1x2: 18/20
LOST = [0] * 20


# --- the schedule -------------------------------------------------------------------------------------------


def test_the_schedule_is_iteration_0_the_multiples_of_every_and_the_last_iteration():
    assert EvalConfig(every=6).evaluated_iterations(12) == [0, 6, 12]
    assert EvalConfig(every=2).evaluated_iterations(5) == [0, 2, 4, 5]
    assert EvalConfig().every == 1 and EvalConfig().evaluated_iterations(4) == [0, 1, 2, 3, 4]  # today's behaviour
    assert EvalConfig(every=10).evaluated_iterations(3) == [0, 3] and EvalConfig(every=3).evaluated_iterations(0) == [0]
    ev = EvalConfig(every=6)
    assert [k for k in range(13) if not ev.evaluates(k, 12)] == [1, 2, 3, 4, 5, 7, 8, 9, 10, 11]
    assert [ev.next_evaluated(k, 12) for k in (0, 1, 5, 6, 11)] == [6, 6, 6, 12, 12]
    assert EvalConfig(every=4).next_evaluated(9, 10) == 10  # the last iteration comes before the next multiple


def test_every_below_1_is_one_error_naming_the_field():
    from rao_core.config import ConfigError, load_config
    from rao_core.paths import REPO_ROOT

    assert load_config(REPO_ROOT / "configs/cpu-smoke.yaml").eval.every == 1
    assert load_config(REPO_ROOT / "configs/cpu-smoke.yaml", {"eval.every": 6}).eval.every == 6
    for bad in (0, -2):
        with pytest.raises(ConfigError, match=r"eval\.every") as e:
            load_config(REPO_ROOT / "configs/cpu-smoke.yaml", {"eval.every": bad})
        assert "\n" not in str(e.value) and "greater than or equal to 1" in str(e.value)


def test_an_old_evaluate_marker_loads_as_evaluated():
    old = {"metrics": {"eval/recursive/easy/success": 0.5}, "rows": [], "report_uri": "s3://x", "_stage_s": 3.0}
    rec = EvalOutput.model_validate(old)
    assert rec.evaluated is True and rec.trained_from is None and rec.stage_s == 3.0
    stored = json.loads(EvalOutput(evaluated=False, trained_from=4).model_dump_json(by_alias=True, exclude={"resumed"}))
    assert stored["evaluated"] is False and stored["trained_from"] == 4


# --- the skipped stage, the guard's walk, registration ------------------------------------------------------


def _eval(tier1x2: list[int]) -> EvalOutput:
    return eval_output([eval_row("tier1", STEADY), eval_row("tier1x2", tier1x2)])


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    """A RunContext of a 12-iteration campaign with ``eval.every`` 6 on an in-memory store."""
    from infra.stage_io import RunContext
    from rao_core.config import load_config
    from rao_core.paths import REPO_ROOT

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    store = MemoryStore("every")
    monkeypatch.setattr(RunContext, "store", lambda self: store)
    cfg = load_config(REPO_ROOT / "configs/cpu-smoke.yaml", {"name": "every", "iterations": 12, "eval.every": 6})
    return RunContext(config=cfg, s3={}, mlflow_uri="")


def _put_eval(ctx, k: int, out: EvalOutput) -> None:
    from infra.stage_io import done_key

    ctx.store().put_bytes(out.model_dump_json(by_alias=True, exclude={"resumed"}).encode(), done_key(k, "evaluate"))


def test_the_skipped_stage_writes_its_resumable_marker_and_one_line(ctx, caplog):
    from infra.stage_io import done_key, stored_record
    from tasks.stages import skip_evaluation

    with caplog.at_level(logging.INFO, logger="rao"):
        out = skip_evaluation.fn(ctx, 5, 4)
    assert (out.evaluated, out.trained_from, out.metrics, out.rows, out.resumed) == (False, 4, {}, [], False)
    assert "iteration 5: not evaluated (eval.every 6; next: iteration 6)" in caplog.messages
    assert ctx.store().exists(done_key(5, "evaluate"))
    stored = stored_record(ctx, 5, "evaluate", EvalOutput)
    assert (stored.evaluated, stored.trained_from, stored.rows) == (False, 4, [])
    again = skip_evaluation.fn(ctx, 5, 3)  # resumed: the marker's record, not a new one
    assert again.resumed and again.trained_from == 4


def test_the_guard_compares_iteration_6_with_iteration_0_when_1_to_5_were_skipped(ctx):
    from flows.campaign import guard_reference, guard_verdict

    val = ValidateOutput(samples_uri="s3://x")
    _put_eval(ctx, 0, _eval(SKILL))
    for k in range(1, 6):
        _put_eval(ctx, k, EvalOutput(evaluated=False, trained_from=k - 1))
    assert guard_reference(ctx, 5)[0] == 0 and guard_reference(ctx, 0)[0] == 0
    v = guard_verdict(ctx, 6, 5, _eval(LOST), val)
    assert (v.status, v.reference) == ("collapse", 0)  # 0.90 -> 0.00 against iteration 0, not "no reference"
    assert v.worst.rate_before == pytest.approx(0.9) and v.worst.lost == 18
    assert guard_verdict(ctx, 6, 5, _eval(SKILL), val).status == "pass"
    # a skipped iteration is not judged, whatever its lineage
    skipped = guard_verdict(ctx, 5, 4, EvalOutput(evaluated=False, trained_from=4), val)
    assert (skipped.status, skipped.reason, skipped.reference) == ("no_reference", "not evaluated: eval.every 6", None)
    assert guard_reference(ctx, None) is None and guard_reference(ctx, 9) is None  # no marker: nothing to compare


def test_the_walk_follows_what_a_skipped_iteration_trained_from_past_a_rolled_back_one(ctx):
    """Iteration 2 (evaluated) collapsed and was rolled back: iteration 3 trained from iteration 1's checkpoint.
    Iteration 4, trained from 3, is compared with iteration 0 (3 -> 1 -> 0), never with the collapsed 2."""
    from flows.campaign import guard_reference, guard_verdict

    _put_eval(ctx, 0, _eval(SKILL))
    _put_eval(ctx, 1, EvalOutput(evaluated=False, trained_from=0))
    _put_eval(ctx, 2, _eval(LOST))
    _put_eval(ctx, 3, EvalOutput(evaluated=False, trained_from=1))
    assert guard_reference(ctx, 3)[0] == 0 and guard_reference(ctx, 2)[0] == 2
    v = guard_verdict(ctx, 4, 3, _eval(LOST), ValidateOutput(samples_uri="s3://x"))
    assert (v.status, v.reference) == ("collapse", 0)  # compared with the collapsed 2 it would pass
    # a skipped record without trained_from (not written by this code) walks to the iteration before it
    _put_eval(ctx, 3, EvalOutput(evaluated=False))
    assert guard_reference(ctx, 3)[0] == 2


def test_a_skipped_iteration_is_registered_but_never_champion(tmp_path, monkeypatch, ctx):
    import mlflow

    from infra.tracking import configure_mlflow, ensure_experiment
    from tasks import tracking
    from tasks.stages import register_checkpoint

    configure_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        client = mlflow.MlflowClient()
        exp = ensure_experiment("every")
        name = tracking.registered_model_name(ctx.config)

        def register(k: int, metrics: dict, evaluated: bool):
            run = client.create_run(exp).info.run_id
            ckpt = Checkpoint(name=f"iter-{k}", uri=f"s3://rao/every/iter-{k}/checkpoint")
            return register_checkpoint.fn(ctx, k, ckpt, metrics, run, True, evaluated=evaluated)

        first = register(1, {}, False)  # no champion yet: an unscored version would become one if evaluated
        assert (first.version, first.champion) == ("1", False)
        assert tracking.alias_version(name, "champion") is None
        v = client.get_model_version(name, "1")
        assert v.tags["rao.evaluated"] == "false" and v.description.endswith("not evaluated (eval.every 6): "
                                                                             "never champion")
        metric = "eval/recursive/easy/success"
        assert register(2, {metric: 0.5}, True).champion  # an evaluated one moves it
        assert not register(3, {}, False).champion
        assert str(tracking.alias_version(name, "champion").version) == "2"
        assert "rao.evaluated" not in client.get_model_version(name, "2").tags
    finally:
        mlflow.set_tracking_uri(None)


# --- the campaign loops -----------------------------------------------------------------------------------


@pytest.fixture
def campaign(tmp_path, monkeypatch):
    """flows.campaign with fake stages (tests.pipeline.campaign_fakes.fake_campaign), the stages' lines recorded;
    yields ``run(outcomes, *overrides, iterations=5) -> (summary, record)``: ``outcomes`` maps an evaluated
    iteration to its tier1x2 outcomes; the record holds the lines logged, each iteration's parent checkpoint, the
    checkpoints served in order, the iterations the fake evaluation ran for, the eval metrics logged to each
    iteration's MLflow run and the store."""
    rec: dict = {"parents": {}, "served": [], "evaluated": [], "logged": {}}
    outcomes: dict[int, list[int]] = {}

    def evaluate(iteration: int) -> EvalOutput:
        rec["evaluated"].append(iteration)
        return _eval(outcomes[iteration])

    def iteration_of(ckpt: Checkpoint) -> int:  # every-iter-<k>-checkpoint
        return int(ckpt.name.split("-")[2])

    def train(iteration: int, parent: Checkpoint) -> None:
        rec["parents"][iteration] = iteration_of(parent)

    def log(k: int, ev: EvalOutput) -> None:
        rec["logged"][k] = dict(ev.metrics)

    with fake_campaign(monkeypatch, tmp_path, rec, "every", MODEL, evaluate, iterations=5, stage_lines=True,
                       on_train=train, on_serve=lambda ckpt: rec["served"].append(iteration_of(ckpt)),
                       on_log=log) as run:

        def run_with(evals: dict[int, list[int]], *overrides: str, iterations: int = 5):
            outcomes.clear()
            outcomes.update(evals)
            return run(*overrides, iterations=iterations)

        yield run_with


def _champion() -> str:
    from tasks import tracking

    return str(tracking.alias_version(MODEL, "champion").version)


def test_a_campaign_evaluates_on_its_schedule_and_the_guard_walks_past_skipped_and_rolled_back_ones(campaign):
    """5 iterations, every 2: evaluated 0, 2, 4, 5. Iteration 2 collapses against 0 (1 skipped) and is rolled
    back: iteration 3 trains from 1's checkpoint; iteration 4 trains from 3 and is compared with 0 (3 -> 1 -> 0)."""
    import mlflow

    from infra.stage_io import RunContext, stored_record

    summary, rec = campaign({0: SKILL, 2: LOST, 4: SKILL, 5: SKILL}, "eval.every=2")
    assert rec["evaluated"] == [0, 2, 4, 5]
    assert rec["parents"] == {1: 0, 2: 1, 3: 1, 4: 3, 5: 4}
    # iteration k serves its parent to generate and, when evaluated, its own checkpoint: 1 and 3 serve no new one
    assert rec["served"] == [0, 0, 1, 2, 1, 3, 4, 4, 5]
    assert "iteration 1: not evaluated (eval.every 2; next: iteration 2)" in rec["lines"]
    assert "iteration 3: not evaluated (eval.every 2; next: iteration 4)" in rec["lines"]
    ctx = RunContext(config=summary_config(), s3={}, mlflow_uri="")
    for k, parent in ((1, 0), (3, 1)):
        assert f"collapse guard: iteration {k} not judged (not evaluated: eval.every 2)" in rec["lines"]
        stored = stored_record(ctx, k, "evaluate", EvalOutput)
        assert (stored.evaluated, stored.trained_from, stored.rows, stored.metrics) == (False, parent, [], {})
    its = {it["iteration"]: it for it in summary["iterations"]}
    assert [it["evaluated"] for it in summary["iterations"]] == [False, True, False, True, True]
    assert [(it["guard"]["status"], it["guard"]["reference"]) for it in summary["iterations"]] == [
        ("no_reference", None), ("collapse", 0), ("no_reference", None), ("pass", 0), ("pass", 4)]
    assert its[1]["eval_rows"] == [] and its[1]["metrics"].get("eval/recursive/tier1/success") is None
    assert "evaluate" not in its[1]["times"] and "serve_new" not in its[1]["times"]
    assert rec["logged"][1] == {} and rec["logged"][3] == {}  # tasks.tracking.log_iteration gets no eval/ metric
    assert sorted(rec["logged"][4]) == ["eval/recursive/tier1/success", "eval/recursive/tier1x2/success"]
    assert [line.split(":")[1].strip().split(" ")[:2] for line in summary["guard"]["collapses"]] == [["iteration", "2"]]
    # v1 iteration 0 (champion), v2 iteration 1 (skipped), v3 iteration 2 (held), v4 iteration 3 (skipped), v5, v6
    assert [(it["register"]["version"], it["register"]["champion"]) for it in summary["iterations"]] == [
        ("2", False), ("3", False), ("4", False), ("5", True), ("6", True)]
    assert _champion() == "6"
    client = mlflow.MlflowClient()
    camp = summary["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(camp, "guard/collapsed")] == [2, 4, 5]

    from research.experiment import _rows

    assert sorted({r["iteration"] for r in _rows("recursive", summary)}) == [0, 2, 4, 5]


def test_a_resumed_campaign_neither_evaluates_nor_judges_a_skipped_iteration_again(campaign):
    summary, rec = campaign({0: SKILL, 2: SKILL, 4: SKILL, 5: SKILL}, "eval.every=2")
    assert rec["evaluated"] == [0, 2, 4, 5]
    rec["store"].objects.pop("_done/campaign.json")  # as if the run had stopped before its completion marker
    rec["evaluated"].clear()
    rec["served"].clear()
    again, rec = campaign({}, "eval.every=2")
    assert rec["evaluated"] == [] and rec["served"] == []  # every stage from its marker, no server
    assert [it["evaluated"] for it in again["iterations"]] == [it["evaluated"] for it in summary["iterations"]]
    assert [it["register"]["version"] for it in again["iterations"]] == ["2", "3", "4", "5", "6"]


def test_every_1_evaluates_every_iteration_as_before(campaign):
    summary, rec = campaign({k: SKILL for k in range(4)}, iterations=3)
    assert rec["evaluated"] == [0, 1, 2, 3]
    assert all(it["evaluated"] for it in summary["iterations"])
    assert [it["guard"]["reference"] for it in summary["iterations"]] == [0, 1, 2]
    assert not any("not evaluated" in line for line in rec["lines"])


def test_overlapped_iterations_skip_on_the_same_schedule(campaign):
    """algo.max_staleness 1: iteration e is evaluated in step e + 1, trained from e - 1; a skipped one stores
    trained_from e - 1 and the next evaluated one is compared with the last evaluated one."""
    from infra.stage_io import RunContext, stored_record

    summary, rec = campaign({0: SKILL, 2: SKILL, 4: LOST, 5: SKILL}, "eval.every=2", "algo.max_staleness=1",
                            "guard.action=warn")
    assert rec["evaluated"] == [0, 2, 4, 5]
    assert [it["evaluated"] for it in summary["iterations"]] == [False, True, False, True, True]
    assert [(it["guard"]["status"], it["guard"]["reference"]) for it in summary["iterations"]] == [
        ("no_reference", None), ("pass", 0), ("no_reference", None), ("collapse", 2), ("pass", 4)]
    ctx = RunContext(config=summary_config(), s3={}, mlflow_uri="")
    assert stored_record(ctx, 3, "evaluate", EvalOutput).trained_from == 2
    assert not any(it["register"]["champion"] for it in summary["iterations"] if not it["evaluated"])


def summary_config():
    from rao_core.config import load_config
    from rao_core.paths import REPO_ROOT

    return load_config(REPO_ROOT / "configs/cpu-smoke.yaml", {"name": "every"})


# --- the experiment's table, record and plots with missing points -------------------------------------------


def test_experiment_rows_record_and_plots_have_points_only_where_evaluated(tmp_path):
    from research.experiment import _rows, _trees
    from research.records import (depth_markdown, depth_png, experiment_record, learning_curve_png,
                                  results_markdown)

    def row(success: float) -> dict:
        return {"mode": "recursive", "difficulty": "tier1", "n": 10, "successes": success * 10, "success": success,
                "ci95": "[0.00, 1.00]", "mean_depth": 0.5, "delegation_rate": 0.3, "child_success": 0.4,
                "depth_hist": {"0": 10, "1": 4},
                "per_depth": {"0": {"nodes": 10, "success": success}, "1": {"nodes": 4, "success": 0.5}}}

    def it(k: int, rows: list) -> dict:
        return {"iteration": k, "times": {"generate": 10.0, "train": 5.0}, "eval_rows": rows,
                "evaluated": bool(rows), "metrics": {}}

    summary = {"base_eval": [row(0.1)],
               "iterations": [it(k, [row(k / 20)] if k % 6 == 0 else []) for k in range(1, 13)]}
    rows = _rows("recursive", summary)
    assert [r["iteration"] for r in rows] == [0, 6, 12] and _trees("recursive", summary) == {}
    meta = {"command": "rao experiment x", "config": "c.yaml", "seed": 0, "commit": "abc", "date": "2026-12-06",
            "wall_s": 60.0, "n_tasks": 10}
    record = experiment_record("x", rows, meta, {}, {"name": "x"})
    assert [p["iteration"] for p in record["points"]] == [0, 6, 12]
    assert (record["test"]["baseline_iteration"], record["test"]["final_iteration"]) == (0, 12)
    md = results_markdown(rows, meta, "x")
    assert "| recursive | 6 | recursive | tier1 |" in md and "| recursive | 5 |" not in md
    assert "| recursive | 12 |" in depth_markdown(rows)
    png = learning_curve_png(rows, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    depth = depth_png(rows, tmp_path / "depth.png")
    assert depth is None or depth.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
