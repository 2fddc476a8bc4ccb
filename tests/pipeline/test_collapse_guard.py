"""The collapse guard in a campaign (flows/campaign.py, rao_core.guard): the real campaign loops (synchronous and
overlapped), registry and MLflow (SQLite), with the stages that need a model replaced by resumable fakes and S3 by
an in-memory store (no vLLM, no Prefect API, no SeaweedFS). The held-out evaluation is hostile: the first
difficulty (``tier1``, the champion rule's primary metric) holds at 10/20 while the second (``tier1x2``) falls
from 18/20 to 0/20 in iteration 2, so the champion rule alone (``tasks.tracking.promote``) would move
``champion`` to the collapsed checkpoint."""

from __future__ import annotations

import pytest

from infra.stage_records import Checkpoint
from tests.pipeline.campaign_fakes import eval_output, eval_row, fake_campaign

MODEL = "rao-policy-guarded"
PRIMARY = "eval/recursive/tier1/success"
STEADY = [1, 0] * 10  # tier1: 10/20 at every iteration
SKILL = [1] * 18 + [0] * 2  # tier1x2: 18/20
LOST = [0] * 20
#: iteration -> tier1x2 outcomes of its evaluation (0: the starting checkpoint's base evaluation)
TIER1X2 = {0: SKILL, 1: SKILL, 2: LOST, 3: SKILL}


@pytest.fixture
def campaign(tmp_path, monkeypatch):
    """flows.campaign with fake stages (tests.pipeline.campaign_fakes.fake_campaign), 3 iterations evaluated as
    ``TIER1X2`` says; yields ``run(*overrides) -> (summary, record)``, record holding the guard lines logged, each
    iteration's parent checkpoint, the champion when each training began, the retention calls and the store."""
    rec: dict = {"parents": {}, "champion_at_train": {}, "pruned_after": []}

    def train(iteration: int, parent: Checkpoint) -> None:
        from tasks import tracking

        rec["parents"][iteration] = parent.name
        champ = tracking.alias_version(MODEL, "champion")
        rec["champion_at_train"][iteration] = str(champ.version) if champ else None

    with fake_campaign(monkeypatch, tmp_path, rec, "guarded", MODEL,
                       lambda k: eval_output([eval_row("tier1", STEADY), eval_row("tier1x2", TIER1X2[k])]),
                       iterations=3, sample_stats={"mean_advantage_solved_per_depth": {0: 0.2, 1: -0.25}},
                       on_train=train, on_prune=lambda: rec["pruned_after"].append(len(rec["parents"]))) as run:
        yield run


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
