"""Asynchronous RL in the campaign flow: real vLLM (tiny model), SeaweedFS, MLflow (SQLite),
Prefect. A campaign with ``algo.max_staleness: 1`` is interrupted in the middle of an overlapped pair (iteration 2
training while iteration 1 is evaluated and iteration 3 generated) and resumed: each iteration's trees are
generated once, each checkpoint trained once, no MLflow (run, metric, step) twice, and the trees and samples
carry the versions of ``rao_core.async_rl``."""

from __future__ import annotations

import json

import pytest

from tests.pipeline.test_campaign import _mixed, _params, campaign_env  # noqa: F401 - a fixture
from tests.pipeline.test_campaign_resume import _points

pytestmark = [pytest.mark.vllm, pytest.mark.services, pytest.mark.slow]


def test_an_overlapped_campaign_interrupted_mid_pair_resumes_without_redoing_work(
        campaign_env, tiny_model_path, vllm_tiny, monkeypatch):
    import mlflow

    import rao_core.train.launch as launch
    import tasks.stages as stages
    from flows import campaign

    _mixed(monkeypatch)  # groups with a solved and an unsolved tree: non-zero advantages, real updates
    generated, trained, failed_once = [], [], []
    real_gen, real_train = stages._generate_locally, launch.run_training

    def counting_gen(ctx, iteration, *a, **k):
        out = real_gen(ctx, iteration, *a, **k)
        generated.append(iteration)
        return out

    def interrupted_train(batch, model_path, out_dir, config, *, iteration=0, **k):
        if iteration == 2 and not failed_once:
            failed_once.append(1)
            raise RuntimeError("interrupted while iteration 2 trains beside iteration 3's generation")
        out = real_train(batch, model_path, out_dir, config, iteration=iteration, **k)
        trained.append(iteration)
        return out

    monkeypatch.setattr(stages, "_generate_locally", counting_gen)
    monkeypatch.setattr(launch, "run_training", interrupted_train)
    params = _params("overlap", tiny_model_path, **{
        "serving.base_url": vllm_tiny.base_url, "serving.switch": "none", "trainer.loss_type": "reinforce",
        "algo.max_staleness": 1}).model_copy(update={"iterations": 3})
    with pytest.raises(RuntimeError, match="interrupted while iteration 2 trains"):
        campaign.rao_campaign(params)
    assert sorted(generated) == [1, 2, 3] and trained == [1]  # iteration 3's trees grew beside the failed train
    db = campaign_env / "mlflow.db"
    before, dup = _points(db)
    assert before > 0 and dup == []

    summary = campaign.rao_campaign(params)  # resumed: step 2's train side only, then steps 3 and 4
    assert sorted(generated) == [1, 2, 3], "a resumed overlapped campaign generated trees again"
    assert trained == [1, 2, 3], "a checkpoint was trained twice"
    after, dup = _points(db)
    assert dup == [], f"(run, metric, step) logged twice on resume: {dup[:5]}"
    assert [it["iteration"] for it in summary["iterations"]] == [1, 2, 3]
    assert [r["stage"] for r in summary["timeline"]["rows"] if r["stage"].startswith("step")] == [
        "step 1 (train 1 + generate 2)", "step 2 (train 2 + evaluate 1 + generate 3)",
        "step 3 (train 3 + evaluate 2)", "step 4 (evaluate 3)"]

    home = campaign_env / "home" / "campaigns" / "overlap"
    versions = {k: {json.loads(line)["policy_version"] for line in (home / f"iter-{k}" / "trees.jsonl").open()}
                for k in (1, 2, 3)}
    assert versions == {1: {0}, 2: {0}, 3: {1}}  # tree_version: max(k - 2, 0)
    client = mlflow.MlflowClient()
    run = summary["mlflow_run_id"]
    lag = {m.step: m.value for m in client.get_metric_history(run, "staleness/lag_1_samples")}
    assert set(lag) == {2, 3} and all(v > 0 for v in lag.values())  # iteration 1 trains on-policy (lag 0)
    assert {m.step for m in client.get_metric_history(run, "staleness/lag_0_samples")} == {1}
    assert sorted(m.step for m in client.get_metric_history(run, "eval/textcraft/recursive/easy/success")) == [0, 1, 2, 3]
    from tasks.tracking import find_iteration_run

    for k in (1, 2, 3):  # the validation report reaches each iteration's run (it went nowhere: the run came later)
        it = find_iteration_run(summary["mlflow_experiment_id"], "overlap", k)
        assert it and "validation/report.json" in [a.path for a in client.list_artifacts(it, "validation")], k
