"""Typed records passed between the pipeline's Prefect tasks: checkpoints, the served endpoint, and one
output record per stage.

A stage's output record is also its completion marker on S3 (``CAMPAIGN/iter-K/_done/<stage>.json``,
``infra.stage_io.stage``): it is written with the same keys as before these records existed (``_stage_s``
for the wall time), and markers written then load into these records (fields they lack take their
defaults), so a campaign started before still resumes. ``resumed`` is never stored.
Docs: docs/pipeline/resume-and-faults.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Checkpoint(BaseModel):
    """A policy checkpoint: its name (which keys its local cache folder), its S3 prefix and/or local folder."""

    name: str
    uri: str | None = None  # s3://BUCKET/CAMPAIGN/iter-K/checkpoint
    local: str | None = None  # a folder holding config.json or adapter_config.json


class ServedReplica(BaseModel):
    """One replica of the policy server pool after a checkpoint switch: what it reported."""

    index: int  # 0-based, in the pool's order
    base_url: str
    checkpoint: str  # the checkpoint it serves now (reported: the switch succeeded on it)
    how: str  # same, start, start+lora, lora, reload, restart, external, external-lora
    switch_s: float = 0.0
    pid: int | None = None  # the vLLM process (None: external)
    models: list[str] = Field(default_factory=list)  # what GET /v1/models listed after the switch


class ServedEndpoint(BaseModel):
    """The policy server serving a checkpoint (``tasks.serve.serve_checkpoint``); empty when none is needed
    (a completed iteration replayed on resume). A pool of replicas (``serving.replicas``, ``serving.base_urls``)
    has every replica's URL in ``base_urls`` (``base_url`` is the first one's) and its report in ``replicas``."""

    base_url: str = ""  # OpenAI-compatible API root, .../v1
    model: str = ""  # served model name (a LoRA adapter's name when one is loaded)
    switch_s: float = 0.0  # seconds spent switching to the checkpoint (every replica, at once)
    how: str = ""  # same, start, start+lora, lora, reload, restart, external, external-lora ('a+b': replicas differ)
    start_phases: dict[str, float] = Field(default_factory=dict)  # a (re)start: seconds to each phase (infra.serving)
    base_urls: list[str] = Field(default_factory=list)  # every replica's .../v1 (empty: [base_url])
    replicas: list[ServedReplica] = Field(default_factory=list)
    replica_offset: int = 0  # the replica a pool's ties start from (a Ray shard's index: infra.ray_rollouts)
    seeded: bool = True  # the requests carry their sampling seeds (serving.request_seeds; off for vLLM on CPU)
    # True: servers this pool started, which get this installation's key; None (external servers, or not said):
    # it only when they are RAO_POLICY_BASE_URL's or on loopback (rao_core.policies.openai_policy.policy_client_key)
    own: bool | None = None

    @property
    def urls(self) -> list[str]:
        """The pool's base URLs, in replica order (``[base_url]`` for a single server; empty for none)."""
        return list(self.base_urls) or ([self.base_url] if self.base_url else [])


class StageRecord(BaseModel):
    """What every stage returns besides its own fields: its wall time and whether it came from the marker."""

    model_config = ConfigDict(populate_by_name=True, ser_json_inf_nan="constants")  # NaN stored as NaN

    stage_s: float | None = Field(None, alias="_stage_s")  # wall seconds of the run that completed the stage
    resumed: bool = Field(False, alias="_resumed")  # True: loaded from the completion marker, not recomputed


class WarmStartOutput(StageRecord):
    """``warm_start``: the iteration-0 checkpoint and, for ``demos``, what built it."""

    checkpoint: Checkpoint
    mode: str
    demos_uri: str | None = None
    stats: dict[str, Any] = Field(default_factory=dict)  # demonstration statistics
    demo_s: float | None = None
    sft_s: float | None = None
    sft_steps: int | None = None


class GenerateOutput(StageRecord):
    """``generate``: the iteration's execution trees."""

    trees_uri: str
    sha256: str = ""
    num_trees: int = 0
    crashed: int = 0  # trees whose runtime failed
    infra_failures: dict[str, int] = Field(default_factory=dict)  # trees per infrastructure failure (stages.py)
    generation_s: float | None = None  # rollouts alone (no set-up)
    serving: dict[str, float] = Field(default_factory=dict)  # vLLM /metrics over generation


class JudgeOutput(StageRecord):
    """``judge``: the scored trees (node rewards of Eq. 1) and the judge's statistics."""

    scored_uri: str
    sha256: str = ""
    judge: dict[str, Any] = Field(default_factory=dict)


class ValidateOutput(StageRecord):
    """``validate``: the training samples that passed the validation suite."""

    samples_uri: str
    report_uri: str = ""
    num_samples: int = 0
    sample_stats: dict[str, Any] = Field(default_factory=dict)


class TrainOutput(StageRecord):
    """``train``: the new checkpoint and the trainer's per-step metrics."""

    checkpoint: Checkpoint
    steps: int = 0  # optimizer steps (0: the parent's weights, copied)
    train_s: float = 0.0
    last_step: dict[str, float] = Field(default_factory=dict)
    metrics: list[dict[str, float]] = Field(default_factory=list)  # one dict per optimizer step
    peak_rss_mb: float | None = None  # the training child's peak RSS (``trainer.process: subprocess``)


class EvalOutput(StageRecord):
    """``evaluate``: flat ``eval/<benchmark>/<mode>/<difficulty>/...`` metrics and one table row per benchmark, mode
    and difficulty (each row naming its ``benchmark``; records written before rows named it hold the training
    benchmark's rows and ``eval/<mode>/<difficulty>/...`` keys).

    An iteration the campaign does not evaluate (``eval.every``) stores ``evaluated`` False, no metrics, no rows,
    and ``trained_from``: the collapse guard walks from it to the last evaluated iteration of the lineage."""

    metrics: dict[str, float] = Field(default_factory=dict)
    rows: list[dict[str, Any]] = Field(default_factory=list)
    report_uri: str = ""
    evaluated: bool = True  # False: skipped by eval.every (metrics and rows empty)
    trained_from: int | None = None  # a skipped iteration's reference: the iteration whose checkpoint it trained from


class LogOutput(StageRecord):
    """``log``: what an iteration logged to MLflow (``tasks.tracking.log_iteration``), logged once: a re-run
    reads it back from the marker instead of logging again."""

    metrics: dict[str, float] = Field(default_factory=dict)
    times: dict[str, float] = Field(default_factory=dict)  # wall seconds per stage of the run that logged them


class RegisterOutput(StageRecord):
    """``register``: the model version of the checkpoint and whether ``champion`` moved to it."""

    model: str
    version: str | None = None
    champion: bool = False
    metric: str = ""
    score: float | None = None
    updated: bool = True
