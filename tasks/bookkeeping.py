"""The campaign's bookkeeping, below the flow: its MLflow runs (the campaign run, an
iteration's nested run, the config as parameters), the completion marker and the stored summary, the summary as
markdown (the flow run's artifact) and the MLflow link. ``flows.campaign`` only orders the stages; what a stage
records goes through here or ``tasks.tracking``.
"""

from __future__ import annotations

import json
from typing import Any

import prefect.artifacts
from prefect import get_run_logger

from rao_core.config import CampaignConfig
from tasks import tracking
from tasks.stages import benchmark_tags, primary_metric, primary_score
from infra import stage_io
from infra.stage_io import RunContext, artifact_key, stage
from infra.stage_records import Checkpoint, RegisterOutput
from infra.tracking import MODEL_TRAINING_VIEW, configure_mlflow, ensure_experiment, mlflow_ui_command

__all__ = ["CAMPAIGN_DONE_KEY", "already_complete_line", "benchmark_points", "campaign_run", "completed_summary",
           "flatten", "iteration_run", "log_config_params", "mlflow_link", "mlflow_setup", "primary_rows", "register_held",
           "summary_artifact", "summary_markdown"]


def campaign_run(cfg: CampaignConfig, experiment_id: str) -> str:
    """The campaign's MLflow run (found again by its tags on resume, else made with the config as parameters
    and ``config.json``), marked RUNNING and linked to this flow run; its id."""
    import mlflow  # local: mlflow import, measured 2.7-3.6 s; `rao run` imports this module before it needs MLflow

    run_id = tracking.find_campaign_run(experiment_id, cfg.name)
    if run_id is None:
        run_id = mlflow.MlflowClient().create_run(experiment_id, run_name=cfg.name,
                                                  tags={"rao.campaign": cfg.name, "rao.kind": "campaign"}).info.run_id
        log_config_params(run_id, cfg)
        tracking.log_json(run_id, cfg.model_dump(mode="json"), "config.json")
    tracking.claim_run(run_id)
    return run_id


def log_config_params(run_id: str, cfg: CampaignConfig) -> None:
    """The config, flattened (``trainer.lr``, ``algo.G``, ...), as the parameters of run ``run_id``."""
    import mlflow  # local: mlflow import, measured 2.7-3.6 s; `rao run` imports this module before it needs MLflow

    flat = flatten(cfg.model_dump(mode="json"))
    for i in range(0, len(flat), 90):
        mlflow.MlflowClient().log_batch(run_id, params=[mlflow.entities.Param(k, str(v)[:500])
                                                        for k, v in list(flat.items())[i:i + 90]])


def iteration_run(ctx: RunContext, iteration: int) -> str:
    """The MLflow run of one iteration (nested in the campaign run; found again on resume): its metrics are
    those of the checkpoint the iteration registers, so the registry's Compare view shows each version's own,
    and its parameters the campaign's config (without them that view's Parameters section is empty)."""
    import mlflow  # local: mlflow import, measured 2.7-3.6 s; `rao run` imports this module before it needs MLflow

    it_run = tracking.find_iteration_run(ctx.mlflow_experiment_id, ctx.name, iteration)
    if it_run is None:
        it_run = mlflow.MlflowClient().create_run(
            ctx.mlflow_experiment_id, run_name=f"{ctx.name}-iter-{iteration}",
            tags={"rao.campaign": ctx.name, "rao.iteration": str(iteration), "rao.kind": "iteration",
                  "mlflow.parentRunId": ctx.campaign_run_id}).info.run_id
        log_config_params(it_run, ctx.config)
    tracking.claim_run(it_run)
    return it_run


# tasks.stages.IO_RETRIES, written out: importing tasks.stages here would slow `rao run`'s completion check
@stage("register", name="register-checkpoint", retries=2, retry_delay_seconds=[5, 20])
def register_held(ctx: RunContext, iteration: int, ckpt: Checkpoint, eval_metrics: dict[str, float], run_id: str,
                  line: str = "", eval_rows: list[dict] | None = None) -> RegisterOutput:
    """Register iteration ``iteration``'s checkpoint (an optimizer step was made) as a model version, as
    ``tasks.stages.register_checkpoint`` does, but never move ``champion`` to it: the collapse guard
    (``rao_core.guard``) judged the iteration a collapse. The version carries the tags of a registered
    checkpoint (campaign, iteration, evaluation scores, each benchmark's ``rao.benchmark.<name>`` from
    ``eval_rows``) plus ``rao.guard = collapse`` and, in its description, the guard's ``line``. The same resumable
    stage (marker ``iter-K/_done/register.json``): whichever of the two registered an iteration, a re-run returns
    its record. Alias ``candidate`` moves to it (the latest)."""
    name, metric = tracking.registered_model_name(ctx.config), primary_metric(ctx)
    tags = {"rao.campaign": ctx.name, "rao.iteration": iteration, "rao.updated": "true", "rao.guard": "collapse",
            **{k: round(v, 4) for k, v in eval_metrics.items()}, **benchmark_tags(eval_rows or [])}
    desc = f"Checkpoint {ckpt.uri}\n\ncampaign {ctx.name}, iteration {iteration}; not promoted: {line or 'collapse'}"
    version = tracking.register_version(name, ckpt.uri, run_id, tags, desc)
    return RegisterOutput(model=name, version=version, champion=False, metric=metric,
                          score=primary_score(ctx, eval_metrics, metric), updated=True)


CAMPAIGN_DONE_KEY = "_done/campaign.json"  # the summary of the run that completed the campaign


def completed_summary(store: Any, cfg: CampaignConfig) -> dict[str, Any] | None:
    """The stored summary of campaign ``cfg.name`` when it is complete for ``cfg`` (its marker
    ``CAMPAIGN/_done/campaign.json`` exists and records ``cfg.iterations`` iterations), else None.

    ``store`` is the campaign's ``infra.storage.ArtifactStore``. A campaign asked for more iterations than it
    ran is not complete: it resumes with the next one."""
    if not store.exists(CAMPAIGN_DONE_KEY):
        return None
    summary = json.loads(store.get_bytes(CAMPAIGN_DONE_KEY))
    return summary if summary.get("iterations_planned") == cfg.iterations else None


def already_complete_line(summary: dict[str, Any], cli: bool = False) -> str:
    """The log line of a re-run of a complete campaign: nothing was run, where the summary comes from, and how
    to train further, in the words of where it was started: ``rao run``'s options (``cli``) or the run form's
    fields (a flow run, whose summary is its ``<campaign>-summary`` artifact)."""
    where, how = (("below", "another --name, or more --iterations") if cli else
                  (f"in this flow run's artifact {artifact_key(summary['campaign'], 'summary')}",
                   "another name, or more iterations, in the run form"))
    return (f"campaign {summary['campaign']} is already complete ({summary['iterations_planned']} iterations, "
            f"completed {summary.get('completed_at', '?')}): nothing to run, no server started, nothing logged; "
            f"the summary {where} is that run's (use {how} to train further)")


def mlflow_link(summary: dict[str, Any]) -> str:
    """Where the campaign's MLflow run is: its page in the MLflow UI (the model-training view,
    ``infra.tracking.MODEL_TRAINING_VIEW``) on the tracking server, or, for a local store, at the UI that
    ``mlflow ui --backend-store-uri <uri>`` serves on port 5000 (the command is given)."""
    uri, exp, run = summary.get("mlflow_uri", ""), summary.get("mlflow_experiment_id"), summary.get("mlflow_run_id")
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    page = f"{base}/#/experiments/{exp}/runs/{run}?{MODEL_TRAINING_VIEW}" if exp else f"{base} (run {run})"
    return page if base == uri.rstrip("/") else f"{page} (start the UI: `{mlflow_ui_command(uri)}`)"


def benchmark_points(summary: dict[str, Any]) -> tuple[list[int], list[tuple[str, str, dict[int, dict[str, Any]]]]]:
    """A campaign summary's evaluation by benchmark: the evaluated iterations (0: the base evaluation), and per
    evaluation row, in first-seen order, ``(benchmark, "<mode>/<difficulty>", {iteration: its row})``; a row that
    names no benchmark (a summary written before rows named theirs) is the training benchmark's
    (``summary["eval_suite"]["training"]``, "" when the summary does not say)."""
    train = (summary.get("eval_suite") or {}).get("training", "")
    points = [(0, summary.get("base_eval") or [])] if summary.get("base_eval") else []
    points += [(it["iteration"], it.get("eval_rows") or []) for it in summary.get("iterations", [])
               if it.get("eval_rows")]
    rows: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for k, evaluated in points:
        for r in evaluated:
            rows.setdefault((r.get("benchmark") or train, f"{r['mode']}/{r['difficulty']}"), {})[k] = r
    return [k for k, _ in points], [(b, row, by_it) for (b, row), by_it in rows.items()]


def primary_rows(summary: dict[str, Any], rows: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The rows of ``rows`` that belong to the summary's deciding benchmark (``summary["eval_suite"]["primary"]``;
    every row of a summary that does not name one, and every row that names no benchmark)."""
    primary = (summary.get("eval_suite") or {}).get("primary")
    return [r for r in rows or [] if not primary or r.get("benchmark", primary) == primary]


def summary_markdown(summary: dict[str, Any], note: str = "") -> str:
    """The campaign's summary as markdown (the flow run's ``<campaign>-summary`` artifact, the UI's copy of
    ``rao run``'s end-of-run tables): validation success by iteration on the deciding benchmark with Wilson
    intervals, model version and champion (``no: collapse guard`` for a checkpoint the guard held back, whose line
    is printed above the table); then, when the suite has more than one benchmark, held-out success with a row
    per benchmark (and mode/difficulty) and a column per evaluated iteration (:func:`benchmark_points`); the
    flow's wall time, where the artifacts are and the MLflow link. ``note``: a first line."""
    def ev(rows: list[dict[str, Any]] | None) -> str:
        return "<br>".join(f"{r['mode']}/{r['difficulty']}: {r['success']:.2f} {r['ci95']} (n {r['n']})"
                           for r in primary_rows(summary, rows))

    lines = [f"## Campaign {summary['campaign']}", ""] + ([note, ""] if note else [])
    guard = summary.get("guard") or {}
    lines += [f"**{g}**" for g in guard.get("collapses", [])] + ([""] if guard.get("collapses") else [])
    primary = (summary.get("eval_suite") or {}).get("primary")
    lines += [f"| iteration | train success | evaluation{f' ({primary})' if primary else ''}: success [95% CI] | "
              "version | champion |", "|---|---|---|---|---|"]
    if summary.get("base_eval"):
        reg = (summary.get("warm_start") or {}).get("register") or {}
        lines.append(f"| 0 | | {ev(summary['base_eval'])} | {reg.get('version', '')} | "
                     f"{'yes' if reg.get('champion') else ''} |")
    for it in summary.get("iterations", []):
        reg, m = it.get("register") or {}, it.get("metrics") or {}
        held = (it.get("guard") or {}).get("status") == "collapse"
        lines.append(f"| {it['iteration']} | {m.get('success/root', float('nan')):.2f} | {ev(it.get('eval_rows'))} | "
                     f"{reg.get('version', '')}{'' if reg.get('updated', True) else ' (no update)'} | "
                     f"{'yes' if reg.get('champion') else 'no: collapse guard' if held else ''} |")
    its, rows = benchmark_points(summary)
    if len({b for b, _, _ in rows}) > 1:
        lines += ["", "| benchmark | mode/difficulty | " + " | ".join(f"iteration {k}" for k in its) + " |",
                  "|---|---|" + "---|" * len(its)]
        for b, row, by_it in rows:
            cells = [f"{r['success']:.2f} {r['ci95']} (n {r['n']})" if (r := by_it.get(k)) else "" for k in its]
            lines.append(f"| {b} | {row} | " + " | ".join(cells) + " |")
    lines += ["", f"- wall time: {summary.get('wall_s', '?')} s" + (f", completed {summary['completed_at']}"
                                                                  if summary.get("completed_at") else ""),
              f"- artifacts: {summary.get('s3_prefix', '?')}", f"- MLflow: {mlflow_link(summary)}"]
    return "\n".join(lines) + "\n"


def summary_artifact(summary: dict[str, Any], note: str = "") -> None:
    """The ``<campaign>-summary`` markdown artifact of this flow run (inside a Prefect run only; never fails it)."""
    if not stage_io.in_prefect_run():
        return
    try:
        prefect.artifacts.create_markdown_artifact(key=artifact_key(summary["campaign"], "summary"),
                                 markdown=summary_markdown(summary, note),
                                 description=f"campaign {summary['campaign']}: results, artifacts, MLflow link")
    except Exception as e:  # noqa: BLE001 - the UI's copy never fails the campaign
        get_run_logger().warning(f"summary artifact: {type(e).__name__}: {e}")


def mlflow_setup(cfg: CampaignConfig) -> tuple[str, str]:
    uri = configure_mlflow(cfg.tracking.tracking_uri)
    return uri, ensure_experiment(cfg.tracking.experiment)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
