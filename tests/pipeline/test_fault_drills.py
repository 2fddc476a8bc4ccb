"""Fault drills of the pipeline's stages on real S3 (SeaweedFS) and real great-expectations.

- The flow killed during training: the train stage dies after uploading part of its checkpoint; nothing
  marks it done, the half-written folder is never read back (no manifest), a re-run trains again and
  later re-runs return the stored record.
- A corrupted S3 object: an object of a checkpoint folder or a trees file overwritten through boto3
  (with or without its checksum metadata) gives a ``ChecksumError`` naming the object.
- A samples batch with out-of-range values: the validate stage raises ``ValidationFailed`` naming the
  failed expectation and column; no samples reach S3 and the stage is not marked done.

docs/pipeline/resume-and-faults.md, "Bad input and faults", lists them.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

from rao_core.config import CampaignConfig
from rao_core.samples import Sample

pytestmark = pytest.mark.services


def _ctx(name: str, s3_server):
    from infra.stage_io import RunContext

    return RunContext(config=CampaignConfig(name=name), s3=s3_server.settings().__dict__, mlflow_uri="")


class Killed(BaseException):
    """Stands for SIGKILL: nothing in the stage catches it (a BaseException, as KeyboardInterrupt)."""


def _samples() -> list[Sample]:
    return [Sample(tree_id=f"t{i}", node_id="0", group_id="g", depth=0, token_ids=[1, 5, 9, 700 + i],
                   assistant_mask=[0, 0, 1, 1], behaviour_logprobs=[0.0, 0.0, -1.0, -1.0], success=float(i),
                   reward=float(i), baseline=1.0 - i, advantage=2.0 * i - 1.0) for i in (0, 1)]


def test_a_train_stage_killed_mid_upload_is_rerun_and_its_half_checkpoint_never_read(s3_server, tmp_path,
                                                                                    monkeypatch):
    import rao_core.train.launch as launch
    from infra.storage import ArtifactStore
    from rao_core.samples import write_samples
    from tasks import stages
    from infra.stage_io import done_key, fetch_dir
    from infra.stage_records import Checkpoint
    from tasks.serve import checkpoint_local

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    ctx = _ctx("drill-train", s3_server)
    store = ctx.store()
    samples_uri = store.put_file(write_samples(tmp_path / "samples.jsonl", _samples()),
                                 "iter-1/samples/samples.jsonl")["uri"]
    parent_dir = tmp_path / "parent"
    parent_dir.mkdir()
    (parent_dir / "config.json").write_text("{}")
    parent = Checkpoint(name="iter-0", local=str(parent_dir))

    trained: list[bytes] = []

    def fake_training(batch, model_path, out_dir, config, **kw):  # the trainer's output, without torch
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        trained.append(os.urandom(4096))
        (out / "config.json").write_text('{"attempt": %d}' % len(trained))
        (out / "model.safetensors").write_bytes(trained[-1])
        (out / "rao-checkpoint.json").write_text("{}")
        kw["on_step"]({"train/loss": 0.5})
        return launch.TrainingRun(checkpoint=out)

    monkeypatch.setattr(launch, "run_training", fake_training)
    real_put_file = ArtifactStore.put_file
    uploads: list[str] = []

    def dying_put_file(self, local, key):  # killed after the first checkpoint object is stored
        if "/checkpoint/" in key and uploads:
            raise Killed(f"killed while uploading {key}")
        uploads.append(key)
        return real_put_file(self, local, key)

    monkeypatch.setattr(ArtifactStore, "put_file", dying_put_file)
    with pytest.raises(Killed):
        stages.train_policy.fn(ctx, 1, samples_uri, parent)
    half = store.list("iter-1/checkpoint/")
    assert len(half) == 1 and len(trained) == 1  # part of the folder is on S3 ...
    assert not store.exists(done_key(1, "train"))  # ... but the stage is not done
    assert not store.exists("iter-1/checkpoint.manifest.json")
    ckpt_uri = store.uri("iter-1/checkpoint")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{ckpt_uri} has no manifest")):
        fetch_dir(ctx, ckpt_uri, "checkpoints/read-back")  # the half-written folder is never read back
    assert not (ctx.local("checkpoints/read-back") / "config.json").exists()

    monkeypatch.setattr(ArtifactStore, "put_file", real_put_file)  # the re-run: the stage runs again
    out = stages.train_policy.fn(ctx, 1, samples_uri, parent)
    assert not out.resumed and len(trained) == 2 and out.checkpoint.uri == ckpt_uri
    assert store.verify_manifest("iter-1/checkpoint.manifest.json") == []
    # another machine (no local cache) reads exactly the second attempt's checkpoint
    shutil.rmtree(ctx.local("checkpoints"))
    local = checkpoint_local(ctx, Checkpoint(name=out.checkpoint.name, uri=out.checkpoint.uri))
    assert (local / "model.safetensors").read_bytes() == trained[1]
    assert (local / "config.json").read_text() == '{"attempt": 2}'
    again = stages.train_policy.fn(ctx, 1, samples_uri, parent)  # the next re-run resumes past it
    assert again.resumed and len(trained) == 2 and again.checkpoint == out.checkpoint


def _checkpoint_on_s3(store, tmp_path: Path, iteration: int) -> tuple[str, bytes]:
    src = tmp_path / f"ckpt-{iteration}"
    src.mkdir()
    weights = os.urandom(5000)
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(weights)
    store.put_checkpoint(src, f"iter-{iteration}/checkpoint")
    return store.uri(f"iter-{iteration}/checkpoint"), weights


def test_a_corrupted_s3_object_is_a_checksum_error_naming_it(s3_server, tmp_path, monkeypatch):
    from infra.storage import ChecksumError
    from infra.stage_io import fetch, fetch_dir

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    ctx = _ctx("drill-s3", s3_server)
    store = ctx.store()
    bucket = s3_server.settings().bucket
    uri, weights = _checkpoint_on_s3(store, tmp_path, 1)
    key = "drill-s3/iter-1/checkpoint/model.safetensors"
    sha = hashlib.sha256(weights).hexdigest()
    # 1. the bytes change (the last byte flipped, so never equal by chance), the checksum metadata stays
    store.client.put_object(Bucket=bucket, Key=key, Body=weights[:-1] + bytes([weights[-1] ^ 0xFF]), Metadata={"sha256": sha})
    assert store.verify_manifest("iter-1/checkpoint.manifest.json") == []  # metadata alone cannot see it
    with pytest.raises(ChecksumError, match=re.escape(f"checksum mismatch for s3://{bucket}/{key}")):
        fetch_dir(ctx, uri, "checkpoints/c1")
    assert not (ctx.local("checkpoints/c1") / ".complete").exists()
    # 2. overwritten through boto3 without metadata: still checked, against the manifest
    store.client.put_object(Bucket=bucket, Key=key, Body=b"not weights")
    with pytest.raises(ChecksumError, match=re.escape(f"checksum mismatch for s3://{bucket}/{key}")):
        fetch_dir(ctx, uri, "checkpoints/c1")
    # a single object (the trees file) overwritten without metadata: nothing to trust, refused by name
    trees = tmp_path / "trees.jsonl"
    trees.write_text('{"tree_id": "t0"}\n')
    trees_uri = store.put_file(trees, "iter-1/trees/trees.jsonl")["uri"]
    store.client.put_object(Bucket=bucket, Key="drill-s3/iter-1/trees/trees.jsonl", Body=b'{"tree_id": "x"}\n')
    with pytest.raises(ChecksumError, match=re.escape(f"{trees_uri}: no SHA-256")):
        fetch(ctx, trees_uri, "iter-1/trees.jsonl")
    store.client.put_object(Bucket=bucket, Key="drill-s3/iter-1/trees/trees.jsonl", Body=b'{"tree_id": "x"}\n',
                            Metadata={"sha256": hashlib.sha256(trees.read_bytes()).hexdigest()})
    with pytest.raises(ChecksumError, match=re.escape(f"checksum mismatch for {trees_uri}")):
        fetch(ctx, trees_uri, "iter-1/trees.jsonl")
    assert not ctx.local("iter-1/trees.jsonl").exists()  # nothing corrupted lands in the cache


def _scored_trees():
    """Four trees scored as the judge stage scores them under the default config (its bonus and weight)."""
    from rao_core.rewards import assign_rewards
    from tests.pipeline.test_validation import _tree

    algo, env = CampaignConfig().algo, CampaignConfig().tasks.env
    return [assign_rewards(_tree(i, float(i % 2)), algo.bonus_weight(env), bonus=algo.bonus) for i in range(4)]


def _break_advantage(x):
    def f(s):
        s.advantage = x
    return f


def _set(field, value):
    def f(s):
        setattr(s, field, value)
    return f


@pytest.mark.parametrize("corrupt, column", [
    (_break_advantage(math.nan), "advantage"),
    (_break_advantage(math.inf), "advantage"),
    (_break_advantage(1e9), "advantage"),
    (_set("weight", -0.5), "weight"),
    (lambda s: setattr(s, "behaviour_logprobs", s.behaviour_logprobs[:-1] + [0.7]), "behaviour_logprob_max"),
    (lambda s: setattr(s, "assistant_mask", s.assistant_mask[:-1]), "lengths_match"),
], ids=["advantage-nan", "advantage-inf", "advantage-1e9", "weight-negative", "logprob-positive",
        "mask-length"])
def test_out_of_range_samples_stop_training_naming_the_expectation(corrupt, column, s3_server, prefect_harness,
                                                                  tmp_path, monkeypatch):
    import rao_core.samples as samples_mod
    from rao_core.tree import write_trees
    from tasks import stages
    from infra.stage_io import done_key

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    ctx = _ctx(f"drill-validate-{uuid.uuid4().hex[:8]}", s3_server)  # a campaign of its own: no marker yet
    store = ctx.store()
    scored_uri = store.put_file(write_trees(tmp_path / "scored.jsonl", _scored_trees()),
                                "iter-1/trees/scored.jsonl")["uri"]
    real_build = samples_mod.build_samples

    def corrupted_build(*a, **kw):  # the batch the stage validates, one sample broken
        batch = real_build(*a, **kw)
        corrupt(batch.samples[1])
        return batch

    monkeypatch.setattr(samples_mod, "build_samples", corrupted_build)
    with pytest.raises(stages.ValidationFailed) as err:
        stages.validate_dataset.fn(ctx, 1, scored_uri)
    msg = str(err.value)
    assert f"'column': '{column}'" in msg and "expect_column_values_to" in msg, msg
    assert not store.exists("iter-1/samples/samples.jsonl") and not store.exists(done_key(1, "validate"))
    assert store.exists("iter-1/validation/report.json")  # the report is kept for the reader
    monkeypatch.setattr(samples_mod, "build_samples", real_build)  # the same data, unbroken, passes
    assert stages.validate_dataset.fn(ctx, 1, scored_uri).num_samples == 8
