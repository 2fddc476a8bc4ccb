"""The default retention policy (``checkpoints``: keep_last 1, optimizer_state latest, local_copies none) on a
real S3 server (SeaweedFS): the warm start, the champion and the newest checkpoint stay on
S3, only the newest keeps its optimizer state, local copies go once their upload is verified, and a stage that
needs a removed local checkpoint fetches it back (with the tiny model: the train stage of the next iteration
continues from the fetched parent's optimizer state)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from rao_core.config import CampaignConfig, CheckpointSettings

pytestmark = pytest.mark.services


def _campaign(s3_server, tmp_path, iterations=range(4)):
    """Checkpoints iter-0..3 with weights and an optimizer/ folder, on S3 (with manifests) and locally."""
    from infra.storage import ArtifactStore

    store = ArtifactStore(s3_server.settings(), f"ret-{uuid.uuid4().hex[:8]}")
    local = tmp_path / "checkpoints"
    for k in iterations:
        folder = local / f"iter-{k}"
        (folder / "optimizer").mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"w" * 1000)
        (folder / "optimizer" / "state.pt").write_bytes(b"o" * 2000)
        store.put_checkpoint(folder, f"iter-{k}/checkpoint")
        (folder / ".complete").write_text("ok")
        store.put_bytes(b"{}", f"iter-{k}/_done/train.json")
    return store, local


def test_the_default_policy(s3_server, tmp_path, monkeypatch):
    from infra.retention import apply_retention, checkpoint_iterations
    from infra.stage_io import RunContext, fetch_dir

    assert CheckpointSettings() == CheckpointSettings(keep_last=1, optimizer_state="latest", local_copies="none")
    assert CampaignConfig().checkpoints == CheckpointSettings()  # on by default
    store, local = _campaign(s3_server, tmp_path)
    rep = apply_retention(store, None, local, protected_uris=[store.uri("iter-1/checkpoint")])  # iter-1: champion
    assert rep.pruned == [2] and rep.optimizer_dropped == [0, 1]
    assert rep.s3_freed == 3002 + 2 * 2000  # iter-2 whole (config, weights, optimizer), the optimizer state of iter-0 and iter-1
    assert sorted(rep.local_removed) == ["iter-0", "iter-1", "iter-3"]  # every upload verified: no local copy
    assert not any(local.iterdir())
    assert "deleted checkpoints iter-2" in rep.line() and "optimizer state of iter-0, iter-1" in rep.line()
    # the line names the store, so a reader of the log sees it is the local server, not AWS
    assert f"on S3 (s3://{store.settings.bucket}/{store.prefix}/ at {store.settings.endpoint_url})" in rep.line()
    assert "removed the local copies of iter-0, iter-1, iter-3 (kept on S3)" in rep.line()
    assert checkpoint_iterations(store) == [0, 1, 3]
    keys = set(store.list())
    assert [k for k in keys if "/optimizer/" in k] == ["iter-3/checkpoint/optimizer/state.pt"]
    assert {f"iter-{k}/_done/train.json" for k in range(4)} <= keys  # markers stay: resume works
    for k in (0, 1, 3):
        assert store.verify_manifest(f"iter-{k}/checkpoint.manifest.json") == []
    # a stage that needs one fetches it: the manifest lists no deleted object
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    ctx = RunContext(config=CampaignConfig(name=store.prefix), s3=s3_server.settings().__dict__, mlflow_uri="")
    champ = fetch_dir(ctx, store.uri("iter-1/checkpoint"), "checkpoints/iter-1")
    assert (champ / "model.safetensors").read_bytes() == b"w" * 1000 and not (champ / "optimizer").exists()
    latest = fetch_dir(ctx, store.uri("iter-3/checkpoint"), "checkpoints/iter-3")
    assert (latest / "optimizer" / "state.pt").stat().st_size == 2000
    # idempotent; the fetched copies are removed again (they are on S3)
    again = apply_retention(store, None, ctx.local("checkpoints"), protected_uris=[store.uri("iter-1/checkpoint")])
    assert again.pruned == [] and again.optimizer_dropped == [] and sorted(again.local_removed) == ["iter-1", "iter-3"]


def test_an_unverified_local_copy_stays(s3_server, tmp_path):
    from infra.retention import apply_retention

    store, local = _campaign(s3_server, tmp_path, range(3))
    (local / "iter-0" / "extra.bin").write_bytes(b"x")  # a file the upload never had
    (local / "iter-1" / "model.safetensors").write_bytes(b"w" * 999)  # not the size uploaded
    store.delete("iter-2/checkpoint.manifest.json")  # an upload cut short: no manifest
    (local / "cut").mkdir()  # a download cut short (no .complete marker)
    (local / "other-iter-2-checkpoint").mkdir()  # a complete download of another campaign's folder
    (local / "other-iter-2-checkpoint" / ".complete").write_text("ok")
    rep = apply_retention(store, CheckpointSettings(keep_last=None), local)
    assert rep.local_removed == {"other-iter-2-checkpoint": 2}
    assert sorted(p.name for p in local.iterdir()) == ["cut", "iter-0", "iter-1", "iter-2"]


@pytest.mark.parametrize("policy, left", [(CheckpointSettings(local_copies="latest"), ["iter-3"]),
                                          (CheckpointSettings(local_copies="all"), ["iter-0", "iter-3"]),
                                          (3, ["iter-0", "iter-1", "iter-2", "iter-3"])])
def test_local_copies_and_the_former_keep_last(s3_server, tmp_path, policy, left):
    from infra.retention import apply_retention

    store, local = _campaign(s3_server, tmp_path)
    rep = apply_retention(store, policy, local)
    assert sorted(p.name for p in local.iterdir()) == left
    if isinstance(policy, int):  # prune_campaign(store, N, ...) as before: nothing but the pruning
        assert rep.pruned == [] and rep.optimizer_dropped == []
        assert all((local / n / "optimizer" / "state.pt").exists() for n in left)
    else:  # the optimizer state of a local copy that stays goes with the S3 one
        assert [n for n in left if (local / n / "optimizer").exists()] == ["iter-3"]


def _samples():
    from rao_core.samples import Sample

    out = []
    for i in (0, 1):
        ids = [1, 5, 9, 700 + i, 701, 702 + i]
        out.append(Sample(tree_id=f"t{i}", node_id="r", group_id="g", depth=0, token_ids=ids,
                          assistant_mask=[0, 0, 0, 1, 1, 1], behaviour_logprobs=[0, 0, 0, -10.0, -10.0, -10.0],
                          success=float(i), reward=float(i), baseline=1.0 - i, advantage=2.0 * i - 1.0))
    return out


def test_resume_fetches_a_removed_local_checkpoint(s3_server, tmp_path, monkeypatch, tiny):
    """Tiny model, real S3, the train stage with its completion markers (``task.fn``: the resume semantics
    outside a flow): iteration 1 trains and uploads; the policy removes its local copy; on resume iteration 1
    comes back from its marker (its record still names the removed folder) and iteration 2 trains from it:
    the parent is fetched from S3, with its optimizer state, which the update continues."""
    from infra.retention import prune_campaign
    from rao_core.samples import write_samples
    from rao_core.train import TrainerConfig
    from tasks import stages
    from infra.stage_io import RunContext
    from infra.stage_records import Checkpoint

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    name = f"ret-resume-{uuid.uuid4().hex[:6]}"
    cfg = CampaignConfig(name=name, trainer=TrainerConfig(loss_type="reinforce", lr=1e-3, micro_batch_size=1,
                                                          process="inline"))
    ctx = RunContext(config=cfg, s3=s3_server.settings().__dict__, mlflow_uri="")
    store, root = ctx.store(), ctx.local("checkpoints")
    for k in (1, 2):
        write_samples(ctx.local(f"iter-{k}/samples.jsonl"), _samples())
    monkeypatch.setattr("infra.retention.registry_sources", lambda model: set())  # no registry in this test
    tr1 = stages.train_policy.fn(ctx, 1, "s3://unused/iter-1/samples.jsonl", Checkpoint(name="base", local=str(tiny)))
    ck1 = Path(tr1.checkpoint.local)
    assert (ck1 / "optimizer" / "state.pt").exists()
    before = sum(p.stat().st_size for p in ck1.rglob("*") if p.is_file())
    assert prune_campaign(store, cfg.checkpoints, "unused", root, log=None) == []
    assert not ck1.exists()  # verified on S3: the local copy is gone
    assert store.verify_manifest("iter-1/checkpoint.manifest.json") == []

    resumed = stages.train_policy.fn(ctx, 1, "s3://unused/iter-1/samples.jsonl", Checkpoint(name="base", local=str(tiny)))
    assert resumed.resumed and resumed.checkpoint == tr1.checkpoint and not ck1.exists()  # nothing recomputed
    tr2 = stages.train_policy.fn(ctx, 2, "s3://unused/iter-2/samples.jsonl", resumed.checkpoint)
    assert tr2.steps == 1 and ck1.is_dir()  # the parent was fetched back from S3
    man = json.loads((Path(tr2.checkpoint.local) / "rao-checkpoint.json").read_text())
    assert man["optimizer_state"]["continued"] is True, man["optimizer_state"]
    # after iteration 2: iteration 1 (no alias) is pruned, iteration 2 keeps its optimizer state on S3 only
    assert prune_campaign(store, cfg.checkpoints, "unused", root, log=None) == [1]
    assert not [p for p in root.iterdir() if p.is_dir()] and not any(k.startswith("iter-1/checkpoint") for k in store.list())
    assert "iter-2/checkpoint/optimizer/state.pt" in store.list("iter-2/")
    print(f"tiny checkpoint {before} bytes locally before, 0 after")
