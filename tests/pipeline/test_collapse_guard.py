"""The collapse guard in a campaign (flows/campaign.py, rao_core.guard): the real campaign loops (synchronous and
overlapped), registry and MLflow (SQLite), with the stages that need a model replaced by resumable fakes and S3 by
an in-memory store (no vLLM, no Prefect API, no SeaweedFS). The held-out evaluation is hostile: the first
difficulty (``tier1``, the champion rule's primary metric) holds at 10/20 while the second (``tier1x2``) falls
from 18/20 to 0/20 in iteration 2, so the champion rule alone (``tasks.tracking.promote``) would move
``champion`` to the collapsed checkpoint."""

from __future__ import annotations

import contextlib
import logging

import pytest

from infra.stage_records import (Checkpoint, EvalOutput, GenerateOutput, JudgeOutput, LogOutput, ServedEndpoint,
                                 TrainOutput, ValidateOutput, WarmStartOutput)
from tests.pipeline.campaign_fakes import MemoryStore, eval_output, eval_row

MODEL = "rao-policy-guarded"
PRIMARY = "eval/recursive/tier1/success"
STEADY = [1, 0] * 10  # tier1: 10/20 at every iteration
SKILL = [1] * 18 + [0] * 2  # tier1x2: 18/20
LOST = [0] * 20
#: iteration -> tier1x2 outcomes of its evaluation (0: the starting checkpoint's base evaluation)
TIER1X2 = {0: SKILL, 1: SKILL, 2: LOST, 3: SKILL}


@pytest.fixture
def campaign(tmp_path, monkeypatch):
    """flows.campaign with fake stages; yields ``run(*overrides) -> (summary, record)``, record holding the guard
    lines logged, each iteration's parent checkpoint, the champion when each training began, the retention calls
    and the store."""
    import mlflow

    import flows.campaign as fc
    import infra.disk
    import infra.retention
    from infra.storage import S3Settings
    from tasks import stages, tracking
    from tasks.bookkeeping import register_held
    from infra.stage_io import RunContext, stage

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    rec: dict = {"parents": {}, "champion_at_train": {}, "pruned_after": [], "lines": []}
    store = MemoryStore("guarded")
    rec["store"] = store

    @contextlib.contextmanager
    def fake_storage(cfg):
        yield S3Settings("http://127.0.0.1:9", "rao", "k", "s")

    class Lines(logging.Handler):
        def emit(self, record):
            rec["lines"].append(record.getMessage())

    logger = logging.getLogger("rao.test.guard")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler := Lines())

    def checkpoint(k: int) -> Checkpoint:
        return Checkpoint(name=f"guarded-iter-{k}-checkpoint", uri=store.uri(f"iter-{k}/checkpoint"))

    @stage("generate", name="generate-trees")
    def generate(ctx, iteration, served, tok, policy_version=None) -> GenerateOutput:
        return GenerateOutput(trees_uri=store.uri(f"iter-{iteration}/trees.jsonl"), num_trees=24)

    @stage("judge", name="judge-trees")
    def judge(ctx, iteration, trees_uri) -> JudgeOutput:
        return JudgeOutput(scored_uri=trees_uri.replace("trees", "scored"))

    @stage("validate", name="validate-dataset")
    def validate(ctx, iteration, scored_uri) -> ValidateOutput:
        return ValidateOutput(samples_uri=store.uri(f"iter-{iteration}/samples.jsonl"), num_samples=40,
                              sample_stats={"mean_advantage_solved_per_depth": {0: 0.2, 1: -0.25}})

    @stage("train", name="train-policy")
    def train(ctx, iteration, samples_uri, parent) -> TrainOutput:
        rec["parents"][iteration] = parent.name
        champ = tracking.alias_version(MODEL, "champion")
        rec["champion_at_train"][iteration] = str(champ.version) if champ else None
        return TrainOutput(checkpoint=checkpoint(iteration), steps=1)

    @stage("evaluate", name="evaluate")
    def evaluate(ctx, iteration, served, tok) -> EvalOutput:
        return eval_output([eval_row("tier1", STEADY), eval_row("tier1x2", TIER1X2[iteration])])

    def log_iteration(ctx, k, run_id, gen, judged, val, tr, ev, times) -> LogOutput:
        return LogOutput(metrics={**ev.metrics, "success/root": 0.5}, times=times)

    monkeypatch.setattr(fc, "storage", fake_storage)
    monkeypatch.setattr(fc, "ArtifactStore", lambda s3, name: store)
    monkeypatch.setattr(RunContext, "store", lambda self: store)
    monkeypatch.setattr(fc, "get_run_logger", lambda: logger)
    monkeypatch.setattr(infra.disk, "keep_reserve", lambda *a, **k: True)
    monkeypatch.setattr(infra.retention, "prune_campaign", lambda store_, policy, model, local, **kw:
                        rec["pruned_after"].append(len(rec["parents"])) or [])
    monkeypatch.setattr(fc, "warm_start", lambda ctx: WarmStartOutput(checkpoint=checkpoint(0), mode="demos"))
    monkeypatch.setattr(fc, "serve_checkpoint", lambda ctx, ckpt: ServedEndpoint())
    monkeypatch.setattr(fc, "_tokenizer_path", lambda ctx, ckpt: "")
    for name, fake in (("generate_trees", generate), ("judge_trees", judge), ("validate_dataset", validate),
                       ("train_policy", train), ("evaluate", evaluate)):
        monkeypatch.setattr(fc, name, fake.fn)  # resumable stages (markers in the store), no task run
    monkeypatch.setattr(fc, "register_checkpoint", stages.register_checkpoint.fn)  # the real stages, no task run
    monkeypatch.setattr(fc, "register_held", register_held.fn)
    monkeypatch.setattr(fc, "rao_iteration", fc.rao_iteration.fn)
    monkeypatch.setattr(fc, "rao_overlap_step", fc.rao_overlap_step.fn)
    monkeypatch.setattr(tracking, "log_iteration", log_iteration)

    def run(*overrides: str):
        params = fc.CampaignParams(config="configs/cpu-smoke.yaml", name="guarded", iterations=3,
                                   overrides=[f"model.registered_model={MODEL}", "tracking.log_traces=false",
                                              *overrides])
        return fc.rao_campaign.fn(params), rec

    try:
        yield run
    finally:
        logger.removeHandler(handler)
        mlflow.set_tracking_uri(None)


def _champion() -> str:
    from tasks import tracking

    return str(tracking.alias_version(MODEL, "champion").version)


def _guard_lines(rec: dict) -> list[str]:
    return [x for x in rec["lines"] if x.startswith("collapse guard:")]


P_18 = "3.8e-06"  # 2^-18: 18 tasks lost, 0 gained
LINE = ("collapse guard: iteration 2 held-out success 0.90 -> 0.00 on recursive/tier1x2 (paired exact sign test, "
        f"18 tasks lost vs 0 gained of 20, p = {P_18} < 0.05/2; solved nodes' mean advantage < 0 at depth 1 "
        f"(-0.25)): checkpoint iter-2 ({MODEL} v3) is not promoted")


def test_a_collapse_is_not_promoted_and_the_next_iteration_trains_from_the_last_good_checkpoint(campaign):
    import mlflow

    summary, rec = campaign()  # guard.action: rollback (the default)
    line = LINE + "; rollback: iteration 3 trains from iteration 1's checkpoint"
    assert _guard_lines(rec) == [line, line]  # when it happened, and again at the end of the run
    assert rec["lines"][-1].startswith("campaign guarded done in ")
    # v1 = iteration 0 (champion), v2 = iteration 1 (champion: tier1 held), v3 = iteration 2 (held back), v4 = 3
    assert rec["champion_at_train"] == {1: "1", 2: "2", 3: "2"}
    assert rec["parents"] == {1: "guarded-iter-0-checkpoint", 2: "guarded-iter-1-checkpoint",
                              3: "guarded-iter-1-checkpoint"}
    assert rec["pruned_after"] == [1, 3]  # not after iteration 2: iteration 1's checkpoint is still a parent
    assert [(it["register"]["version"], it["register"]["champion"], it["guard"]["status"], it["guard"]["reference"])
            for it in summary["iterations"]] == [("2", True, "pass", 0), ("3", False, "collapse", 1),
                                                 ("4", True, "pass", 1)]
    assert _champion() == "4"
    assert summary["guard"] == {"enabled": True, "action": "rollback", "collapses": [line], "stopped_at": None}
    assert rec["store"].exists("_done/campaign.json")
    client = mlflow.MlflowClient()
    held = client.get_model_version(MODEL, "3")
    assert (held.tags["rao.guard"], held.tags[PRIMARY], held.tags["rao.iteration"]) == ("collapse", "0.5", "2")
    it2 = client.get_run(next(r.info.run_id for r in mlflow.search_runs(
        search_all_experiments=True, output_format="list", filter_string="tags.`rao.iteration` = '2'")))
    assert (it2.data.tags["guard/verdict"], it2.data.tags["guard/line"]) == ("collapse", line)
    assert it2.data.metrics["guard/collapsed"] == 1.0 and it2.data.metrics["guard/lost"] == 18.0
    assert it2.data.metrics["guard/p_value"] == pytest.approx(2.0 ** -18)
    camp = client.get_run(summary["mlflow_run_id"])
    assert [m.value for m in client.get_metric_history(camp.info.run_id, "guard/collapsed")] == [0.0, 1.0, 0.0]
    assert camp.data.params["guard.action"] == "rollback"

    from tasks.bookkeeping import summary_markdown

    md = summary_markdown(summary)
    assert f"**{line}**" in md and "| 3 | no: collapse guard |" in md


def test_stop_ends_the_campaign_after_the_collapse_and_a_rerun_with_rollback_goes_on(campaign):
    summary, rec = campaign("guard.action=stop")
    line = LINE + "; the campaign stops (guard.action stop)"
    assert _guard_lines(rec) == [line, line]
    assert rec["lines"][-1].startswith("campaign guarded stopped by the collapse guard after iteration 2 in ")
    assert list(rec["parents"]) == [1, 2] and [it["iteration"] for it in summary["iterations"]] == [1, 2]
    assert _champion() == "2" and summary["guard"]["stopped_at"] == 2
    assert rec["pruned_after"] == [1]  # iteration 1's checkpoint kept for a re-run that rolls back
    assert not rec["store"].exists("_done/campaign.json")  # not complete: a re-run with another action goes on

    again, rec = campaign("guard.action=rollback")  # the re-run: iterations 1-2 from their markers, then 3
    assert _guard_lines(rec)[-1] == LINE + "; rollback: iteration 3 trains from iteration 1's checkpoint"
    assert rec["parents"][3] == "guarded-iter-1-checkpoint" and rec["champion_at_train"][3] == "2"
    assert [it["register"]["version"] for it in again["iterations"]] == ["2", "3", "4"]  # no version added twice
    assert _champion() == "4" and again["guard"]["stopped_at"] is None and rec["store"].exists("_done/campaign.json")


def test_without_the_guard_the_champion_rule_alone_promotes_the_collapsed_checkpoint(campaign):
    """The premise of the tests above: the evaluation is hostile enough that the champion moves to iteration 2's
    checkpoint when the guard is off, and iteration 3 trains from it."""
    summary, rec = campaign("guard.enabled=false")
    assert _guard_lines(rec) == [] and rec["champion_at_train"][3] == "3"
    assert rec["parents"][3] == "guarded-iter-2-checkpoint"
    assert [it["guard"] for it in summary["iterations"]] == [None, None, None]


def test_overlapped_iterations_stop_at_a_collapse_since_the_next_one_already_trained_from_it(campaign):
    """algo.max_staleness 1: iteration 2 is evaluated in step 3, beside iteration 3's training from its checkpoint,
    so the default rollback cannot be done: the campaign stops after that step, the champion unmoved."""
    summary, rec = campaign("algo.max_staleness=1")
    line = (LINE + "; the campaign stops (guard.action rollback: iteration 3 already trained from it, iterations "
            "overlap)")
    assert _guard_lines(rec) == [line, line]
    assert rec["parents"] == {1: "guarded-iter-0-checkpoint", 2: "guarded-iter-1-checkpoint",
                              3: "guarded-iter-2-checkpoint"}
    assert [it["iteration"] for it in summary["iterations"]] == [1, 2] and summary["guard"]["stopped_at"] == 2
    assert _champion() == "2" and not rec["store"].exists("_done/campaign.json")
