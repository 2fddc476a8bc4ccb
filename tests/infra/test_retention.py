"""Checkpoint retention (``checkpoints.keep_last``) on a real S3 server (SeaweedFS): old checkpoints go,
iteration 0, the newest N and what the registry's aliases point at stay, with everything else of the
iteration (trees, markers)."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.services


def _campaign(s3_server, tmp_path, iterations=range(6)):
    """A campaign prefix with checkpoints iter-0..5 on S3 (two files + manifest each) and in a local cache."""
    from infra.storage import ArtifactStore

    store = ArtifactStore(s3_server.settings(), f"keep-{uuid.uuid4().hex[:8]}")
    local = tmp_path / "checkpoints"
    for k in iterations:
        folder = local / f"iter-{k}"
        folder.mkdir(parents=True)
        (folder / "adapter_model.safetensors").write_bytes(b"w" * 64)
        (folder / "adapter_config.json").write_text("{}")
        store.put_checkpoint(folder, f"iter-{k}/checkpoint")
        store.put_bytes(b"{}", f"iter-{k}/trees/trees.jsonl")
        store.put_bytes(b"{}", f"iter-{k}/_done/train.json")
    return store, local


def test_prune_keeps_iteration_zero_the_newest_and_the_protected(s3_server, tmp_path):
    from infra.retention import checkpoint_iterations, prune_checkpoints

    store, local = _campaign(s3_server, tmp_path)
    assert checkpoint_iterations(store) == [0, 1, 2, 3, 4, 5]
    # keep_last 2 -> 4, 5; iteration 0 always; iter-2 is the champion's source -> pruned: 1 and 3
    pruned = prune_checkpoints(store, 2, protected_uris=[store.uri("iter-2/checkpoint"), "s3://rao/other/iter-1/checkpoint"],
                               local_root=local)
    assert pruned == [1, 3]
    assert checkpoint_iterations(store) == [0, 2, 4, 5]
    keys = set(store.list())
    for k in (1, 3):
        assert not any(x.startswith(f"iter-{k}/checkpoint") for x in keys) and not (local / f"iter-{k}").exists()
        assert {f"iter-{k}/trees/trees.jsonl", f"iter-{k}/_done/train.json"} <= keys  # the rest stays
    for k in (0, 2, 4, 5):
        assert store.verify_manifest(f"iter-{k}/checkpoint.manifest.json") == [] and (local / f"iter-{k}").is_dir()
    assert prune_checkpoints(store, 2, protected_uris=[store.uri("iter-2/checkpoint/")]) == []  # idempotent
    with pytest.raises(ValueError, match="at least the newest"):
        prune_checkpoints(store, 0)


def test_prune_campaign_protects_registry_aliases_and_tags_pruned_versions(s3_server, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    from infra.retention import checkpoint_iterations, prune_campaign

    prev = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        store, local = _campaign(s3_server, tmp_path, range(5))
        c = MlflowClient()
        c.create_registered_model("m")
        versions = {k: c.create_model_version("m", source=store.uri(f"iter-{k}/checkpoint")).version
                    for k in range(5)}
        c.set_registered_model_alias("m", "champion", versions[1])
        c.set_registered_model_alias("m", "candidate", versions[4])
        # keep_last 1 -> iter-4 (also candidate); iter-0 always; iter-1 is champion -> pruned: 2, 3
        assert prune_campaign(store, 1, "m", local) == [2, 3]
        assert checkpoint_iterations(store) == [0, 1, 4]
        tags = {k: c.get_model_version("m", v).tags.get("rao.pruned") for k, v in versions.items()}
        assert tags == {0: None, 1: None, 2: "true", 3: "true", 4: None}
    finally:
        mlflow.set_tracking_uri(prev)
