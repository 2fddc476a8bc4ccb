"""The nightly regression flow (flows/evaluate.py) on a seeded fake evaluation: no vLLM, no Prefect API, an
SQLite MLflow registry. The fake evaluates each benchmark of the suite on ``n_tasks`` tasks whose success
probabilities are drawn once per task (seed 7 and the benchmark's name); each evaluation is a fresh Bernoulli draw
of them, so two evaluations of one checkpoint differ as they do on the CPU server (the same version scored 0.25,
0.50 and 0.125 on the same 8 tasks). The default suite (configs/cpu-smoke.yaml) is four benchmarks."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re

import pytest

from infra.stage_records import EvalOutput

M = "eval/textcraft/recursive/tier1/success"
SUITE = ["arte", "deepdive", "oolong", "textcraft"]  # the default suite's benchmarks, as the comparison sorts them


def _row(bench, per_task: dict[str, float]) -> dict:
    """An evaluation row of ``bench`` (its first difficulty, recursive mode) with outcomes ``per_task``."""
    from rao_core.evaluation import wilson_interval

    n, s = len(per_task), sum(per_task.values())
    lo, hi = wilson_interval(s, n)
    return {"benchmark": bench.name, "mode": "recursive", "difficulty": bench.difficulties[0], "n": n,
            "successes": s, "success": s / n, "ci95": f"[{lo:.2f}, {hi:.2f}]", "per_task": per_task}


def _output(rows: list[dict]) -> EvalOutput:
    keys = {f"eval/{r['benchmark']}/recursive/{r['difficulty']}": r for r in rows}
    return EvalOutput(metrics={**{f"{k}/success": r["success"] for k, r in keys.items()},
                               **{f"{k}/n": float(r["n"]) for k, r in keys.items()}}, rows=rows)


class FakeEvaluation:
    """``flows.evaluate._evaluate``: per-task outcomes of a checkpoint on each benchmark; ``lowered[ref]`` lowers
    its per-task probabilities (a worse checkpoint). Records the references it evaluated and the benchmarks with
    their task counts."""

    def __init__(self, seed: int = 7, lowered: dict[str, float] | None = None):
        self.seed, self.rng = seed, random.Random(seed)
        self.lowered = lowered or {}
        self.calls: list[tuple[str, dict[str, int]]] = []

    def __call__(self, ctx, ref: str, benchmarks) -> EvalOutput:
        self.calls.append((ref, {b.name: b.n_tasks for b in benchmarks}))
        low = next((v for k, v in self.lowered.items() if ref.endswith(k)), 0.0)
        rows = []
        for b in benchmarks:
            probs = random.Random(f"{self.seed}:{b.name}")  # the same task probabilities in every evaluation
            ps = [probs.random() for _ in range(b.n_tasks)]
            rows.append(_row(b, {f"{b.name}-task-{i}": float(self.rng.random() < max(0.0, p - low))
                                 for i, p in enumerate(ps)}))
        return _output(rows)


class LostTasks:
    """``flows.evaluate._evaluate`` without noise: every task solved, except that ``ref``s ending in a key of
    ``lost`` lose the first ``lost[key][1]`` tasks of benchmark ``lost[key][0]``."""

    def __init__(self, lost: dict[str, tuple[str, int]]):
        self.lost = lost

    def __call__(self, ctx, ref: str, benchmarks) -> EvalOutput:
        bench, k = next((v for key, v in self.lost.items() if ref.endswith(key)), ("", 0))
        return _output([_row(b, {f"{b.name}-task-{i}": 0.0 if b.name == bench and i < k else 1.0
                                 for i in range(b.n_tasks)}) for b in benchmarks])


@pytest.fixture
def nightly(tmp_path, monkeypatch):
    """flows.evaluate with a fake evaluation, a fake S3, a plain logger and an SQLite MLflow; yields a helper
    that registers versions of campaign ``smoke``'s model."""
    import mlflow

    import flows.campaign
    import flows.evaluate as fe
    from infra.tracking import configure_mlflow
    from tasks import tracking

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    configure_mlflow(f"sqlite:///{tmp_path / 'm.db'}")
    mlflow.create_experiment("rao", artifact_location=(tmp_path / "art").as_uri())

    @contextlib.contextmanager
    def fake_storage(cfg):
        from infra.storage import S3Settings

        yield S3Settings("http://127.0.0.1:9", "rao", "k", "s")

    monkeypatch.setattr(flows.campaign, "storage", fake_storage)
    monkeypatch.setattr(fe, "shutdown_server", lambda: None)
    monkeypatch.setattr(fe, "get_run_logger", lambda: logging.getLogger("rao.test"))
    monkeypatch.setattr(fe.tracking, "log_evaluation", fe.tracking.log_evaluation.fn)

    class Helper:
        fe_module = fe

        def register(self, iteration: int) -> str:
            client = mlflow.MlflowClient()
            exp = client.get_experiment_by_name("rao").experiment_id
            run = client.create_run(exp).info.run_id
            return tracking.register_version("rao-policy-smoke", f"s3://rao/smoke/iter-{iteration}/checkpoint", run,
                                             {M: 0.5, "rao.campaign": "smoke", "rao.iteration": iteration})

        def champion(self, version: str) -> None:
            mlflow.MlflowClient().set_registered_model_alias("rao-policy-smoke", "champion", version)

        def run(self, fake: FakeEvaluation, **params):
            monkeypatch.setattr(fe, "_evaluate", fake)
            return fe.rao_evaluate.fn(fe.EvaluateParams(**params))

    return Helper()


def _evaluation_runs():
    import mlflow

    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name("rao").experiment_id
    return client.search_runs([exp], filter_string="tags.`rao.kind` = 'evaluation'", order_by=["start_time ASC"])


def test_an_unchanged_checkpoint_passes_and_the_next_night_pairs_with_its_stored_outcomes(nightly):
    """Candidate = champion = v1 on the default suite (four benchmarks of 100 tasks): the champion has no stored
    evaluation, so both are evaluated in the run, each on the whole suite at once, on the same tasks; the table
    has a row per benchmark, says they are one checkpoint and shows n, intervals, test, p and the Holm-adjusted
    p; both outcome sets land in evaluation.json. The next night evaluates the candidate only and pairs with them."""
    import mlflow

    v1 = nightly.register(0)
    nightly.champion(v1)
    fake = FakeEvaluation()
    out = nightly.run(fake)
    suite = dict.fromkeys(["textcraft", "oolong", "deepdive", "arte"], 100)
    assert fake.calls == [("models:/rao-policy-smoke@candidate", suite), ("models:/rao-policy-smoke/1", suite)]
    assert [r["metric"].split("/")[1] for r in out["comparison"]] == SUITE
    assert [r["metric"] for r in out["comparison"]][1:3] == ["eval/deepdive/recursive/easy/success",
                                                             "eval/oolong/recursive/singledoc_rolls/success"]
    row = out["comparison"][3]
    assert row["metric"] == M and row["status"] == "ok" and row["n"] == 100 and row["same_checkpoint"] == "v1"
    assert row["champion_from"] == "this run" and row["test"] == ("tango-score, one-sided: drop > 0.1 at alpha "
                                                                  "0.05, Holm over 4 metrics")
    assert all(r["status"] == "ok" and r["p_holm"] >= r["p"] for r in out["comparison"])
    assert re.fullmatch(r"\d+/100 = 0\.\d{3} \[0\.\d\d, 0\.\d\d\]", row["candidate"]), row  # Wilson 95%
    assert set(out["outcomes"]["candidate"][M]) == set(out["outcomes"]["champion"][M]) == {
        f"textcraft-task-{i}" for i in range(100)}
    (run,) = _evaluation_runs()
    assert run.info.status == "FINISHED" and run.data.tags["rao.champion_version"] == "1"
    assert run.data.tags["rao.benchmarks"] == "textcraft, oolong, deepdive, arte"
    stored = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/evaluation.json")
    assert stored["outcomes"]["champion"][M] == out["outcomes"]["champion"][M]
    fake2 = FakeEvaluation(seed=7)  # the same task probabilities, new draws
    out2 = nightly.run(fake2)
    assert fake2.calls == [("models:/rao-policy-smoke@candidate", suite)]  # the champion's outcomes were stored
    assert all(r["champion_from"].startswith("stored evaluation, run ") for r in out2["comparison"])
    assert [r["status"] for r in out2["comparison"]] == ["ok"] * 4


def test_a_clearly_worse_candidate_fails_with_the_test_named(nightly):
    """v2's per-task probabilities are v1's lowered by 0.3 on every benchmark: RegressionError naming the counts,
    the bound, p and the Holm-adjusted p; the MLflow run FAILED; the champion evaluated on the same tasks."""
    from flows.evaluate import RegressionError

    nightly.champion(nightly.register(0))
    nightly.register(1)  # candidate = v2
    fake = FakeEvaluation(lowered={"@candidate": 0.3})
    with pytest.raises(RegressionError, match=r"models:/rao-policy-smoke@candidate regressed vs champion v1: .*"
                       rf"{M}: \d+/100 vs champion \d+/100 \(drop 0\.\d+, 95% lower bound 0\.\d+ > tolerance 0\.1; "
                       r"tango-score p = 0\.\d+, Holm over 4 metrics p = 0\.\d+\)"):
        nightly.run(fake)
    assert [c[0] for c in fake.calls] == ["models:/rao-policy-smoke@candidate", "models:/rao-policy-smoke/1"]
    (run,) = _evaluation_runs()
    assert run.info.status == "FAILED" and M in run.data.metrics and f"champion/{M}" in run.data.metrics


def test_holm_keeps_one_benchmarks_borderline_drop_from_failing_a_four_benchmark_night(nightly):
    """The candidate loses k of Oolong's 100 tasks and nothing else (no noise), k chosen so that the paired
    test's p is between alpha / 4 and alpha: alone (a suite of Oolong) that is a regression; in the four-benchmark
    night the Holm-adjusted p is 4 p >= alpha, so the night passes: four tests do not quadruple the false alarms.
    A loss of every Oolong task is still caught in the four-benchmark night."""
    from flows.evaluate import RegressionError
    from rao_core.regression import paired_test

    def p(k: int) -> float:
        return paired_test([(1.0, 0.0)] * k + [(1.0, 1.0)] * (100 - k), tolerance=0.1).p_value

    k = next(k for k in range(101) if p(k) < 0.05)
    assert 0.0125 <= p(k) < 0.05, (k, p(k))  # the smallest loss significant alone is not significant at alpha / 4
    nightly.champion(nightly.register(0))
    nightly.register(1)
    out = nightly.run(LostTasks({"@candidate": ("oolong", k)}))
    oolong = next(r for r in out["comparison"] if r["metric"].startswith("eval/oolong/"))
    assert (oolong["status"], oolong["p"], oolong["p_holm"]) == ("ok", round(p(k), 4), round(min(1.0, 4 * p(k)), 4))
    alone = [{"env": "oolong", "difficulties": ["singledoc_rolls"], "n_tasks": 100}]
    with pytest.raises(RegressionError, match=rf"eval/oolong/recursive/singledoc_rolls/success: {100 - k}/100 vs champion "
                       r"100/100 .*tango-score p = 0\.0\d+\)"):  # one metric: no Holm clause
        nightly.run(LostTasks({"@candidate": ("oolong", k)}), suite=alone)
    with pytest.raises(RegressionError, match=r"eval/oolong/recursive/singledoc_rolls/success: 0/100 vs champion 100/100 .*"
                       r"Holm over 4 metrics p = 0\.0000\)"):
        nightly.run(LostTasks({"@candidate": ("oolong", 100)}), fresh_champion=True)


def test_no_registered_model_is_one_line_with_the_campaign_to_run_first(nightly):
    """Everyone who names their campaign got MLflow's 'Registered Model ... not found' traceback every night."""
    from flows.evaluate import NoRegisteredModel

    with pytest.raises(NoRegisteredModel) as e:
        nightly.run(FakeEvaluation(), campaign="mine")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("error: rao-policy-mine is not a registered model in MLflow at ")
    assert msg.endswith("campaign 'mine' has not registered a checkpoint yet; run campaign 'mine' first: `rao run "
                        "--config configs/cpu-smoke.yaml --name mine` (or the campaign deployment with name mine in "
                        "the Prefect UI), or set `campaign` to one that ran")


def test_without_a_champion_the_nightly_refuses_before_evaluating_anything(nightly):
    """A nightly with no champion evaluated the candidate (18 minutes) before failing on 'no champion'; now it
    refuses at once, saying why no version is champion, and evaluates nothing."""
    from flows.evaluate import NothingCompared

    nightly.register(0)
    fake = FakeEvaluation()
    with pytest.raises(NothingCompared) as e:
        nightly.run(fake)
    assert str(e.value) == ("models:/rao-policy-smoke@candidate: no champion to compare with: rao-policy-smoke has 1 "
                            "version and none holds the 'champion' alias (v1 not promoted); a campaign promotes a "
                            "version that made an update and was evaluated; nothing was evaluated (`rao eval` "
                            "measures a checkpoint without a comparison)")
    assert fake.calls == [] and _evaluation_runs() == []


def test_fresh_champion_evaluates_it_again_and_the_run_name_has_the_date(nightly):
    from flows.evaluate import EvaluateParams

    v1 = nightly.register(0)
    nightly.champion(v1)
    nightly.run(FakeEvaluation())
    fake = FakeEvaluation()
    out = nightly.run(fake, fresh_champion=True, suite=[{"difficulties": ["tier1"], "n_tasks": 20}])
    assert [c for _, c in fake.calls] == [{"textcraft": 20}] * 2 and out["comparison"][0]["n"] == 20
    name = EvaluateParams().flow_run_name(0)
    assert name == "nightly-candidate-1970-01-01-0000" and name.startswith(EvaluateParams().flow_run_prefix())
    assert json.loads(out["json"])[0]["champion_from"] == "this run"


def test_rao_evaluate_prints_n_intervals_p_and_the_same_checkpoint(nightly):
    from rich.console import Console

    from rao_cli.pipeline_cmd import comparison_table

    nightly.champion(nightly.register(0))
    out = nightly.run(FakeEvaluation())
    console = Console(width=400, record=True)
    console.print(comparison_table(out))
    text = console.export_text()
    assert "metric" in text and "losses/wins" in text and "drop_bound" in text and "p_holm" in text and " ok " in text
    assert re.search(r"\d+/100 = 0\.\d{3} \[0\.\d\d, 0\.\d\d\]", text) and M in text and "eval/arte/" in text
    assert ("tango-score, one-sided: drop > 0.1 at alpha 0.05, Holm over 4 metrics; candidate and champion are the "
            "same checkpoint (v1)") in text


def test_the_prefect_ui_shows_the_passing_and_the_failing_nightly(nightly, prefect_harness, monkeypatch):
    """The nightly as a real Prefect flow run (the test harness's API, which the UI reads), on the
    seeded fake evaluation. An unchanged checkpoint's run completes and its artifacts show n, the Wilson intervals,
    the test with its p, 'ok' and that candidate and champion are one checkpoint; a clearly worse candidate's run
    FAILS and the same artifacts show 'regression' and the verdict. Read back through Prefect's API, as the UI does."""
    import json as _json

    from prefect import task
    from prefect.artifacts import Artifact
    from prefect.cache_policies import NONE
    from prefect.client.orchestration import get_client

    from flows.evaluate import RegressionError
    from infra.stage_io import artifact_key

    fe = nightly.fe_module
    # the fixture calls log_evaluation's function directly (no Prefect run); here it is the flow's task again
    monkeypatch.setattr(fe.tracking, "log_evaluation", task(name="log-evaluation", cache_policy=NONE)(
        fe.tracking.log_evaluation))

    def shown(stage: str):
        a = Artifact.get(artifact_key("nightly", stage))
        assert a is not None, f"no {stage} artifact"
        return a, (_json.loads(a.data) if isinstance(a.data, str) and stage != "decision" else a.data)

    def state_of(a) -> str:
        with get_client(sync_client=True) as c:
            return c.read_flow_run(a.flow_run_id).state.type.value

    nightly.champion(nightly.register(0))
    monkeypatch.setattr(fe, "_evaluate", FakeEvaluation())
    fe.rao_evaluate(fe.EvaluateParams())  # candidate = champion = v1
    a, rows = shown("comparison")
    row = next(r for r in rows if r["metric"] == M)
    assert state_of(a) == "COMPLETED" and len(rows) == 4
    assert row["status"] == "ok" and row["n"] == 100 and row["same_checkpoint"] == "v1"
    assert re.fullmatch(r"\d+/100 = 0\.\d{3} \[0\.\d\d, 0\.\d\d\]", row["candidate"]) and row["p"] is not None
    md, text = shown("decision")
    assert md.flow_run_id == a.flow_run_id and "vs champion: no regression" in text
    assert "**Same checkpoint**" in text and "tango-score" in text and "80% power" in text

    nightly.register(1)  # candidate = v2, its per-task success probabilities 0.3 below v1's
    monkeypatch.setattr(fe, "_evaluate", FakeEvaluation(lowered={"@candidate": 0.3}))
    with pytest.raises(RegressionError):
        fe.rao_evaluate(fe.EvaluateParams())
    b, rows = shown("comparison")
    row = next(r for r in rows if r["metric"] == M)
    assert b.flow_run_id != a.flow_run_id and state_of(b) == "FAILED"
    assert row["status"] == "REGRESSION" and row["n"] == 100 and not row["same_checkpoint"]
    md, text = shown("decision")
    assert md.flow_run_id == b.flow_run_id and "vs champion: REGRESSION: " in text
    assert "**Same checkpoint**" not in text
