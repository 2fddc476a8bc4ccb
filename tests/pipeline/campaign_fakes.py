"""Fakes shared by the campaign-loop tests (the collapse guard, ``eval.every``): an in-memory artifact store,
evaluation records built from per-task outcomes and a campaign whose stages need no model."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from infra.stage_records import (Checkpoint, EvalOutput, GenerateOutput, JudgeOutput, LogOutput, ServedEndpoint,
                                 TrainOutput, ValidateOutput, WarmStartOutput)


class MemoryStore:
    """The calls of ``infra.storage.ArtifactStore`` the campaign makes here, on a dict."""

    def __init__(self, prefix: str):
        self.prefix, self.objects = prefix, {}

    def uri(self, key: str) -> str:
        return f"s3://rao/{self.prefix}/{key}"

    def exists(self, key: str) -> bool:
        return key in self.objects

    def put_bytes(self, data: bytes, key: str) -> dict:
        self.objects[key] = data
        return {"uri": self.uri(key), "size": len(data)}

    def get_bytes(self, key: str) -> bytes:
        return self.objects[key]

    def list(self, key_prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(key_prefix))


def eval_row(difficulty: str, outcomes: list[int]) -> dict:
    """A recursive-mode evaluation row of ``difficulty``: task ``<difficulty>-<i>`` has outcome ``outcomes[i]``."""
    s = sum(outcomes)
    return {"mode": "recursive", "difficulty": difficulty, "n": len(outcomes), "successes": s,
            "success": s / len(outcomes), "ci95": "[0.00, 1.00]",
            "per_task": {f"{difficulty}-{i}": v for i, v in enumerate(outcomes)}}


def eval_output(rows: list[dict]) -> EvalOutput:
    """The evaluate stage's record of ``rows``: each row's success as ``eval/recursive/<difficulty>/success``."""
    return EvalOutput(metrics={f"eval/recursive/{r['difficulty']}/success": r["success"] for r in rows}, rows=rows)


@contextlib.contextmanager
def fake_campaign(monkeypatch, tmp_path, rec: dict, name: str, model: str,
                  evaluate: Callable[[int], EvalOutput], *, iterations: int, sample_stats: dict | None = None,
                  on_train: Callable[[int, Checkpoint], None] | None = None,
                  on_serve: Callable[[Checkpoint], None] | None = None,
                  on_log: Callable[[int, EvalOutput], None] | None = None,
                  on_prune: Callable[[], None] | None = None, stage_lines: bool = False):
    """``flows.campaign`` with the stages that need a model faked, for the campaign-loop tests to run its real loops
    (synchronous and overlapped), registry and MLflow (SQLite under ``tmp_path``) without vLLM, a Prefect API or
    SeaweedFS: S3 is ``MemoryStore(name)``; warm start, generate, judge, validate and train are resumable fakes
    (markers in the store) that make no model, checkpoint ``k`` being ``<name>-iter-<k>-checkpoint``; ``evaluate``
    returns ``evaluate(iteration)``; serving, the disk reserve and retention are no-ops; ``skip_evaluation``,
    ``register_checkpoint`` and ``register_held`` are the real stages, run without a Prefect task run.

    What a test checks differs, so it is recorded by hooks into ``rec``, which also gets ``lines`` (the flow's lines
    logged, with ``stage_lines`` also the stages' lines on the ``rao`` logger at INFO) and ``store``:
    ``on_train(iteration, parent)`` at each training, ``on_serve(checkpoint)`` at each serve, ``on_log(k, ev)`` at
    each iteration logged to MLflow, ``on_prune()`` at each retention pass; ``sample_stats`` is what validate
    reports (the guard's depth diagnostics). A context manager for a fixture to yield from: it yields
    ``run(*overrides, iterations=iterations) -> (summary, rec)``, a campaign ``name`` of the registered ``model`` on
    configs/cpu-smoke.yaml, and undoes the logging and the MLflow tracking URI on exit (monkeypatch the rest)."""
    import mlflow

    import flows.campaign as fc
    import infra.disk
    import infra.retention
    from infra.stage_io import RunContext, stage
    from infra.storage import S3Settings
    from tasks import stages, tracking
    from tasks.bookkeeping import register_held

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    store = MemoryStore(name)
    rec.update(lines=[], store=store)

    @contextlib.contextmanager
    def fake_storage(cfg):
        yield S3Settings("http://127.0.0.1:9", "rao", "k", "s")

    class Lines(logging.Handler):
        def emit(self, record):
            rec["lines"].append(record.getMessage())

    logger = logging.getLogger(f"rao.test.{name}")
    logger.setLevel(logging.INFO)
    handler = Lines()
    rao = logging.getLogger("rao")
    loggers = (logger, rao) if stage_lines else (logger,)  # the flow's lines; the stages' outside a Prefect run
    for lg in loggers:
        lg.addHandler(handler)
    rao_level = rao.level
    if stage_lines:
        rao.setLevel(logging.INFO)

    def checkpoint(k: int) -> Checkpoint:
        return Checkpoint(name=f"{name}-iter-{k}-checkpoint", uri=store.uri(f"iter-{k}/checkpoint"))

    @stage("generate", name="generate-trees")
    def generate(ctx, iteration, served, tok, policy_version=None) -> GenerateOutput:
        return GenerateOutput(trees_uri=store.uri(f"iter-{iteration}/trees.jsonl"), num_trees=24)

    @stage("judge", name="judge-trees")
    def judge(ctx, iteration, trees_uri) -> JudgeOutput:
        return JudgeOutput(scored_uri=trees_uri.replace("trees", "scored"))

    @stage("validate", name="validate-dataset")
    def validate(ctx, iteration, scored_uri) -> ValidateOutput:
        return ValidateOutput(samples_uri=store.uri(f"iter-{iteration}/samples.jsonl"), num_samples=40,
                              sample_stats=sample_stats or {})

    @stage("train", name="train-policy")
    def train(ctx, iteration, samples_uri, parent) -> TrainOutput:
        if on_train:
            on_train(iteration, parent)
        return TrainOutput(checkpoint=checkpoint(iteration), steps=1)

    @stage("evaluate", name="evaluate")
    def fake_evaluate(ctx, iteration, served, tok) -> EvalOutput:
        return evaluate(iteration)

    def log_iteration(ctx, k, run_id, gen, judged, val, tr, ev, times) -> LogOutput:
        if on_log:
            on_log(k, ev)
        return LogOutput(metrics={**ev.metrics, "success/root": 0.5}, times=times)

    def serve(ctx, ckpt):
        if on_serve:
            on_serve(ckpt)
        return ServedEndpoint()

    def prune(store_, policy, registered_model, local, **kw) -> list:
        if on_prune:
            on_prune()
        return []

    monkeypatch.setattr(fc, "storage", fake_storage)
    monkeypatch.setattr(fc, "ArtifactStore", lambda s3, name: store)
    monkeypatch.setattr(RunContext, "store", lambda self: store)
    monkeypatch.setattr(fc, "get_run_logger", lambda: logger)
    monkeypatch.setattr(infra.disk, "keep_reserve", lambda *a, **k: True)
    monkeypatch.setattr(infra.retention, "prune_campaign", prune)
    monkeypatch.setattr(fc, "warm_start", lambda ctx: WarmStartOutput(checkpoint=checkpoint(0), mode="demos"))
    monkeypatch.setattr(fc, "serve_checkpoint", serve)
    monkeypatch.setattr(fc, "_tokenizer_path", lambda ctx, ckpt: "")
    for stage_name, fake in (("generate_trees", generate), ("judge_trees", judge), ("validate_dataset", validate),
                             ("train_policy", train), ("evaluate", fake_evaluate)):
        monkeypatch.setattr(fc, stage_name, fake.fn)  # resumable stages (markers in the store), no task run
    monkeypatch.setattr(fc, "skip_evaluation", stages.skip_evaluation.fn)  # the real stages, no task run
    monkeypatch.setattr(fc, "register_checkpoint", stages.register_checkpoint.fn)
    monkeypatch.setattr(fc, "register_held", register_held.fn)
    monkeypatch.setattr(fc, "rao_iteration", fc.rao_iteration.fn)
    monkeypatch.setattr(fc, "rao_overlap_step", fc.rao_overlap_step.fn)
    monkeypatch.setattr(tracking, "log_iteration", log_iteration)

    def run(*overrides: str, iterations: int = iterations):
        params = fc.CampaignParams(config="configs/cpu-smoke.yaml", name=name, iterations=iterations,
                                   overrides=[f"model.registered_model={model}", "tracking.log_traces=false",
                                              *overrides])
        return fc.rao_campaign.fn(params), rec

    try:
        yield run
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
        rao.setLevel(rao_level)
        mlflow.set_tracking_uri(None)
