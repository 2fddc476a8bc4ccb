"""What every Prefect task of the pipeline shares: the run context, artifact I/O and resumable stages.

A stage (one Prefect task, made by :func:`stage`) writes its outputs to S3 under
``CAMPAIGN/iter-K/<stage>/...`` and then a completion marker ``CAMPAIGN/iter-K/_done/<stage>.json``
holding its return value (an ``infra.stage_records`` record: URIs and small metrics). Re-running a campaign
with the same name returns the stored value of every stage whose marker exists, so nothing completed is
recomputed and an interrupted iteration restarts at its first unfinished stage. Local copies live under
``$RAO_HOME/campaigns/CAMPAIGN`` (a cache: it can be deleted).
Docs: docs/pipeline/resume-and-faults.md.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import time
from pathlib import Path
from typing import Any, Callable, TypeVar, get_type_hints

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.context import get_run_context
from pydantic import BaseModel

from infra.disk import as_disk_full
from infra.storage import ArtifactStore, S3Settings
from rao_core.config import CampaignConfig
from rao_core.paths import rao_home
from infra.stage_records import StageRecord

R = TypeVar("R", bound=StageRecord)


class RunContext(BaseModel):
    """Small, serialisable context handed to every task (no large objects)."""

    config: CampaignConfig
    s3: dict[str, Any]  # S3Settings fields
    mlflow_uri: str
    mlflow_experiment_id: str = ""
    campaign_run_id: str = ""  # MLflow parent run

    @property
    def name(self) -> str:
        return self.config.name

    def store(self) -> ArtifactStore:
        """The campaign's artifact store (prefix = campaign name)."""
        return ArtifactStore(S3Settings(**self.s3), self.name)

    def local(self, rel: str = "") -> Path:
        """Local cache path for ``rel`` (created on demand)."""
        p = rao_home() / "campaigns" / self.name / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p


def iter_key(iteration: int | str, rel: str = "") -> str:
    """S3 key (relative to the campaign) of ``rel`` inside iteration ``iteration`` (a number, or a folder
    name such as the nightly evaluation's)."""
    it = iteration if isinstance(iteration, str) else f"iter-{iteration}"
    return f"{it}/{rel}".rstrip("/")


def artifact_key(campaign: str, stage: str, iteration: int | str | None = None) -> str:
    """The key of every Prefect artifact of the pipeline: ``<campaign>-iter-<n>-<stage>``, or
    ``<campaign>-<stage>`` when ``iteration`` is None (the nightly evaluation's comparison).

    Args:
        campaign: the campaign (or evaluation) name, as the user wrote it (e.g. ``My_Run.v2``).
        stage: what the artifact shows (``validation``, ``eval``, ``generate-progress``, ...).
        iteration: an iteration number, or a folder name such as ``"iter-0"`` (used as it is).

    Returns:
        The key normalised to what Prefect accepts (lowercase letters, digits and single dashes, none at
        either end; ``prefect.types.names.raise_on_name_alphanumeric_dashes_only``): every other character
        becomes a dash, e.g. ``artifact_key("My_Run.v2", "eval", 3) == "my-run-v2-iter-3-eval"``.

    Raises:
        ValueError: nothing of ``campaign`` or ``stage`` is left after normalisation.
    """

    def norm(part: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", str(part).lower()).strip("-")

    if not norm(campaign) or not norm(stage):
        raise ValueError(f"artifact key needs a campaign and a stage with letters or digits, "
                         f"got {campaign!r} and {stage!r}")
    it = [] if iteration is None else [iteration if isinstance(iteration, str) else f"iter-{iteration}"]
    return "-".join(n for n in map(norm, [campaign, *it, stage]) if n)


def run_logger():
    """Prefect's logger of the current flow or task run (its lines reach the run's log in the UI); outside a
    run (a direct ``.fn()`` call, a test) the standard ``logging`` logger ``rao``."""
    try:
        return get_run_logger()
    except Exception:  # outside a run context
        import logging

        return logging.getLogger("rao")


def in_prefect_run() -> bool:
    """Whether the caller runs inside a Prefect flow run or task run: the one "are we in a run?" check of the
    pipeline. Every Prefect artifact (``create_*_artifact``, :class:`ProgressArtifact`) is written only when it
    is True; outside a run the call is skipped.

    Returns:
        True when Prefect's run context is set (``prefect.context.get_run_context`` finds a ``FlowRunContext``
        or a ``TaskRunContext``): in a flow or task that Prefect is running, and in what it calls. False
        elsewhere: a direct ``task.fn(...)`` call, a test, a script. It is the check Prefect itself makes before
        warning "Artifact creation outside of a flow or task run is deprecated" (a FutureWarning).

    Never raises: an error while reading the context counts as "not in a run" (False).
    """
    try:
        get_run_context()  # MissingContextError outside a flow or task run
    except Exception:  # noqa: BLE001 - no usable run context, whatever the reason
        return False
    return True


class ProgressArtifact:
    """A Prefect progress artifact (0-100 %) for one stage, fed by a library progress callback: an instance
    is the ``on_progress(done, total)`` that ``rao_core`` takes (``run_trees``, ``train``).

    The first call creates the artifact (``prefect.artifacts.create_progress_artifact``, key ``key``); later
    calls update it (``update_progress_artifact``) at most once per ``min_interval_s`` seconds, except the
    last unit (``done >= total``), always sent. Outside a Prefect flow or task run it does nothing (no API
    to write to), and it never raises: after the first failure of the artifact API (logged once as a
    warning) it stops trying, and the stage goes on.

    Args:
        key: the artifact key (:func:`artifact_key`), e.g. ``smoke-iter-1-generate-progress``.
        description: what is counted, e.g. ``"rollout trees"``: the artifact's description reads
            ``"<description>: <done>/<total>"``.
        min_interval_s: the shortest time between two updates, seconds.
        enabled: None: only inside a Prefect flow or task run (:func:`in_prefect_run`); True/False: force.
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, key: str, description: str, *, min_interval_s: float = 5.0, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if enabled is None:
            enabled = in_prefect_run()
        self.key, self.description, self.min_interval_s = key, description, min_interval_s
        self.enabled, self.clock = enabled, clock
        self.artifact_id: Any = None
        self.sent: tuple[int, int] | None = None  # the last (done, total) written
        self._counted = False  # a count or the finish was written: notes no longer are
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        final = total > 0 and done >= total
        if self.artifact_id is not None and not final and now - self._last < self.min_interval_s:
            return
        percent = min(100.0, 100.0 * done / total) if total > 0 else 0.0
        self._write(percent, f"{self.description}: {done}/{total}", now, (done, total))
        self._counted = self._counted or self.sent == (done, total)

    def note(self, text: str) -> None:
        """Before the first unit is counted: write the artifact at 0 % with ``text`` as its description (e.g.
        the warm start's SFT while its trainer loads: ``SFT: training process: model and optimizer ready; ...``),
        so it shows before the total is known. Nothing once a count or :meth:`finish` was written (neither is
        overwritten)."""
        if self.enabled and not self._counted:
            self._write(0.0, text, self.clock(), (0, 0))

    def finish(self, text: str) -> None:
        """Write the artifact as complete (100 %) with ``text`` as its description, e.g. a stage that had
        nothing to count: ``no update: ...`` (at once, whatever ``min_interval_s``; same rules otherwise)."""
        if self.enabled:
            self._write(100.0, text, self.clock(), (0, 0))
            self._counted = True

    def _write(self, percent: float, text: str, now: float, sent: tuple[int, int]) -> None:
        try:
            from prefect import artifacts

            if self.artifact_id is None:
                self.artifact_id = artifacts.create_progress_artifact(progress=percent, key=self.key, description=text)
            else:
                artifacts.update_progress_artifact(artifact_id=self.artifact_id, progress=percent, description=text)
        except Exception as e:  # noqa: BLE001 - the UI's progress never fails the stage
            import logging

            self.enabled = False
            logging.getLogger("rao").warning(f"progress artifact {self.key}: {type(e).__name__}: {e}; "
                                             f"no more progress updates for this stage")
            return
        self._last, self.sent = now, sent


def done_key(iteration: int | str, stage: str) -> str:
    """S3 key of a stage's completion marker."""
    return iter_key(iteration, f"_done/{stage}.json")


def stage_label(iteration: int | str, stage_name: str) -> str:
    """``iteration 2 train``, ``warm_start`` (the warm start's ``iter-0``): a stage as a user reads it."""
    return f"iteration {iteration} {stage_name}" if isinstance(iteration, int) else stage_name.replace("_", " ")


def stored_record(ctx: RunContext, iteration: int | str, stage_name: str, record: type[R]) -> R:
    """The record a completed stage stored in its marker (``resumed`` True), as :func:`stage` returns it on
    resume, without a task run. Raises FileNotFoundError naming the stage when it has not completed."""
    store, key = ctx.store(), done_key(iteration, stage_name)
    if not store.exists(key):
        raise FileNotFoundError(f"{stage_label(iteration, stage_name)} has not completed (no marker {store.uri(key)})")
    return _marker_record(store, key, record)


def _marker_record(store: ArtifactStore, key: str, record: type[R]) -> R:
    """The record stored in the marker ``key`` of ``store``, marked ``resumed``."""
    return record.model_validate({**json.loads(store.get_bytes(key)), "resumed": True})


def stage(stage_name: str, **task_options: Any) -> Callable[[Callable[..., R]], Task[..., R]]:
    """Make ``fn(ctx, iteration, ...) -> StageRecord`` a resumable Prefect task (``task_options`` go to
    ``prefect.task``; ``cache_policy`` defaults to NONE).

    When the marker ``iteration/_done/<stage_name>.json`` exists, the task returns the record stored there
    (``resumed`` True) without running ``fn``; else it runs ``fn``, sets ``stage_s`` (wall seconds) and
    writes the marker. A full disk (``infra.disk.full_disk``) is raised as one ``DiskFullError`` line naming
    the path, its free space and this stage, where the campaign resumes. ``task.fn(...)`` runs with these
    semantics outside a flow; ``task.fn.__wrapped__`` is ``fn`` itself. ``iteration`` may be left to ``fn``'s
    default (the warm start's ``"iter-0"``).
    """

    def deco(fn: Callable[..., R]) -> Task[..., R]:
        record: type[StageRecord] = get_type_hints(fn)["return"]
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            ctx, iteration = bound.arguments["ctx"], bound.arguments["iteration"]
            store, key = ctx.store(), done_key(iteration, stage_name)
            if store.exists(key):
                return _marker_record(store, key, record)
            t0 = time.monotonic()
            try:
                out = fn(*bound.args, **bound.kwargs)
                out.stage_s = round(time.monotonic() - t0, 3)
                store.put_bytes(out.model_dump_json(by_alias=True, exclude={"resumed"}).encode(), key)
            except Exception as e:
                full = as_disk_full(e, resume=stage_label(iteration, stage_name))
                if full is None or full is e:
                    raise
                raise full from e
            return out

        return task(**{"cache_policy": NONE, **task_options})(wrapper)

    return deco


def fetch(ctx: RunContext, uri: str, rel: str) -> Path:
    """Local copy of the object at ``uri`` (downloaded and checksum-verified if absent)."""
    p = ctx.local(rel)
    if not p.exists():
        ctx.store().get_file(uri, p)
    return p


def fetch_dir(ctx: RunContext, uri_prefix: str, rel: str) -> Path:
    """Local copy of the folder at ``uri_prefix`` (``s3://BUCKET/KEY``, made by any campaign), cached when
    complete. Only a folder whose manifest ``KEY.manifest.json`` exists is read (the manifest is written
    after the folder's last object, so a folder whose upload was cut short is never read back), and
    exactly the objects it lists, each checked against its SHA-256 there (``ChecksumError`` naming the
    object). Raises FileNotFoundError when no object lies under it or it has no manifest."""
    import shutil

    p = ctx.local(rel)
    marker = p / ".complete"
    if marker.exists():
        return p
    bucket, _, key = uri_prefix.removeprefix("s3://").strip("/").partition("/")
    parent, _, leaf = key.rpartition("/")
    store = ArtifactStore(S3Settings(**{**ctx.s3, "bucket": bucket}), parent)
    if not uri_prefix.startswith("s3://") or not parent or not store.list(leaf + "/"):
        raise FileNotFoundError(f"no objects under {uri_prefix} (expected s3://BUCKET/CAMPAIGN/.../FOLDER)")
    manifest = f"{leaf}.manifest.json"
    if not store.exists(manifest):
        raise FileNotFoundError(f"{uri_prefix} has no manifest {store.uri(manifest)}: its upload did not complete "
                                f"(a folder is read only once its manifest is written)")
    if p.exists():  # left by an interrupted download: start clean, no stale file survives
        shutil.rmtree(p)
    store.get_dir(leaf, p, manifest=manifest)
    marker.write_text("ok")
    return p
