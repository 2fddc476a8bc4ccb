"""MLflow logging used by the pipeline tasks: metrics, plots, execution-tree traces, model registry.

- :func:`log_iteration` (a Prefect task) logs one RL iteration: its metrics (trees, judge, samples,
  training, evaluation, timings, serving), the depth histogram, the trees as traces and the campaign's
  learning curve; :func:`log_evaluation` (a Prefect task) logs a nightly evaluation and its paired
  comparison with the champion (``rao_core.regression``), with the per-task outcomes of both.

- One MLflow run per campaign (tag ``rao.campaign``), one nested run per iteration (``rao.iteration``).
  Each is tagged with the Prefect flow run that last worked on it (``rao.prefect_flow_run_id``, and its
  UI page ``rao.prefect_url``); the flows' state hook :func:`end_mlflow_runs` marks the runs a failed,
  crashed or cancelled flow run left RUNNING as FAILED or KILLED.
- Traces: one trace per execution tree, a span per agent node nested like the tree and a span per turn
  (cell, REPL output, token usage) under its node; only infrastructure failures are errors
  (:func:`infra.tracking.log_trees_as_traces`), linked to the iteration run.
- Registry: every checkpoint is a model version of :func:`registered_model_name` whose source is the
  checkpoint's S3 URI, tagged with campaign, iteration and evaluation scores (every benchmark's metrics, and one
  ``rao.benchmark.<name>`` line per benchmark); alias ``candidate`` is the latest version, ``champion`` is moved
  only by :func:`promote` (a real update whose primary metric is not worse than the current champion's beyond the
  eval tolerance).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import prefect.artifacts
from prefect import task
from prefect.cache_policies import NONE
from prefect.runtime import flow_run as current_flow_run

from rao_core.config import CampaignConfig
from rao_core.metrics import depth_histogram, sample_depth_metrics, tree_metrics
from rao_core.tree import ExecutionTree, read_trees
from infra import tracking as infra_tracking
from infra.stage_io import RunContext, artifact_key, fetch, in_prefect_run, stage
from infra.stage_records import EvalOutput, GenerateOutput, JudgeOutput, LogOutput, TrainOutput, ValidateOutput

FLOW_RUN_TAG = "rao.prefect_flow_run_id"


def _client():
    # local (as every mlflow import here): measured 2.7-3.6 s; `rao run` imports this module before it needs MLflow
    from mlflow import MlflowClient

    return MlflowClient()


def logged_steps(run_id: str, keys: Sequence[str]) -> dict[str, set[int]]:
    """The steps at which each of ``keys`` already has a point in run ``run_id`` (keys with none are absent).

    One ``get_run`` for the run's metric keys, then one ``get_metric_history`` per key the run already has,
    so a run's first log costs one request."""
    client = _client()
    present = set(client.get_run(run_id).data.metrics) & set(keys)
    return {k: {m.step for m in client.get_metric_history(run_id, k)} for k in sorted(present)}


def log_metrics(run_id: str, metrics: dict[str, float], step: int | None = None) -> int:
    """Log finite numeric metrics to ``run_id`` at ``step`` (default 0), each (metric, step) at most once.

    NaN/inf values are skipped, and so is every metric that already has a point at ``step`` in the run
    (:func:`logged_steps`): a resumed or re-run campaign logs again what it logged before, and MLflow keeps
    the first point only, so counts, averages and charts stay those of one run. Returns the points logged.
    """
    from mlflow.entities import Metric  # local: mlflow import, measured 2.7-3.6 s

    ts, step = int(time.time() * 1000), step or 0
    ms = [Metric(k, float(v), ts, step) for k, v in metrics.items()
          if isinstance(v, (int, float)) and math.isfinite(float(v))]
    if ms:
        seen = logged_steps(run_id, [m.key for m in ms])
        ms = [m for m in ms if step not in seen.get(m.key, ())]
    for i in range(0, len(ms), 500):
        _client().log_batch(run_id, metrics=ms[i:i + 500])
    return len(ms)


def log_json(run_id: str, obj: Any, artifact_file: str) -> None:
    _client().log_dict(run_id, obj, artifact_file)


def log_figure(run_id: str, fig, artifact_file: str) -> None:
    _client().log_figure(run_id, fig, artifact_file)


def log_trees_as_traces(run_id: str, experiment_id: str, trees: Sequence[ExecutionTree], limit: int = 64) -> int:
    """One MLflow trace per tree (first ``limit`` trees); returns the number logged. Spans per node and per
    turn, statuses and token usage: :func:`infra.tracking.log_trees_as_traces`."""
    return infra_tracking.log_trees_as_traces(run_id, experiment_id, trees, limit)


def depth_histogram_figure(hist: dict[int, int], title: str):
    """Bar chart of nodes per depth."""
    import matplotlib  # local: matplotlib with pyplot, measured 0.6-1.5 s

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar([str(d) for d in hist], list(hist.values()), color="#4477aa")
    ax.set_xlabel("depth")
    ax.set_ylabel("nodes")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def learning_curve_figure(run_id: str, keys: Sequence[str], title: str):
    """Line plot of metric histories (x = iteration step) of ``run_id``."""
    import matplotlib  # local: matplotlib with pyplot, measured 0.6-1.5 s

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    client = _client()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for k in keys:
        hist = sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)
        if hist:
            ax.plot([m.step for m in hist], [m.value for m in hist], marker="o", label=k)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole: no 0.5 ticks
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def step_key(name: str) -> str:
    """The MLflow key of a trainer metric per optimizer step (``train/loss`` -> ``train_step/loss``): its own
    series in the iteration run (step = optimizer step), apart from the iteration's value (``train/loss`` at
    step = iteration), so no (metric, step) holds two points."""
    return "train_step/" + name.removeprefix("train/")


def logged_tree_ids(run_id: str, experiment_id: str) -> set[str]:
    """The ``rao.tree_id`` tags of the traces already linked to run ``run_id`` (spans not read)."""
    client, ids, token = _client(), set(), None
    while True:
        page = client.search_traces(locations=[experiment_id], run_id=run_id, max_results=500, page_token=token,
                                    include_spans=False)
        ids |= {t.info.tags.get("rao.tree_id") for t in page}
        token = page.token
        if not token:
            return ids - {None}


@stage("log", name="log-iteration")
def log_iteration(ctx: RunContext, iteration: int, run_id: str, gen: GenerateOutput, judged: JudgeOutput,
                  val: ValidateOutput, tr: TrainOutput, ev: EvalOutput, times: dict[str, float]) -> LogOutput:
    """Log iteration ``iteration``'s metrics to its run ``run_id`` and the campaign run, with its plots and
    traces (module docstring); returns the metrics and the stage times logged.

    A resumable stage (``infra.stage_io.stage``, marker ``iter-K/_done/log.json``): a re-run returns what was
    logged without asking MLflow anything. Interrupted half-way, the re-run logs only what is missing: each
    (metric, step) at most once (:func:`log_metrics`) and no tree's trace twice (:func:`logged_tree_ids`).
    """
    trees = read_trees(fetch(ctx, judged.scored_uri, f"iter-{iteration}/scored.jsonl"))
    m = tree_metrics(trees)
    m.update({f"judge/{k}": v for k, v in judged.judge.items() if isinstance(v, (int, float))})
    m.update({f"samples/{k}": v for k, v in val.sample_stats.items() if isinstance(v, (int, float))})
    m.update(sample_depth_metrics(val.sample_stats))  # samples/depth_<d>/...: which level carried the signal
    m.update(tr.last_step)
    m.update(ev.metrics)
    m.update({f"time/{k}_s": v for k, v in times.items()})
    if "generate" in times and gen.generation_s is not None:
        m["time/generation_model_s"] = gen.generation_s
    m.update({f"serving/{k}": v for k, v in gen.serving.items()})  # vLLM /metrics over generation
    if tr.peak_rss_mb is not None:  # the training child's peak (trainer.process 'subprocess')
        m["time/train_peak_rss_mb"] = tr.peak_rss_mb
    log_metrics(run_id, m, step=iteration)
    log_metrics(ctx.campaign_run_id, m, step=iteration)
    for i, step_m in enumerate(tr.metrics):  # own keys: step = optimizer step, not iteration
        log_metrics(run_id, {step_key(k): v for k, v in step_m.items()}, step=i)
    hist = depth_histogram(trees)
    log_figure(run_id, depth_histogram_figure(hist, f"iteration {iteration}: nodes per depth"),
               "plots/depth_histogram.png")
    if ctx.config.tracking.log_traces:
        limit = ctx.config.tracking.max_traces_per_iteration
        done = logged_tree_ids(run_id, ctx.mlflow_experiment_id)
        todo = [t for t in trees[:limit] if t.tree_id not in done]
        if todo:
            log_trees_as_traces(run_id, ctx.mlflow_experiment_id, todo, limit)
    keys = ([k for k in m if k.startswith("eval/") and k.endswith(("/success", "/child_success"))]
            + sorted(k for k in m if k.startswith("success/depth_")))
    log_figure(ctx.campaign_run_id, learning_curve_figure(ctx.campaign_run_id, keys, f"{ctx.name}: learning curve"),
               "plots/learning_curve.png")
    return LogOutput(metrics=m, times=times)


EVAL_TAG = "rao.eval."  # + evaluation key: a model version's stored per-task outcomes, "<run id>:<role>"


def _markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of ``rows`` (the keys of the first row as columns; ``|`` escaped)."""
    if not rows:
        return ""
    cols = list(rows[0])

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|")

    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows])


@task(name="log-evaluation", cache_policy=NONE)
def log_evaluation(run_id: str, name: str, ref: str, metrics: dict[str, float], results: list[dict[str, Any]],
                   decisions: list[Any], outcomes: dict[str, Any], note: str = ""
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """Log a nightly evaluation of ``ref``: its metrics, ``evaluation.json`` (metrics, comparison rows, the
    per-task ``outcomes`` of candidate and champion), and inside a Prefect run the artifacts
    ``artifact_key(name, "comparison")`` (table), ``"results"`` (table) and ``"decision"`` (markdown: ``note``,
    the rule and power, then the comparison); end its run ``run_id`` FAILED when a metric regressed or none
    could be compared. ``decisions``: ``rao_core.regression.RegressionDecision`` per metric. Returns the
    comparison rows and one message per regression."""
    log_metrics(run_id, metrics)
    rows = [d.table_row() for d in decisions]
    bad = [d.message() for d in decisions if d.regression]
    log_json(run_id, {"metrics": metrics, "comparison": rows, "outcomes": outcomes}, "evaluation.json")
    if in_prefect_run():  # outside a run (direct .fn() calls) there is no artifact to write
        try:
            verdict = ("REGRESSION: " + "; ".join(bad)) if bad else "no regression"
            prefect.artifacts.create_markdown_artifact(key=artifact_key(name, "decision"),
                                     markdown=f"## {ref} vs champion: {verdict}\n\n{note}\n\n{_markdown_table(rows)}\n",
                                     description=f"{ref} vs champion: {verdict}")
            prefect.artifacts.create_table_artifact(key=artifact_key(name, "comparison"), table=rows or [{"metric": "none"}],
                                  description=f"{ref} vs champion: paired test per metric")
            prefect.artifacts.create_table_artifact(key=artifact_key(name, "results"), table=results or [{"result": "none"}],
                                  description=f"{ref}: success by env, mode and difficulty")
        except Exception as e:  # noqa: BLE001 - the UI's tables never fail the evaluation
            logging.getLogger("rao").warning(f"evaluation artifacts {name}: {type(e).__name__}: {e}")
    compared = any(d.result is not None for d in decisions)  # none: it could not catch a regression
    _client().set_terminated(run_id, status="FAILED" if bad or not compared else "FINISHED")
    return rows, bad


def registered_model_exists(name: str) -> bool:
    """Whether the MLflow registry has a registered model ``name``."""
    from mlflow.exceptions import MlflowException  # local: mlflow import, measured 2.7-3.6 s

    try:
        _client().get_registered_model(name)
        return True
    except MlflowException:
        return False


def model_version(ref: str) -> Any | None:
    """The ModelVersion of ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``, or None when absent."""
    from mlflow.exceptions import MlflowException  # local: mlflow import, measured 2.7-3.6 s

    body = ref.removeprefix("models:/")
    try:
        if "@" in body:
            return _client().get_model_version_by_alias(*body.split("@", 1))
        return _client().get_model_version(*body.split("/", 1))
    except MlflowException:
        return None


def stored_outcomes(version: Any, key: str) -> tuple[dict[str, dict[str, float | None]], str] | None:
    """The per-task outcomes (metric -> task id -> outcome) a nightly stored for model version ``version`` under
    evaluation key ``key`` (its tag ``rao.eval.<key>``: the run's ``evaluation.json``), and where they come from
    (``"stored evaluation, run <id>"``); None when it has none or they cannot be read."""
    tag = (version.tags or {}).get(EVAL_TAG + key)
    if not tag or ":" not in tag:
        return None
    run_id, role = tag.rsplit(":", 1)
    try:
        import mlflow  # local: mlflow import, measured 2.7-3.6 s

        stored = mlflow.artifacts.load_dict(f"runs:/{run_id}/evaluation.json")["outcomes"][role]
    except Exception:  # noqa: BLE001 - a deleted run or artifact: evaluate the champion again
        return None
    return (stored, f"stored evaluation, run {run_id}") if stored else None


def tag_stored_outcomes(name: str, version: str, key: str, run_id: str, role: str) -> None:
    """Point model version ``version`` of ``name`` at its per-task outcomes in run ``run_id`` (``role``:
    ``candidate`` or ``champion`` in that run's ``evaluation.json``), for :func:`stored_outcomes`."""
    _client().set_model_version_tag(name, version, EVAL_TAG + key, f"{run_id}:{role}")


def registered_model_name(config: CampaignConfig, campaign: str | None = None) -> str:
    """``model.registered_model`` with ``{campaign}`` replaced by ``campaign`` (default: the config's
    name), so each campaign has its own model and ``champion`` unless the config names a fixed model."""
    return config.model.registered_model.replace("{campaign}", campaign or config.name)


def prefect_link_tags() -> dict[str, str]:
    """Tags that link an MLflow run to the current Prefect flow run (empty outside a flow run)."""
    if not current_flow_run.id:
        return {}
    tags = {FLOW_RUN_TAG: str(current_flow_run.id), "rao.prefect_flow_run": str(current_flow_run.name)}
    return tags | ({"rao.prefect_url": current_flow_run.ui_url} if current_flow_run.ui_url else {})


def claim_run(run_id: str) -> None:
    """Mark an existing run (a resumed campaign or iteration) RUNNING again and link it to this flow run."""
    client = _client()
    client.update_run(run_id, status="RUNNING")
    for k, v in prefect_link_tags().items():
        client.set_tag(run_id, k, v)


def end_flow_run_runs(flow_run_id: str, status: str) -> list[str]:
    """Terminate with ``status`` (FAILED, KILLED) every MLflow run still RUNNING that is linked to Prefect
    flow run ``flow_run_id``, and their RUNNING child runs (iterations); returns their ids."""
    import mlflow  # local: mlflow import, measured 2.7-3.6 s

    def running(where: str) -> list[str]:
        return [r.info.run_id for r in mlflow.search_runs(search_all_experiments=True, output_format="list",
                                                          filter_string=f"{where} and attributes.status = 'RUNNING'")]

    ended = running(f"tags.`{FLOW_RUN_TAG}` = '{flow_run_id}'")
    ended += [c for r in list(ended) for c in running(f"tags.`mlflow.parentRunId` = '{r}'")]
    for run_id in ended:
        _client().set_terminated(run_id, status=status)
    return ended


def end_mlflow_runs(flow, flow_run, state) -> None:
    """Prefect state hook (failed, crashed, cancelled): the flow run's MLflow runs left RUNNING become
    KILLED when it was cancelled, else FAILED. In a process that did not log them (a worker running
    the cancellation hook), MLflow is pointed at the default URI first (``MLFLOW_TRACKING_URI``)."""
    import mlflow  # local: mlflow import, measured 2.7-3.6 s

    status = "KILLED" if state.is_cancelling() or state.is_cancelled() else "FAILED"
    try:
        if not mlflow.tracking.is_tracking_uri_set():
            infra_tracking.configure_mlflow()
        ended = end_flow_run_runs(str(flow_run.id), status)
        logging.getLogger("rao").info(f"MLflow runs marked {status}: {', '.join(ended) or 'none'}")
    except Exception as e:  # a hook must not hide the flow's own error
        logging.getLogger("rao").warning(f"could not mark MLflow runs {status}: {e}")


END_HOOKS = {"on_failure": [end_mlflow_runs], "on_crashed": [end_mlflow_runs],
             "on_cancellation": [end_mlflow_runs]}  # ``@flow(**END_HOOKS)``: no MLflow run stays RUNNING


def find_campaign_run(experiment_id: str, campaign: str) -> str | None:
    """Id of the existing MLflow run of ``campaign`` (for resume), or None."""
    runs = _client().search_runs([experiment_id], filter_string=f"tags.`rao.campaign` = '{campaign}' and "
                                 "tags.`rao.kind` = 'campaign'", max_results=1)
    return runs[0].info.run_id if runs else None


def find_iteration_run(experiment_id: str, campaign: str, iteration: int) -> str | None:
    runs = _client().search_runs([experiment_id], filter_string=f"tags.`rao.campaign` = '{campaign}' and "
                                 f"tags.`rao.iteration` = '{iteration}'", max_results=1)
    return runs[0].info.run_id if runs else None


def campaign_version(name: str, campaign: str, before: int) -> str | None:
    """The version of ``name`` that ``campaign`` registered last before iteration ``before``, or None."""
    found = [(int(v.tags.get("rao.iteration", -1)), int(v.version)) for v in
             _client().search_model_versions(f"name = '{name}'") if v.tags.get("rao.campaign") == campaign]
    earlier = [f for f in found if f[0] < before]
    return str(max(earlier)[1]) if earlier else None


def register_version(name: str, source: str, run_id: str, tags: dict[str, Any], description: str = "") -> str:
    """Create a model version (registered model created if absent) linked to ``run_id`` (the run holding
    that version's own metrics); sets alias ``candidate``."""
    from mlflow.exceptions import MlflowException  # local: mlflow import, measured 2.7-3.6 s

    client = _client()
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="RAO policy checkpoints (source: S3 checkpoint folder)")
    mv = client.create_model_version(name, source=source, run_id=run_id, tags={k: str(v) for k, v in tags.items()},
                                     description=description or None)
    client.set_registered_model_alias(name, "candidate", mv.version)
    return str(mv.version)


def alias_version(name: str, alias: str) -> Any | None:
    """The ModelVersion behind ``name@alias``, or None."""
    from mlflow.exceptions import MlflowException  # local: mlflow import, measured 2.7-3.6 s

    try:
        return _client().get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def promote(name: str, version: str, score: float | None, metric: str, tolerance: float = 0.0, *,
            updated: bool = True, legacy_metric: str | None = None) -> bool:
    """Move ``champion`` to ``version`` when it is a real update and not worse beyond ``tolerance``.

    Rules: a version whose weights equal its parent's (``updated`` False: the iteration made no optimizer
    step) never moves the alias; with no champion yet, any scored version becomes champion; otherwise
    the version must have a score and ``score >= champion score - tolerance`` (the champion's score is
    read from its tag ``<metric>``, or ``<legacy_metric>`` when it has none: the same metric's key of a version
    registered before metric keys named their benchmark). Returns True if moved.
    """
    if not updated:
        return False
    champ = alias_version(name, "champion")
    if champ is not None and score is not None:
        tags = champ.tags or {}
        try:
            best = float(tags.get(metric, tags.get(legacy_metric, "nan") if legacy_metric else "nan"))
        except ValueError:
            best = float("nan")
        if math.isfinite(best) and score < best - tolerance:
            return False
    if champ is not None and score is None:
        return False
    _client().set_registered_model_alias(name, "champion", version)
    return True


def write_tmp_json(obj: Any) -> Path:
    fd, p = tempfile.mkstemp(suffix=".json")
    Path(p).write_text(json.dumps(obj, indent=1, default=str))
    os.close(fd)
    return Path(p)
