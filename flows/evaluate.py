"""The ``rao-evaluate`` flow: the nightly benchmark regression.

Evaluates a registered model version or alias (default ``candidate``) on a benchmark suite (each listed
environment at its difficulties, recursive and single-agent modes) and compares every metric with the
``champion`` alias's recorded scores: a drop larger than the tolerance fails the flow run with a clear
message and a Prefect table artifact listing each comparison. Each entry is evaluated by
``tasks.stages.evaluate_checkpoint`` (``run_evaluation``, i.e. ``rao_core.evaluation.evaluate_suite``, the
code of the campaign's evaluation and of ``rao eval``); ``tasks.tracking.log_evaluation`` logs the results
and the comparison.
"""

from __future__ import annotations

import json
import time
from typing import Any

from prefect import flow, get_run_logger
from pydantic import BaseModel, Field

from rao_core.evaluation import EvalConfig, Mode
from tasks import tracking
from tasks.common import RunContext
from flows.campaign import FLOW_END_HOOKS
from tasks.serve import serve_checkpoint, shutdown_server
from tasks.stages import checkpoint_from_uri, evaluate_checkpoint


class RegressionError(RuntimeError):
    """The evaluated model is worse than the champion beyond the tolerance."""


class SuiteEntry(EvalConfig):
    """One benchmark of the suite: an environment and a ``rao_core.evaluation.EvalConfig``.

    ``difficulties``, ``n_tasks`` and ``modes`` always come from the entry (defaults included: easy, 8,
    both modes); ``seed``, ``split`` and ``graded`` only when set, else from the config's ``eval`` section
    (so the nightly evaluates the tasks the champion was scored on).
    """

    env: str = "textcraft-synth"
    modes: list[Mode] = Field(default_factory=lambda: ["recursive", "single"])

    def eval_update(self) -> dict[str, Any]:
        """The ``eval`` fields this entry sets (see the class docstring)."""
        return (self.model_dump(include={"difficulties", "n_tasks", "modes"})
                | self.model_dump(exclude={"env"}, exclude_unset=True))


class EvaluateParams(BaseModel):
    """Parameters of ``rao-evaluate`` (a Prefect UI form)."""

    config: str = Field("configs/cpu-smoke.yaml", description="Campaign config (serving, runtime, storage).")
    model: str = Field("candidate", description="Alias or version of the campaign's registered model, a "
                       "models:/... URI, or an s3:// checkpoint folder (any campaign's).")
    suite: list[SuiteEntry] = Field(default_factory=lambda: [SuiteEntry()])
    tolerance: float | None = Field(None, ge=0, description="Allowed drop vs champion (default: eval.tolerance).")
    name: str = Field("nightly", description="S3 prefix / MLflow run name of the evaluation.")
    campaign: str | None = Field(None, description="Campaign whose registered model is evaluated (its "
                                 "model.registered_model); default: the config's campaign name.")

    def flow_run_name(self) -> str:
        """Prefect flow-run name of this evaluation: ``<name>-<model>``, e.g. ``nightly-candidate``."""
        return f"{self.name}-{self.model}".replace("models:/", "")


def evaluate_run_name() -> str:
    """Prefect flow-run name of an evaluation (:meth:`EvaluateParams.flow_run_name`)."""
    from prefect.runtime import flow_run

    p = flow_run.parameters.get("params") or {}
    return (p if isinstance(p, EvaluateParams) else EvaluateParams.model_validate(p)).flow_run_name()


@flow(name="rao-evaluate", log_prints=True, flow_run_name=evaluate_run_name, **FLOW_END_HOOKS)
def rao_evaluate(params: EvaluateParams = EvaluateParams()) -> dict[str, Any]:
    """Evaluate a registered checkpoint on the suite; fail on a regression vs ``champion``."""
    import mlflow

    from flows.campaign import CampaignParams, _mlflow_setup, storage

    log = get_run_logger()
    base = CampaignParams(config=params.config, name=params.name).resolve()
    uri, exp_id = _mlflow_setup(base)
    name = tracking.registered_model_name(base, params.campaign or CampaignParams(config=params.config).resolve().name)
    ref = params.model
    if not ref.startswith(("models:/", "s3://", "/", ".")):  # an alias or a version of the campaign's model
        ref = f"models:/{name}/{ref}" if ref.isdigit() else f"models:/{name}@{ref}"
    if ref.startswith("models:/"):  # compared with the champion of the evaluated model
        name = ref.removeprefix("models:/").split("@")[0].split("/")[0]
    champ = tracking.alias_version(name, "champion")
    champion_scores = {k: float(v) for k, v in (champ.tags if champ else {}).items() if k.startswith("eval/")}
    tol = params.tolerance if params.tolerance is not None else base.eval.tolerance
    run = mlflow.MlflowClient().create_run(exp_id, run_name=f"{params.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                                           tags={"rao.kind": "evaluation", "rao.model": ref,
                                                 **tracking.prefect_link_tags()})
    metrics: dict[str, float] = {}
    all_rows: list[dict[str, Any]] = []
    with storage(base) as s3:
        try:
            for entry in params.suite:
                cfg = base.model_copy(deep=True)
                cfg.tasks.env = entry.env
                cfg.eval = cfg.eval.model_copy(update=entry.eval_update())
                ctx = RunContext(config=cfg, s3=s3.__dict__, mlflow_uri=uri, mlflow_experiment_id=exp_id)
                ckpt = checkpoint_from_uri(ctx, ref)
                served = serve_checkpoint(ctx, ckpt)
                from tasks.serve import checkpoint_local

                res = evaluate_checkpoint(ctx, served, str(checkpoint_local(ctx, ckpt)))
                metrics.update({k.replace("eval/", f"eval/{entry.env}/", 1) if entry.env != base.tasks.env else k: v
                                for k, v in res.metrics.items()})
                all_rows += [{"env": entry.env, **r} for r in res.rows]
        finally:
            shutdown_server()
    rows, bad = tracking.log_evaluation(run.info.run_id, params.name, ref, metrics, all_rows, champion_scores, tol)
    if bad:
        raise RegressionError(f"{ref} regressed vs champion: " + "; ".join(bad))
    log.info(f"{ref}: no regression vs champion ({len(rows)} metrics compared)")
    return {"model": ref, "metrics": metrics, "comparison": rows, "rows": all_rows,
            "champion": champ.version if champ else None, "json": json.dumps(rows)}
