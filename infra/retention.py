"""Checkpoint retention: bounded disk by default, keeping what users come back to and what resume needs.

After each iteration the campaign calls :func:`prune_campaign` with the ``checkpoints`` settings
(``rao_core.config.CheckpointSettings``). By default S3 keeps iteration 0 (the warm start: the base of LoRA
adapters and the KL reference), the newest ``keep_last`` iterations (the parent of the next, so resume works) and
every version a registry alias points at (:func:`prune_checkpoints`; pruned versions are tagged ``rao.pruned``);
the optimizer state only of the newest checkpoint, its manifest rewritten first (:func:`drop_optimizer_state`);
no local copy once its upload is verified (:func:`remove_local_copies`). Trees, samples, reports and markers are
kept (they are small); ``rao campaigns list`` / ``rm`` show and free a whole campaign.
Docs: docs/pipeline/gpu.md (retention).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.storage import ArtifactStore

__all__ = ["RetentionReport", "apply_retention", "checkpoint_iterations", "drop_optimizer_state", "fetch_checkpoint",
           "fetchable_iterations", "prune_checkpoints", "prune_campaign", "registry_sources", "remove_local_copies", "upload_verified",
           "folder_bytes"]

OPTIMIZER_DIR = "optimizer"  # rao_core.train.trainer.OPTIMIZER_DIR (not imported: no torch here)

_CKPT_KEY = re.compile(r"^iter-(\d+)/checkpoint(/|\.manifest\.json$)")


def checkpoint_iterations(store: ArtifactStore) -> list[int]:
    """Iterations that have a checkpoint on S3 (``iter-K/checkpoint/...``), ascending."""
    return sorted({int(m.group(1)) for k in store.list("iter-") if (m := _CKPT_KEY.match(k))})


def _iteration_of(store: ArtifactStore, uri: str) -> int | None:
    """K when ``uri`` is this campaign's ``s3://BUCKET/CAMPAIGN/iter-K/checkpoint`` folder, else None."""
    prefix = store.uri("")
    if not uri.startswith(prefix):
        return None
    m = re.fullmatch(r"iter-(\d+)/checkpoint/?", uri[len(prefix):])
    return int(m.group(1)) if m else None


def prune_checkpoints(store: ArtifactStore, keep_last: int, *, protected_uris: Iterable[str] = (),
                      local_root: Path | None = None) -> list[int]:
    """Delete the checkpoints of all iterations except iteration 0, the newest ``keep_last`` and those whose
    folder URI is in ``protected_uris``; also their folders ``local_root/iter-K`` when given.

    Returns the pruned iterations, ascending. ``keep_last`` must be >= 1 (the newest checkpoint is the
    parent of the next iteration).
    """
    if keep_last < 1:
        raise ValueError(f"keep_last = {keep_last}: at least the newest checkpoint must be kept")
    iters = checkpoint_iterations(store)
    keep = {0, *iters[-keep_last:]}
    keep |= {k for u in protected_uris if (k := _iteration_of(store, u)) is not None}
    pruned = [k for k in iters if k not in keep]
    for k in pruned:
        # the manifest last: a folder without its manifest is never mistaken for a verified checkpoint
        keys = store.list(f"iter-{k}/checkpoint/") + [f"iter-{k}/checkpoint.manifest.json"]
        for key in keys:
            store.delete(key)
        if local_root is not None and (local_root / f"iter-{k}").is_dir():
            shutil.rmtree(local_root / f"iter-{k}")
    return pruned


def registry_sources(model_name: str, aliases: Iterable[str] = ("champion", "candidate")) -> set[str]:
    """S3 sources of the versions of ``model_name`` that the given aliases point at (MLflow registry)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client, out = MlflowClient(), set()
    for alias in aliases:
        try:
            out.add(client.get_model_version_by_alias(model_name, alias).source)
        except MlflowException:
            pass
    return out


def _tag_pruned_versions(store: ArtifactStore, model_name: str, pruned: list[int]) -> None:
    from mlflow import MlflowClient

    client = MlflowClient()
    gone = {store.uri(f"iter-{k}/checkpoint") for k in pruned}
    for mv in client.search_model_versions(f"name = '{model_name}'"):
        if mv.source.rstrip("/") in gone:
            client.set_model_version_tag(model_name, mv.version, "rao.pruned", "true")


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def _manifest_key(k: int) -> str:
    return f"iter-{k}/checkpoint.manifest.json"


def _object_bytes(store: ArtifactStore, key_prefix: str) -> int:
    """Bytes of the objects under ``key_prefix`` (relative to the store's prefix)."""
    full, total, token = store._key(key_prefix), 0, None
    while True:
        kw: dict[str, Any] = {"Bucket": store.settings.bucket, "Prefix": full}
        if token:
            kw["ContinuationToken"] = token
        r = store.client.list_objects_v2(**kw)
        total += sum(o["Size"] for o in r.get("Contents", []))
        if not r.get("IsTruncated"):
            return total
        token = r["NextContinuationToken"]


def drop_optimizer_state(store: ArtifactStore, k: int, local_root: Path | None = None) -> int:
    """Delete the optimizer state of iteration ``k``'s checkpoint (``iter-K/checkpoint/optimizer/``) on S3,
    and in ``local_root/iter-K`` when given. The manifest is rewritten without those objects before they are
    deleted (a fetch reads exactly the manifest's objects). Returns the S3 bytes freed."""
    prefix = f"iter-{k}/checkpoint/{OPTIMIZER_DIR}/"
    keys = store.list(prefix)
    freed = _object_bytes(store, prefix) if keys else 0
    if keys and store.exists(_manifest_key(k)):
        entries = json.loads(store.get_bytes(_manifest_key(k)))["objects"]
        opt_uri = store.uri(prefix)
        kept = [e for e in entries if not e["uri"].startswith(opt_uri)]
        if len(kept) != len(entries):
            store.write_manifest(_manifest_key(k), kept)
    for key in keys:
        store.delete(key)
    if local_root is not None:
        folder = local_root / f"iter-{k}" / OPTIMIZER_DIR
        if folder.is_dir():
            shutil.rmtree(folder)
    return freed


def fetchable_iterations(store: ArtifactStore) -> list[int]:
    """Iterations whose checkpoint upload completed (``iter-K/checkpoint.manifest.json`` exists), ascending: the
    ones :func:`fetch_checkpoint` can read (a folder without its manifest is mid-upload, cut short or mid-prune)."""
    return [k for k in checkpoint_iterations(store) if store.exists(_manifest_key(k))]


def _listed_sizes(store: ArtifactStore, k: int) -> dict[str, int | None]:
    """{path relative to the checkpoint folder: bytes} of the objects iteration ``k``'s manifest lists."""
    base = store.uri(f"iter-{k}/checkpoint/")
    return {e["uri"][len(base):]: e.get("bytes") for e in json.loads(store.get_bytes(_manifest_key(k)))["objects"]
            if e["uri"].startswith(base)}


def fetch_checkpoint(store: ArtifactStore, k: int, dest: Path, optimizer: bool = True) -> int:
    """Copy iteration ``k``'s checkpoint from S3 into ``dest`` (its local folder, e.g.
    ``$RAO_HOME/campaigns/NAME/checkpoints/iter-K``, where the campaign's records name it): exactly the objects
    its manifest lists, each checked against its SHA-256 (``infra.storage.ChecksumError`` naming an object that
    differs). The objects land in ``dest`` + ``.partial`` first and replace ``dest`` once all are there, so a
    fetch that fails leaves ``dest`` as it was and no ``.partial`` (a hard kill leaves ``.partial``, cleared by
    the next fetch). Returns the bytes fetched; 0, downloading nothing, when ``dest`` already holds every file
    the manifest lists at its size. ``optimizer=False`` leaves out the optimizer state (``optimizer/``: two thirds
    of a full checkpoint; what serving and evaluating need is the rest). Raises FileNotFoundError when S3 has no
    manifest of iteration ``k`` (never uploaded, cut short, or pruned by retention)."""
    if not store.exists(_manifest_key(k)):
        have = ", ".join(f"iter-{i}" for i in fetchable_iterations(store)) or "none"
        raise FileNotFoundError(f"no checkpoint of iteration {k} on S3 ({store.uri(_manifest_key(k))} is absent; "
                                f"complete checkpoints there: {have})")
    skip = None if optimizer else f"{OPTIMIZER_DIR}/"
    listed = {rel: size for rel, size in _listed_sizes(store, k).items() if not (skip and rel.startswith(skip))}
    if dest.is_dir() and all((dest / rel).is_file() and size in (None, (dest / rel).stat().st_size)
                             for rel, size in listed.items()):
        return 0
    part = dest.with_name(dest.name + ".partial")
    if part.exists():  # left by an interrupted fetch: start clean
        shutil.rmtree(part)
    try:
        store.get_dir(f"iter-{k}/checkpoint", part, manifest=_manifest_key(k), skip=skip)
        if dest.is_symlink() or dest.is_file():  # a link to another disk, a stray file: replaced, not followed
            dest.unlink()
        elif dest.exists():  # an incomplete copy (a file missing or of another size): replaced whole
            shutil.rmtree(dest)
        part.rename(dest)
    except BaseException:  # a checksum error, a full disk, Ctrl-C: nothing half-fetched stays behind
        shutil.rmtree(part, ignore_errors=True)
        raise
    return folder_bytes(dest)


def upload_verified(store: ArtifactStore, k: int, folder: Path) -> bool:
    """True when ``folder`` (a local copy of iteration ``k``'s checkpoint) is safely on S3: its manifest
    exists, every object the manifest lists is there with the SHA-256 recorded at upload
    (``ArtifactStore.verify_manifest``), and every file of the folder (but the ``.complete`` marker) is
    listed with its size."""
    if not store.exists(_manifest_key(k)):
        return False
    if store.verify_manifest(_manifest_key(k)):
        return False
    listed = _listed_sizes(store, k)
    for p in folder.rglob("*"):
        if p.is_file() and p.name != ".complete":
            rel = p.relative_to(folder).as_posix()
            if rel not in listed or (listed[rel] is not None and listed[rel] != p.stat().st_size):
                return False
    return True


def remove_local_copies(store: ArtifactStore, local_root: Path, keep: Iterable[int] = ()) -> dict[str, int]:
    """Remove the local checkpoint folders under ``local_root`` that S3 holds: ``iter-K`` whose upload is
    verified (:func:`upload_verified`), except the iterations in ``keep``; and folders of other names that
    ``infra.stage_io.fetch_dir`` downloaded whole (their ``.complete`` marker: a checked copy of an S3 folder).
    A folder that is not verified (an upload cut short) stays. Returns {folder name: bytes freed}."""
    freed: dict[str, int] = {}
    if not local_root.is_dir():
        return freed
    keep = set(keep)
    for folder in sorted(local_root.iterdir()):
        if not folder.is_dir():
            continue
        m = re.fullmatch(r"iter-(\d+)", folder.name)
        if m:
            k = int(m.group(1))
            if k in keep or not upload_verified(store, k, folder):
                continue
        elif not (folder / ".complete").exists():
            continue
        freed[folder.name] = folder_bytes(folder)
        shutil.rmtree(folder)
    return freed


@dataclass
class RetentionReport:
    """What one :func:`apply_retention` did."""

    pruned: list[int] = field(default_factory=list)  # iterations whose checkpoint was deleted from S3
    optimizer_dropped: list[int] = field(default_factory=list)  # iterations whose optimizer state was deleted
    local_removed: dict[str, int] = field(default_factory=dict)  # local folder -> bytes freed
    s3_freed: int = 0  # bytes freed on S3 (pruned checkpoints and optimizer states)
    where: str = ""  # the store's root and server (ArtifactStore.where), named in the line

    def line(self) -> str:
        """One log line (empty when nothing was done)."""
        parts = []
        if self.pruned:
            parts.append("deleted checkpoints " + ", ".join(f"iter-{k}" for k in self.pruned))
        if self.optimizer_dropped:
            parts.append("optimizer state of " + ", ".join(f"iter-{k}" for k in self.optimizer_dropped))
        if self.local_removed:
            parts.append("removed the local copies of " + ", ".join(self.local_removed) + " (kept on S3)")
        if not parts:
            return ""
        local = sum(self.local_removed.values())
        on = f"S3 ({self.where})" if self.where else "S3"
        return f"retention: {'; '.join(parts)}: freed {self.s3_freed / 1e6:.0f} MB on {on}, {local / 1e6:.0f} MB local"


def _settings(policy: Any) -> Any:
    from rao_core.config import CheckpointSettings

    if policy is None:
        return CheckpointSettings()
    if isinstance(policy, int):  # the former signature: prune_campaign(store, keep_last, ...)
        return CheckpointSettings(keep_last=policy, optimizer_state="all", local_copies="all")
    return policy


def apply_retention(store: ArtifactStore, policy: Any, local_root: Path | None = None,
                    protected_uris: Iterable[str] = ()) -> RetentionReport:
    """Apply ``policy`` (a ``CheckpointSettings``; None: its defaults) to one campaign: prune old checkpoints
    (``keep_last``; iteration 0 and ``protected_uris`` stay), drop the optimizer state of every checkpoint
    but the newest (``optimizer_state: latest``), remove verified local copies (``local_copies``)."""
    cs = _settings(policy)
    rep = RetentionReport(where=store.where())
    before = {k: _object_bytes(store, f"iter-{k}/checkpoint/") for k in checkpoint_iterations(store)}
    if cs.keep_last:
        rep.pruned = prune_checkpoints(store, cs.keep_last, protected_uris=protected_uris, local_root=local_root)
        rep.s3_freed += sum(before.get(k, 0) for k in rep.pruned)
    iters = checkpoint_iterations(store)
    if cs.optimizer_state == "latest" and iters:
        for k in iters[:-1]:
            freed = drop_optimizer_state(store, k, local_root)
            if freed:
                rep.optimizer_dropped.append(k)
                rep.s3_freed += freed
    if local_root is not None and cs.local_copies != "all":
        keep = {iters[-1]} if cs.local_copies == "latest" and iters else set()
        rep.local_removed = remove_local_copies(store, local_root, keep)
    return rep


def prune_campaign(store: ArtifactStore, policy: Any, registered_model: str, local_root: Path,
                   *, log: Any = print) -> list[int]:
    """:func:`apply_retention` with ``policy`` (``CheckpointSettings``; an int is the former ``keep_last``
    alone), protecting the registry's aliased versions; tags the versions whose checkpoint was deleted
    ``rao.pruned = true``; logs one line of what was freed. Returns the pruned iterations."""
    rep = apply_retention(store, policy, local_root, protected_uris=registry_sources(registered_model))
    if rep.pruned:
        _tag_pruned_versions(store, registered_model, rep.pruned)
    if log is not None and rep.line():
        log(rep.line())
    return rep.pruned
