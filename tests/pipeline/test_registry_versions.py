"""Registry: each campaign registers under its own model name unless the config names a fixed
one; each version is linked to the run holding its own evaluation metrics and describes its checkpoint;
an iteration that changed no weight registers no new version."""

from __future__ import annotations

import pytest

from flows.campaign import CampaignParams
from rao_core.config import CampaignConfig, ModelSettings

METRIC = "eval/recursive/easy/success"


def test_each_campaign_registers_under_its_own_model_unless_the_config_names_one():
    from tasks.tracking import registered_model_name

    assert registered_model_name(CampaignConfig(name="smoke")) == "rao-policy-smoke"  # the default template
    cfg = CampaignParams(config="configs/cpu-smoke.yaml", name="exp2").resolve()
    assert registered_model_name(cfg) == "rao-policy-exp2"  # --name exp2 never moves smoke's champion
    assert registered_model_name(cfg, "smoke") == "rao-policy-smoke"  # the nightly names the campaign
    fixed = CampaignConfig(name="a", model=ModelSettings(registered_model="shared"))
    assert registered_model_name(fixed) == "shared"  # a fixed name: campaigns share (and compete for) it


def test_the_single_arm_of_a_templated_experiment_gets_its_own_model():
    from research.designs import arm_overrides
    from tasks.tracking import registered_model_name

    cfg = CampaignParams(config="configs/experiment-textcraft-cpu.yaml", name="tc-single",
                         overrides=arm_overrides("single", [], "rao-policy-{campaign}", None)).resolve()
    assert registered_model_name(cfg) == "rao-policy-tc-single"
    assert "model.registered_model=shared-single" in arm_overrides("single", [], "shared", None)


@pytest.mark.services
def test_versions_hold_their_own_metrics_and_unchanged_weights_add_none(s3_server, tmp_path, monkeypatch):
    import mlflow

    from infra.tracking import configure_mlflow, ensure_experiment
    from infra.stage_io import RunContext
    from infra.stage_records import Checkpoint, RegisterOutput
    from tasks.stages import register_checkpoint

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    configure_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    exp = ensure_experiment("registry")
    ctx = RunContext(config=CampaignConfig(name="reg-versions"), s3=s3_server.settings().__dict__, mlflow_uri="")

    def iteration(k: int, success: float, updated: bool) -> RegisterOutput:
        run = client.create_run(exp, tags={"rao.iteration": str(k)}).info.run_id
        client.log_metric(run, METRIC, success, step=k)
        ckpt = Checkpoint(name=f"iter-{k}", uri=f"s3://rao/reg-versions/iter-{k}/checkpoint")
        return register_checkpoint.fn(ctx, k, ckpt, {METRIC: success}, run, updated)

    r0, r1 = iteration(0, 0.25, True), iteration(1, 0.5, True)
    r2 = iteration(2, 0.5, False)  # no optimizer step: the weights of version 2
    r3 = iteration(3, 0.75, True)
    assert [r.version for r in (r0, r1, r2, r3)] == ["1", "2", "2", "3"]
    assert (r2.updated, r2.champion, r3.champion) == (False, False, True)
    versions = {str(v.version): v for v in client.search_model_versions("name = 'rao-policy-reg-versions'")}
    assert sorted(versions, key=int) == ["1", "2", "3"]
    for v, success in (("1", 0.25), ("2", 0.5), ("3", 0.75)):  # Compare: each version's run has its own value
        assert client.get_run(versions[v].run_id).data.metrics[METRIC] == success
    k = int(versions["3"].tags["rao.iteration"])
    assert versions["3"].description == (f"Checkpoint s3://rao/reg-versions/iter-{k}/checkpoint\n\n"
                                         f"campaign reg-versions, iteration {k}")
    assert str(client.get_model_version_by_alias("rao-policy-reg-versions", "candidate").version) == "3"
    # a first checkpoint that no update changed is still registered, and says so
    ctx = RunContext(config=CampaignConfig(name="reg-skip"), s3=s3_server.settings().__dict__, mlflow_uri="")
    assert iteration(1, 0.0, False).version == "1"
    [v] = client.search_model_versions("name = 'rao-policy-reg-skip'")
    assert v.description.endswith("iteration 1; update skipped (no optimizer step): the weights it started from")
