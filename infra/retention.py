"""Checkpoint retention: delete old iteration checkpoints, keeping what resume and the registry need.

A full-weight checkpoint of a 4B model is 8 GB on S3 and again in the local cache, every iteration
(issue 18). With ``checkpoints.keep_last: N`` the campaign calls :func:`prune_campaign` after each
iteration; it keeps

- the newest ``N`` iteration checkpoints (the newest is the parent of the next iteration, so resume works),
- iteration 0 (the warm-start checkpoint: the base model of LoRA adapters and the KL reference),
- every checkpoint a registry alias points at (``champion``, ``candidate``: their S3 sources),

and deletes the others: the objects under ``iter-K/checkpoint/``, ``iter-K/checkpoint.manifest.json``
and the local cache folder ``checkpoints/iter-K``. Model versions whose source was deleted get the tag
``rao.pruned = true``, so the registry says which versions can no longer be loaded. Trees, samples,
reports and completion markers are kept (they are small).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from infra.storage import ArtifactStore

__all__ = ["checkpoint_iterations", "prune_checkpoints", "prune_campaign", "registry_sources"]

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


def prune_campaign(store: ArtifactStore, keep_last: int, registered_model: str, local_root: Path) -> list[int]:
    """:func:`prune_checkpoints` protecting the registry's aliased versions; tags the versions whose
    checkpoint was deleted ``rao.pruned = true``. Returns the pruned iterations."""
    pruned = prune_checkpoints(store, keep_last, protected_uris=registry_sources(registered_model),
                               local_root=local_root)
    if pruned:
        _tag_pruned_versions(store, registered_model, pruned)
    return pruned
