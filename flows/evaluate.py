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
from pydantic import BaseModel, Field, field_validator

from rao_core.config import CampaignConfig
from rao_core.evaluation import EvalConfig, Mode
from tasks import tracking
from tasks.common import RunContext
from flows.campaign import FLOW_END_HOOKS
from tasks.serve import serve_checkpoint, shutdown_server
from tasks.stages import checkpoint_from_uri, evaluate_checkpoint


class RegressionError(RuntimeError):
    """The evaluated model is worse than the champion beyond the tolerance."""


DEFAULT_CONFIG = "configs/cpu-smoke.yaml"  # the nightly deployment's config (prefect.yaml)


def _default_config_eval() -> dict[str, Any]:
    """``env``, ``difficulties``, ``n_tasks`` and ``modes`` of :data:`DEFAULT_CONFIG`'s own evaluation (what its
    champion is scored on): the defaults of a suite entry, so that an entry added in the Prefect form starts
    from them. The plain ``EvalConfig`` defaults when the file cannot be read (import never fails on it)."""
    try:
        from rao_core.config import load_config
        from rao_core.paths import REPO_ROOT

        cfg = load_config(REPO_ROOT / DEFAULT_CONFIG)
        return {"env": cfg.tasks.env, "difficulties": list(cfg.eval.difficulties), "n_tasks": cfg.eval.n_tasks,
                "modes": list(cfg.eval.modes)}
    except Exception:  # noqa: BLE001 - the form loses its defaults, the flow still runs
        d = EvalConfig()
        return {"env": "textcraft-synth", "difficulties": d.difficulties, "n_tasks": d.n_tasks, "modes": d.modes}


_FORM = _default_config_eval()


class SuiteEntry(EvalConfig):
    """One benchmark of the suite: an environment and a ``rao_core.evaluation.EvalConfig``.

    ``difficulties``, ``n_tasks`` and ``modes`` always come from the entry; their defaults (plain values, so
    the Prefect form shows them in a new entry) are those of :data:`DEFAULT_CONFIG`'s ``eval`` section and
    environment. ``seed``, ``split`` and ``graded`` only when set, else from the config's ``eval`` section
    (so the nightly evaluates the tasks the champion was scored on).
    """

    env: str = Field(_FORM["env"], description="Environment, e.g. textcraft-synth.")
    difficulties: list[str] = Field(_FORM["difficulties"], description="Task difficulties evaluated, each "
                                    "reported separately.")
    n_tasks: int = Field(_FORM["n_tasks"], ge=1, description="Validation tasks per difficulty.")
    modes: list[Mode] = Field(_FORM["modes"], description="'recursive' and/or 'single' (delegation off).")

    def eval_update(self) -> dict[str, Any]:
        """The ``eval`` fields this entry sets (see the class docstring)."""
        return (self.model_dump(include={"difficulties", "n_tasks", "modes"})
                | self.model_dump(exclude={"env"}, exclude_unset=True))


def champion_suite(base: CampaignConfig, n_tasks: int | None = None) -> SuiteEntry:
    """The one rule for what a nightly evaluates by default (the deployment with an empty suite, and
    ``rao evaluate`` without ``--env``): config ``base``'s own evaluation, i.e. ``tasks.env`` with the ``eval``
    section's difficulties, task count (``n_tasks`` when given), modes, seed, split and grading: exactly what
    the campaign scored, and tagged, its champion on, so every metric has a champion value to compare with."""
    ev = base.eval
    return SuiteEntry(env=base.tasks.env, difficulties=list(ev.difficulties), n_tasks=n_tasks or ev.n_tasks,
                      modes=list(ev.modes), seed=ev.seed, split=ev.split, graded=ev.graded)


class NothingCompared(RuntimeError):
    """A nightly evaluation that had no champion value for any metric it measured: it cannot catch a
    regression, so its flow run fails instead of reporting "no regression"."""


class EvaluateParams(BaseModel):
    """Parameters of ``rao-evaluate`` (a Prefect UI form)."""

    config: str = Field(DEFAULT_CONFIG, description="Campaign config (serving, runtime, storage, eval).")
    model: str = Field("candidate", description="Alias or version of the campaign's registered model, a "
                       "models:/... URI, or an s3:// checkpoint folder (any campaign's).")
    suite: list[SuiteEntry] = Field(default_factory=list, description="Benchmarks to evaluate. Empty (the "
                                    "default): the config's own evaluation, what its champion was scored on "
                                    "(champion_suite). A new entry starts from the default config's evaluation.")
    tolerance: float | None = Field(None, ge=0, description="Allowed drop vs champion (default: eval.tolerance).")
    name: str = Field("nightly", description="S3 prefix / MLflow run name of the evaluation.")
    # a plain text field (a `str | None` one needs its "None" toggle clicked in the form); empty = None
    campaign: str = Field("", description="Campaign whose registered model is evaluated (its "
                          "model.registered_model); empty: the config's campaign name.")

    @field_validator("campaign", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return "" if v is None else v

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
            for entry in params.suite or [champion_suite(base)]:
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
    compared = [r["metric"] for r in rows if r["status"] != "new"]
    if not compared:
        measured = ", ".join(r["metric"] for r in rows) or "none"
        scored = ", ".join(sorted(champion_scores)) or "none"
        raise NothingCompared(
            f"{ref}: no metric compared with the champion, so no regression could be caught: "
            + (f"{name} has no champion" if champ is None else f"champion v{champ.version} of {name} has scores "
               f"for {scored}") + f"; this evaluation measured {measured} (evaluate what the champion was scored "
            f"on: leave the suite empty for the config's own evaluation)")
    log.info(f"{ref}: no regression vs champion ({len(compared)} of {len(rows)} metrics compared)")
    return {"model": ref, "metrics": metrics, "comparison": rows, "rows": all_rows, "compared": compared,
            "champion": champ.version if champ else None, "json": json.dumps(rows)}
