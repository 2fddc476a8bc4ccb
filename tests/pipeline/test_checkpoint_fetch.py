"""Checkpoints are fetched by their own S3 URI, whichever campaign made them."""

from __future__ import annotations

import os

import pytest

from rao_core.config import CampaignConfig


def _ctx(name: str, s3_server):
    from infra.stage_io import RunContext

    return RunContext(config=CampaignConfig(name=name), s3=s3_server.settings().__dict__, mlflow_uri="")


def _upload_checkpoint(s3_server, tmp_path, campaign: str, iteration: int, weights: bytes) -> str:
    from infra.storage import ArtifactStore

    src = tmp_path / f"src-{campaign}"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"campaign": "%s"}' % campaign)
    (src / "sub" / "w.bin").write_bytes(weights)
    store = ArtifactStore(s3_server.settings(), campaign)
    store.put_checkpoint(src, f"iter-{iteration}/checkpoint")
    return f"s3://{s3_server.bucket}/{campaign}/iter-{iteration}/checkpoint"


@pytest.mark.services
def test_a_checkpoint_of_another_campaign_is_fetched_whole_by_its_uri(s3_server, tmp_path, monkeypatch):
    from infra.stage_records import Checkpoint
    from tasks.serve import checkpoint_local
    from tasks.stages import checkpoint_from_uri

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    smoke, other = os.urandom(3000), os.urandom(3000)
    uri = _upload_checkpoint(s3_server, tmp_path, "smoke", 2, smoke)
    uri_other = _upload_checkpoint(s3_server, tmp_path, "other-campaign", 2, other)
    ctx = _ctx("nightly", s3_server)  # 'nightly' is 2 characters longer than 'smoke': the old bug cut 'iter-2'

    ckpt = checkpoint_from_uri(ctx, uri)
    assert ckpt == Checkpoint(name="smoke-iter-2-checkpoint", uri=uri)
    local = checkpoint_local(ctx, ckpt)
    assert local == tmp_path / "home" / "campaigns" / "nightly" / "checkpoints" / "smoke-iter-2-checkpoint"
    assert (local / "config.json").read_text() == '{"campaign": "smoke"}'
    assert (local / "sub" / "w.bin").read_bytes() == smoke
    # the same iteration of another campaign goes to its own cache folder, with its own weights
    local_other = checkpoint_local(ctx, checkpoint_from_uri(ctx, uri_other))
    assert local_other.name == "other-campaign-iter-2-checkpoint"
    assert (local_other / "sub" / "w.bin").read_bytes() == other
    with pytest.raises(FileNotFoundError, match="no objects under s3://rao/smoke/iter-9/checkpoint"):
        checkpoint_local(ctx, checkpoint_from_uri(ctx, "s3://rao/smoke/iter-9/checkpoint"))


@pytest.mark.services
def test_a_version_registered_by_another_campaign_resolves_and_fetches(s3_server, tmp_path, monkeypatch):
    import mlflow

    from infra.tracking import configure_mlflow, ensure_experiment
    from tasks import tracking
    from tasks.serve import checkpoint_local
    from tasks.stages import checkpoint_from_uri

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    configure_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}")
    weights = os.urandom(2000)
    uri = _upload_checkpoint(s3_server, tmp_path, "smoke", 1, weights)
    run = mlflow.MlflowClient().create_run(ensure_experiment("fetch-test"))
    name = "rao-policy-smoke"
    version = tracking.register_version(name, uri, run.info.run_id, {"rao.campaign": "smoke"})
    ctx = _ctx("nightly", s3_server)
    for ref in (f"models:/{name}@candidate", f"models:/{name}/{version}"):
        ckpt = checkpoint_from_uri(ctx, ref)
        assert ckpt.uri == uri and ckpt.name == f"{name}-v{version}"
        assert (checkpoint_local(ctx, ckpt) / "sub" / "w.bin").read_bytes() == weights
