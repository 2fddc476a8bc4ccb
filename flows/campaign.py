"""The ``rao-campaign`` flow: RL iterations of serve -> generate -> judge -> validate -> train -> evaluate ->
register, each iteration a subflow whose tasks pass S3 URIs (not objects) to each other.

Resume: a re-run with the same name skips every stage whose completion marker exists on S3
(``infra.stage_io.stage``); a complete campaign returns its stored summary (:func:`completed_summary`). Collapse
guard (``rao_core.guard``): before an iteration's checkpoint is registered, its held-out evaluation is tested
against its reference (:func:`guard_reference`); ``guard.action`` then rolls back, stops or warns. Asynchronous RL
(``algo.max_staleness >= 1``): the K + 1 steps of ``rao_core.async_rl.overlap_schedule``, each a
:func:`rao_overlap_step` whose train and serving sides run at once. Embedded defaults (:func:`storage`): without
an S3 endpoint, the SeaweedFS of ``rao services up`` or one started for the flow's duration (data under
``$RAO_HOME/services/seaweedfs``); MLflow on SQLite. Docs: docs/pipeline.md,
docs/pipeline/resume-and-faults.md#resume, docs/pipeline/evaluation.md#collapse-guard, docs/algorithm/async-rl.md.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from pydantic import Field, field_validator

from flows.forms import FormParams, OptionalFloat, OptionalInt, empty_means, no_default
from infra.storage import ArtifactStore
from rao_core.async_rl import OverlapStep, overlap_schedule
from rao_core.config import NAME_PATTERN, CampaignConfig, load_config
from rao_core.envs.textcraft.env import TextCraftEnv
from rao_core.guard import GuardVerdict, judge_iteration
from rao_core.progress import Timeline
from tasks import tracking
from tasks.bookkeeping import (CAMPAIGN_DONE_KEY, already_complete_line, campaign_run, completed_summary,
                               iteration_run, mlflow_link, mlflow_setup, register_held, summary_artifact)
from infra.stage_io import RunContext, done_key, stored_record
from infra.stage_records import (Checkpoint, EvalOutput, GenerateOutput, JudgeOutput, ServedEndpoint, TrainOutput,
                                 ValidateOutput)
from tasks.serve import STOP_SERVER_HOOKS, serve_checkpoint, shutdown_server
from tasks.stages import (check_task_pool, evaluate, generate_trees, judge_trees, register_checkpoint,
                          skip_evaluation, train_policy, validate_dataset)
from tasks.warm_start import warm_start


def release_disk_reserve(flow, flow_run, state) -> None:
    """Prefect state hook, before the MLflow runs are closed: on a full disk, free the reserve under
    ``$RAO_HOME`` (``infra.disk``) so that MLflow's SQLite file can still mark them FAILED."""
    from infra.disk import release_reserve

    release_reserve()


# Hooks of the flows that start a vLLM server: on a full disk the reserve is freed first, no MLflow run stays
# RUNNING, and a run cancelled or crashed (its process killed by the worker) leaves no server behind.
ITERATION_END_HOOKS = {k: [release_disk_reserve] + v for k, v in tracking.END_HOOKS.items()}
FLOW_END_HOOKS = {k: ITERATION_END_HOOKS.get(k, []) + STOP_SERVER_HOOKS.get(k, [])
                  for k in (*ITERATION_END_HOOKS, *STOP_SERVER_HOOKS)}


class CampaignParams(FormParams):
    """Parameters of a campaign run (rendered as a form in the Prefect UI). Unset fields keep the file's values."""

    config: str = Field("configs/cpu-smoke.yaml", description="YAML config file (relative to the repo or absolute).")
    # A plain text field (not ``str | None``: the UI showed a type toggle for it); None is read as empty.
    name: str = Field("", description="Campaign name (resume key, S3 prefix, MLflow run name; lowercase letters, "
                      "digits, dashes). A campaign of this name that already exists is RESUMED after its last "
                      "completed stage, not started again: give a new name for a new campaign. Empty: the config "
                      "file's name (cpu-smoke: 'smoke'), resumed the same way.",
                      # the form checks the rule as it is typed (it was checked only after Submit)
                      json_schema_extra={"pattern": f"^$|{NAME_PATTERN}"})
    # Plain text fields like name (a `str | None` field needs its "None" toggle clicked in the form before it
    # can be typed in); empty or None: the config file's value. The numeric fields are plain number inputs
    # (flows.forms.OptionalInt: `int | None` in Python, no type toggle in the form); empty: the file's value,
    # which the help text names for the default config.
    env: str = Field("", description="Environment, e.g. textcraft-synth. Empty: the config file's.")
    iterations: OptionalInt = Field(None, ge=0, json_schema_extra=no_default,
                                    description=f"RL iterations. {empty_means('iterations')}")
    tasks_per_iteration: OptionalInt = Field(None, ge=1, json_schema_extra=no_default, description="RL tasks sampled "
                                             f"per iteration. {empty_means('tasks.tasks_per_iteration')}")
    G: OptionalInt = Field(None, ge=2, json_schema_extra=no_default, description="Rollout trees per task (group size "
                           f"of Eq. 3). {empty_means('algo.G')}")
    lam: OptionalFloat = Field(None, ge=0, json_schema_extra=no_default, description="Weight of the delegation bonus: "
                               "its cap (algo.bonus useful) or lambda of Eq. (1) (eq1). Empty: the config file's "
                               "(unset there, as in cpu-smoke: the environment's cap, textcraft-synth "
                               f"{TextCraftEnv.delegation_cap}).")
    max_depth: OptionalInt = Field(None, ge=0, json_schema_extra=no_default,
                                   description=f"Maximum recursion depth. {empty_means('runtime.max_depth')}")
    context_window: OptionalInt = Field(None, ge=256, json_schema_extra=no_default,
                                        description=f"Tokens per agent node. {empty_means('runtime.context_window')}")
    model_path: str = Field("", description="Initial checkpoint folder. Empty: the config file's model.path.")
    seed: OptionalInt = Field(None, json_schema_extra=no_default, description=f"Master seed. {empty_means('seed')}")
    overrides: list[str] = Field(default_factory=list, description="Extra KEY=VALUE overrides, e.g. trainer.lr=1e-5.")

    @field_validator("name", "env", "model_path", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return "" if v is None else v

    @field_validator("name")
    @classmethod
    def _campaign_name(cls, v: str) -> str:
        """The config's rule for a name (``CampaignConfig.name``), checked here so that a bad ``--name`` is
        named as the user wrote it, not as the ``--set name=...`` override it becomes in :meth:`resolve`."""
        if v and not re.fullmatch(NAME_PATTERN, v):
            raise ValueError("a campaign name is lowercase letters, digits and dashes, starting with a letter or digit")
        return v

    def resolve(self) -> CampaignConfig:
        """Load the config file and apply the set fields; raises ConfigError with a one-line message."""
        from rao_core.paths import REPO_ROOT

        path = Path(self.config)
        if not path.is_absolute() and not path.exists():
            path = REPO_ROOT / path
        ov: dict[str, Any] = {}
        for key, field in [("name", "name"), ("tasks.env", "env"), ("iterations", "iterations"),
                           ("tasks.tasks_per_iteration", "tasks_per_iteration"), ("algo.G", "G"), ("algo.lam", "lam"),
                           ("runtime.max_depth", "max_depth"), ("runtime.context_window", "context_window"),
                           ("model.path", "model_path"), ("seed", "seed")]:
            v = getattr(self, field)
            if v is not None and v != "":
                ov[key] = v
        import yaml

        for o in self.overrides:
            k, _, v = o.partition("=")
            ov[k.strip()] = yaml.safe_load(v)
        return load_config(path, ov).with_env_overrides()


@contextlib.contextmanager
def storage(cfg: CampaignConfig):
    """S3 settings for the campaign: configured endpoint, a running embedded server, or a new one."""
    from infra.services import service_env
    from infra.storage import S3Settings, SeaweedFSServer

    st = cfg.storage
    if st.endpoint_url:
        import os

        endpoint = None if st.endpoint_url == "aws" else st.endpoint_url
        yield S3Settings(endpoint, st.bucket, os.environ.get("AWS_ACCESS_KEY_ID"),
                         os.environ.get("AWS_SECRET_ACCESS_KEY"), os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        return
    env = service_env()  # a SeaweedFS started by `rao services up`
    if env.get("RAO_S3_ENDPOINT"):
        yield S3Settings(env["RAO_S3_ENDPOINT"], env.get("RAO_S3_BUCKET", st.bucket), env.get("AWS_ACCESS_KEY_ID"),
                         env.get("AWS_SECRET_ACCESS_KEY"), env.get("AWS_DEFAULT_REGION", "us-east-1"))
        return
    srv = SeaweedFSServer(bucket=st.bucket).start()
    try:
        yield srv.settings()
    finally:
        srv.stop()


def _tokenizer_path(ctx: RunContext, ckpt: Checkpoint) -> str:
    from tasks.serve import checkpoint_local

    return str(checkpoint_local(ctx, ckpt))


def campaign_run_name() -> str:
    """Prefect flow-run name of a campaign: its name (the config's when the form leaves it empty)."""
    from prefect.runtime import flow_run

    p = flow_run.parameters.get("params") or {}
    try:
        return (p if isinstance(p, CampaignParams) else CampaignParams.model_validate(p)).resolve().name
    except Exception:  # a bad form fails in the flow itself, with its own message
        return "campaign"


@flow(name="rao-iteration", log_prints=True, flow_run_name="{ctx.name}-iter-{iteration}", **ITERATION_END_HOOKS)
def rao_iteration(ctx: RunContext, iteration: int, ckpt: Checkpoint, reference: int | None = None) -> dict[str, Any]:
    """One RL iteration trained from ``ckpt``, the checkpoint of iteration ``reference`` (default
    ``iteration - 1``; after a collapse guard's rollback, the last good one), whose evaluation the collapse guard
    compares this one's with; returns the new checkpoint, evaluation metrics, stage timings and the guard's
    verdict (:func:`_finish_iteration`).

    Resumed, it starts a policy server only for a stage that still has to run: generation (serving the
    parent ``ckpt``) or evaluation (serving the new checkpoint); a completed iteration starts none, and its
    metrics come from the ``log`` stage's marker (MLflow is not written again). An iteration ``eval.every``
    does not evaluate (``EvalConfig.evaluates``) serves nothing for it: its ``evaluate`` stage is
    ``tasks.stages.skip_evaluation``."""
    it_run = iteration_run(ctx, iteration)
    times: dict[str, float] = {}
    store = ctx.store()
    todo = {s: not store.exists(done_key(iteration, s)) for s in ("generate", "evaluate")}
    t = time.monotonic()
    # A stage replayed on resume needs no server: its parent checkpoint may even have been pruned.
    served = serve_checkpoint(ctx, ckpt) if todo["generate"] else ServedEndpoint()
    times["serve"] = time.monotonic() - t
    tok = _tokenizer_path(ctx, ckpt) if todo["generate"] else ""
    gen = generate_trees(ctx, iteration, served, tok)
    judged = judge_trees(ctx, iteration, gen.trees_uri)
    val = validate_dataset(ctx, iteration, judged.scored_uri)
    tr = train_policy(ctx, iteration, val.samples_uri, ckpt)
    ev = EvalOutput()
    ref = iteration - 1 if reference is None else reference
    if ctx.config.eval.enabled and not ctx.config.eval.evaluates(iteration, ctx.config.iterations):
        ev = skip_evaluation(ctx, iteration, ref)
    elif ctx.config.eval.enabled:
        t = time.monotonic()
        served2 = serve_checkpoint(ctx, tr.checkpoint) if todo["evaluate"] else ServedEndpoint()
        times["serve_new"] = time.monotonic() - t
        ev = evaluate(ctx, iteration, served2, _tokenizer_path(ctx, tr.checkpoint) if todo["evaluate"] else "")
    return _finish_iteration(ctx, iteration, gen, judged, val, tr, ev, times, it_run, reference=ref)


def guard_verdict(ctx: RunContext, k: int, reference: int | None, ev: EvalOutput, val: ValidateOutput
                  ) -> GuardVerdict | None:
    """The collapse guard's verdict on iteration ``k`` (``rao_core.guard.judge_iteration`` with ``guard.alpha``
    and ``guard.min_drop``): its evaluation ``ev`` against the stored evaluation of the last evaluated iteration
    of its lineage (:func:`guard_reference` from iteration ``reference``, whose checkpoint it trained from; the
    verdict's ``reference`` is the iteration compared with; none when evaluation is off or the walk reaches an
    iteration without an evaluate marker), with the per-depth mean advantage of the solved training nodes of
    ``val``: the rows of the deciding benchmark (``CampaignConfig.primary_benchmark``) are tested, the other
    benchmarks' compared and reported (``reported``). An iteration not evaluated (``ev.evaluated`` False:
    ``eval.every``) is not judged: status 'no_reference', reason ``not evaluated: eval.every N``. None when
    ``guard.enabled`` is False."""
    g = ctx.config.guard
    if not g.enabled:
        return None
    advantage = val.sample_stats.get("mean_advantage_solved_per_depth")
    if not ev.evaluated:
        return judge_iteration(k, None, [], alpha=g.alpha, min_drop=g.min_drop, solved_advantage=advantage
                               ).model_copy(update={"reason": f"not evaluated: eval.every {ctx.config.eval.every}"})
    before = None
    if ctx.config.eval.enabled and (found := guard_reference(ctx, reference)) is not None:
        reference, before = found[0], found[1].rows
    return judge_iteration(k, before, ev.rows, alpha=g.alpha, min_drop=g.min_drop, reference=reference,
                           solved_advantage=advantage, benchmark=ctx.config.primary_benchmark())


def guard_reference(ctx: RunContext, reference: int | None) -> tuple[int, EvalOutput] | None:
    """The last evaluated iteration of a lineage and its stored evaluation: iteration ``reference`` when it was
    evaluated, else (``eval.every``) the iteration its stored record says it trained from (``trained_from``;
    ``reference - 1`` when the record lacks it), and so on back to iteration 0. None when ``reference`` is None
    or the walk reaches an iteration without an ``evaluate`` marker."""
    store, seen, r = ctx.store(), set(), reference
    while r is not None and r >= 0 and r not in seen and store.exists(done_key(r, "evaluate")):
        rec = stored_record(ctx, r, "evaluate", EvalOutput)
        if rec.evaluated:
            return r, rec
        seen.add(r)
        r = rec.trained_from if rec.trained_from is not None else r - 1
    return None


def guard_consequence(cfg: CampaignConfig, k: int, reference: int | None) -> str:
    """What follows a collapse of iteration ``k`` (trained from iteration ``reference``'s checkpoint) under
    ``guard.action``: the end of the guard's line, e.g. ``rollback: iteration 3 trains from iteration 1's
    checkpoint``. With overlapped iterations (``algo.max_staleness >= 1``) a rollback stops the campaign."""
    action, overlapped = cfg.guard.action, cfg.algo.max_staleness > 0
    if action == "warn":
        return "guard.action warn: the campaign goes on" + (" from it" if k < cfg.iterations else "")
    if k >= cfg.iterations:
        return f"no iteration left (guard.action {action})"
    if action == "stop":
        return "the campaign stops (guard.action stop)"
    if overlapped:
        return (f"the campaign stops (guard.action rollback: iteration {k + 1} already trained from it, iterations "
                "overlap)")
    return f"rollback: iteration {k + 1} trains from iteration {reference}'s checkpoint"


def _finish_iteration(ctx: RunContext, k: int, gen: GenerateOutput, judged: JudgeOutput, val: ValidateOutput,
                      tr: TrainOutput, ev: EvalOutput, times: dict[str, float], it_run: str | None = None,
                      reference: int | None = None) -> dict[str, Any]:
    """Judge iteration ``k`` (the collapse guard, :func:`guard_verdict`, against iteration ``reference``; default
    ``k - 1``), register its checkpoint (held back from ``champion`` after a collapse) and log its metrics
    (both resumable stages) to its MLflow run ``it_run`` (found or made when None), the guard's under ``guard/``
    there and in the campaign run; the iteration's summary entry (``guard``: the verdict, with the line printed
    for a collapse). The one ending of an iteration, synchronous or overlapped."""
    import mlflow

    log = get_run_logger()
    reference = k - 1 if reference is None else reference
    it_run = it_run or iteration_run(ctx, k)
    verdict = guard_verdict(ctx, k, reference, ev, val)
    if verdict is not None and tr.steps == 0 and verdict.status != "no_reference":
        # no optimizer step: the checkpoint holds its parent's weights, so a difference is evaluation noise
        verdict = verdict.model_copy(update={"status": "no_reference",
                                             "reason": "no optimizer step: the weights of the checkpoint it "
                                                       "trained from"})
    if verdict is not None and verdict.status == "no_reference":
        log.info(f"collapse guard: iteration {k} not judged ({verdict.reason or 'nothing to compare with'})")
    if verdict is not None and verdict.reported:  # the other benchmarks: compared, never deciding
        log.info(f"collapse guard: iteration {k} {verdict.reported_text()}")
    collapsed = verdict is not None and verdict.collapsed
    if collapsed and tr.steps > 0:
        reg = register_held(ctx, k, tr.checkpoint, ev.metrics, it_run,
                            verdict.line(f"iter-{k}", guard_consequence(ctx.config, k, reference)),
                            eval_rows=ev.rows)
    else:  # no optimizer step (the parent's weights) or not evaluated: register_checkpoint never promotes it
        reg = register_checkpoint(ctx, k, tr.checkpoint, ev.metrics, it_run, updated=tr.steps > 0,
                                  evaluated=ev.evaluated, eval_rows=ev.rows)
    for name, out in [("generate", gen), ("judge", judged), ("validate", val), ("train", tr), ("evaluate", ev),
                      ("register", reg)]:
        if out.stage_s is not None and (name != "evaluate" or ev.evaluated):
            times.setdefault(name, out.stage_s)
    logged = tracking.log_iteration(ctx, k, it_run, gen, judged, val, tr, ev, times)
    m, times = logged.metrics, logged.times or times  # a resumed log: the times of the run that logged them
    log.info(f"iteration {k}: root success {m.get('success/root', float('nan')):.3f}, "
             f"model version {reg.version} (champion moved: {reg.champion})")
    guard: dict[str, Any] | None = None
    if verdict is not None:
        guard = {**verdict.model_dump(), "line": ""}
        if collapsed:
            where = (f"iter-{k} ({reg.model} v{reg.version})" if reg.updated and reg.version else
                     f"iter-{k} (no optimizer step: its parent's weights)")
            guard["line"] = verdict.line(where, guard_consequence(ctx.config, k, reference))
            log.warning(guard["line"])
        for run in (it_run, ctx.campaign_run_id):
            if run and ev.evaluated:  # an iteration not evaluated has no guard/ point
                tracking.log_metrics(run, verdict.metrics(), step=k)
        mlflow.MlflowClient().set_tag(it_run, "guard/verdict", verdict.status)
        if guard["line"]:
            mlflow.MlflowClient().set_tag(it_run, "guard/line", guard["line"])
    mlflow.MlflowClient().set_terminated(it_run)
    return {"checkpoint": tr.checkpoint, "metrics": m, "times": times, "register": reg.model_dump(by_alias=True),
            "eval_rows": ev.rows, "evaluated": ev.evaluated, "guard": guard}


def _in_thread(pool: Any, fn: Any) -> Any:
    """``fn()`` in a thread of ``pool`` under this flow run's context (its Prefect tasks are this run's)."""
    import contextvars

    return pool.submit(contextvars.copy_context().run, fn)


@flow(name="rao-overlap-step", log_prints=True, flow_run_name="{ctx.name}-step-{plan.step}", **ITERATION_END_HOOKS)
def rao_overlap_step(ctx: RunContext, plan: OverlapStep, serve: Checkpoint, parent: Checkpoint | None = None,
                     ) -> dict[str, Any]:
    """One step of an overlapped campaign (``rao_core.async_rl``): the server holds ``serve`` (version
    ``plan.serve``); the train side trains iteration ``plan.train`` from ``parent``, while the serving side
    evaluates, registers and logs iteration ``plan.evaluate`` (whose checkpoint is ``serve``) and then grows
    iteration ``plan.generate_next``'s trees.

    Returns ``trained`` (the train side's TrainOutput or None), ``finished`` (the summary entry of the
    iteration evaluated, or None) and ``spans``: each side's (start, end) seconds from the step's start."""
    from concurrent.futures import ThreadPoolExecutor

    log = get_run_logger()
    store, cfg, t_step = ctx.store(), ctx.config, time.monotonic()
    eval_on = (cfg.eval.enabled and plan.evaluate is not None  # eval.every: a skipped one needs no server
               and cfg.eval.evaluates(plan.evaluate, cfg.iterations))
    todo = [(plan.generate_first, "generate"), (plan.evaluate if eval_on else None, "evaluate"),
            (plan.generate_next, "generate")]
    need_server = any(k is not None and not store.exists(done_key(k, s)) for k, s in todo)
    served = serve_checkpoint(ctx, serve) if need_server else ServedEndpoint()  # between generations only
    serve_s = time.monotonic() - t_step
    tok = _tokenizer_path(ctx, serve) if need_server else ""
    gen_first = None
    if plan.generate_first is not None:
        gen_first = generate_trees(ctx, plan.generate_first, served, tok, policy_version=plan.serve)
    spans: dict[str, tuple[float, float]] = {}

    def train_side() -> TrainOutput | None:
        if plan.train is None:
            return None
        t0, k = time.monotonic() - t_step, plan.train
        gen = gen_first if plan.generate_first == k else stored_record(ctx, k, "generate", GenerateOutput)
        judged = judge_trees(ctx, k, gen.trees_uri)
        iteration_run(ctx, k)  # before validation, whose report goes to it (the sync loop opens it first too)
        val = validate_dataset(ctx, k, judged.scored_uri)
        tr = train_policy(ctx, k, val.samples_uri, parent)
        spans["train side"] = (t0, time.monotonic() - t_step)
        return tr

    def serving_side() -> dict[str, Any] | None:
        t0, finished = time.monotonic() - t_step, None
        if plan.evaluate is not None:
            e = plan.evaluate
            ev = EvalOutput()
            if cfg.eval.enabled and not cfg.eval.evaluates(e, cfg.iterations):
                ev = skip_evaluation(ctx, e, e - 1)  # overlapped: iteration e trained from e - 1
            elif cfg.eval.enabled:
                ev = evaluate(ctx, e, served, tok if not store.exists(done_key(e, "evaluate")) else "")
            records = [stored_record(ctx, e, s, r) for s, r in (("generate", GenerateOutput), ("judge", JudgeOutput),
                                                                 ("validate", ValidateOutput), ("train", TrainOutput))]
            finished = _finish_iteration(ctx, e, *records, ev, {"serve_new": round(serve_s, 3)})
        if plan.generate_next is not None:
            generate_trees(ctx, plan.generate_next, served, tok, policy_version=plan.serve)
        if plan.evaluate is not None or plan.generate_next is not None:
            spans["serving side"] = (t0, time.monotonic() - t_step)
        return finished

    with ThreadPoolExecutor(2, thread_name_prefix=f"step-{plan.step}") as pool:
        train_f, serve_f = _in_thread(pool, train_side), _in_thread(pool, serving_side)
        finished, trained = serve_f.result(), train_f.result()  # either side's failure fails the step
    log.info(f"step {plan.step}: {_spans_text(spans)}")
    return {"trained": trained, "finished": finished, "spans": spans, "serve_s": round(serve_s, 3)}


def _spans_text(spans: dict[str, tuple[float, float]]) -> str:
    """``train side 0-95 s; serving side 0-80 s; overlap 80 s``: each side's span from the step's start and, when
    both ran, the seconds during which they ran at once (0 when they did not meet)."""
    text = "; ".join(f"{n} {a:.0f}-{b:.0f} s" for n, (a, b) in spans.items())
    if len(spans) == 2:
        text += f"; overlap {max(0.0, min(b for _, b in spans.values()) - max(a for a, _ in spans.values())):.0f} s"
    return text


@flow(name="rao-campaign", log_prints=True, flow_run_name=campaign_run_name, **FLOW_END_HOOKS)
def rao_campaign(params: CampaignParams = CampaignParams()) -> dict[str, Any]:
    """Run (or resume) a RAO campaign; returns a summary with per-iteration metrics and where to look.

    One process runs a campaign at a time: a second live run of the same name fails at once
    (``infra.orchestration.RunBusyError``); an earlier run whose process was killed is marked CRASHED in Prefect
    (``infra.orchestration.take_over_run``) and the campaign resumes after its last completed stage.

    A campaign already complete for these parameters (:func:`completed_summary`) returns its stored summary
    (``already_complete`` True) at once: no server is started and MLflow is not written. A campaign the collapse
    guard stopped (``guard.action`` stop) is not complete: its summary's ``guard.stopped_at`` names the
    iteration, and each collapse's line (``guard.collapses``) is logged again before the last line.

    The summary's ``timeline`` (:class:`rao_core.progress.Timeline`) holds the flow's wall time stage by stage,
    from its first line to its return (``wall_s`` = their sum); ``rao run`` adds what came before and after
    (its start-up, Prefect's) for its end-of-run table."""
    from infra.disk import keep_reserve

    from infra.orchestration import take_over_run
    from infra.serving_pool import check_external_server
    from rao_core.paths import rao_home

    timeline = Timeline()
    cfg = params.resolve()
    check_task_pool(cfg)  # a bad task file stops the campaign here, before anything is served
    log = get_run_logger()
    # one live run per campaign; an earlier run that was killed (SIGKILL: no hook ran) is marked CRASHED
    crashed = take_over_run(rao_home() / "campaigns" / cfg.name / "flow-run.json", f"campaign {cfg.name!r}")
    if crashed:
        log.warning(crashed)
    check_external_server(cfg)  # an external server that would serve another model than the campaign's: refused
    keep_reserve()  # room to close the MLflow runs FAILED should the disk fill (infra.disk)
    timeline.lap("config and task-pool check")
    with storage(cfg) as s3:
        done = completed_summary(ArtifactStore(s3, cfg.name), cfg)
        if done is not None:
            log.info(already_complete_line(done))
            summary_artifact(done, already_complete_line(done))
            return {**done, "already_complete": True}
        timeline.lap("S3 storage start, completion check")
        summary = _run_campaign(cfg, s3, timeline)
        stopped = summary["guard"]["stopped_at"]
        if stopped is None:  # stopped by the collapse guard: not complete, a re-run (another action) goes on
            ArtifactStore(s3, cfg.name).put_bytes(json.dumps(summary, default=str).encode(), CAMPAIGN_DONE_KEY)
    timeline.lap("campaign marker, S3 storage stop")  # this run's own table; the stored one ends before it
    summary.update(timeline=timeline.to_dict(), wall_s=round(timeline.total, 1))
    for line in summary["guard"]["collapses"]:  # again at the end, where the results are read
        log.warning(line)
    no_champion = no_champion_line(cfg, summary)
    if no_champion:
        summary["no_champion"] = no_champion
        log.warning(no_champion)
    end = "done" if stopped is None else f"stopped by the collapse guard after iteration {stopped}"
    log.info(f"campaign {cfg.name} {end} in {summary['wall_s']} s; MLflow {mlflow_link(summary)}; "
             f"artifacts {summary['s3_prefix']}")
    summary_artifact(summary)
    return summary


def no_champion_line(cfg: CampaignConfig, summary: dict[str, Any]) -> str | None:
    """When the campaign's registered model has no ``champion`` after its run: one line saying so and why, from
    each registered iteration's record in ``summary`` (no optimizer step, not evaluated, held back by the collapse
    guard, or scored below the champion's tolerance), and what follows (the nightly has nothing to compare with;
    Compare is empty in the registry). None when a version is champion."""
    from tasks.tracking import alias_version, registered_model_name

    name = registered_model_name(cfg, cfg.name)
    if alias_version(name, "champion") is not None:
        return None
    regs = [(0, (summary.get("warm_start") or {}).get("register"), True, None)]
    regs += [(it["iteration"], it.get("register"), it.get("evaluated", True), it.get("guard"))
             for it in summary.get("iterations", [])]
    why = []
    for k, reg, evaluated, guard in regs:
        if not reg:
            continue
        if not reg.get("updated", True):
            why.append(f"iteration {k} made no optimizer step")
        elif not evaluated:
            why.append(f"iteration {k} was not evaluated (eval.every {cfg.eval.every})")
        elif (guard or {}).get("status") == "collapse":
            why.append(f"iteration {k} was held back by the collapse guard")
        else:
            why.append(f"iteration {k} was not promoted")
    return (f"campaign {cfg.name}: no version of {name} became champion ("
            + ("; ".join(why) or "no version was registered")
            + "): the nightly regression (rao evaluate) has nothing to compare with until a version that made an "
              "update is evaluated")


def _seconds(phases: dict[str, float]) -> str:
    """``weights loaded 24 s, compiled 120 s, ready 141 s``: a server start's phases (``ServedEndpoint.start_phases``)."""
    return ", ".join(f"{p} {s:.0f} s" for p, s in phases.items() if p != "process up")


def _iteration_detail(times: dict[str, float], wall: float, resumed: bool) -> str:
    """The detail of an iteration's row: its stages' seconds and what no stage timed (MLflow logging, the
    subflow's own start and end); ``resumed``: done by an earlier run (its times are that run's)."""
    if resumed:
        return "done by an earlier run (resumed from its markers): " + " ".join(
            f"{k} {v:.0f}" for k, v in times.items())
    short = {"serve": "serve", "generate": "gen", "judge": "judge", "validate": "val", "train": "train",
             "serve_new": "swap", "evaluate": "eval", "register": "reg"}
    parts = [f"{short.get(k, k)} {v:.0f}" for k, v in times.items()]
    return " ".join(parts + [f"log+other {max(0.0, wall - sum(times.values())):.0f}"])


def _run_campaign(cfg: CampaignConfig, s3: Any, timeline: Timeline | None = None) -> dict[str, Any]:
    """The campaign's stages on storage ``s3`` (``infra.storage.S3Settings``): warm start, base evaluation,
    iterations; each stage resumed from its marker when complete, each (metric, step) logged once. Each stage
    is a lap of ``timeline`` (a new one when None), kept in the summary."""
    import mlflow

    timeline = timeline or Timeline()
    uri, exp_id = mlflow_setup(cfg)
    run_id = campaign_run(cfg, exp_id)
    summary: dict[str, Any] = {"campaign": cfg.name, "mlflow_uri": uri, "mlflow_run_id": run_id, "iterations": [],
                               "iterations_planned": cfg.iterations, "mlflow_experiment_id": exp_id,
                               "guard": {"enabled": cfg.guard.enabled, "action": cfg.guard.action, "collapses": [],
                                         "stopped_at": None}}
    if cfg.eval.enabled:  # the end-of-run tables: the deciding benchmark's rows by iteration, then every benchmark
        summary["eval_suite"] = {"training": cfg.training_benchmark_name(), "primary": cfg.primary_benchmark(),
                                 "benchmarks": {b.name: b.at for b in cfg.suite()}}
    ctx = RunContext(config=cfg, s3=s3.__dict__, mlflow_uri=uri, mlflow_experiment_id=exp_id, campaign_run_id=run_id)
    summary["s3_prefix"] = f"s3://{s3.bucket}/{cfg.name}/"
    timeline.lap("MLflow experiment and campaign run")
    try:
        ws = warm_start(ctx)
        ckpt = ws.checkpoint
        summary["warm_start"] = ws.model_dump(by_alias=True, exclude={"checkpoint"})
        summary["warm_start"]["checkpoint_local"] = ckpt.local
        summary["warm_start"]["checkpoint_uri"] = ckpt.uri  # its S3 copy (None: a registered or base model)
        timeline.lap("warm start", "done by an earlier run (resumed)" if ws.resumed else
                     f"demonstrations {ws.demo_s or 0:.0f} s, SFT {ws.sft_s or 0:.0f} s ({ws.sft_steps} steps), "
                     "upload and logging the rest" if ws.mode == "demos" else f"mode {ws.mode}")
        base_metrics: dict[str, float] = {}
        if cfg.eval.enabled:  # iteration 0: the starting checkpoint, for the learning curve
            todo = not ctx.store().exists(done_key(0, "evaluate"))  # resumed: no server to start
            served = serve_checkpoint(ctx, ckpt) if todo else ServedEndpoint()
            timeline.lap("first vLLM start", _seconds(served.start_phases) or served.how or "not needed (resumed)")
            ev0 = evaluate(ctx, 0, served, _tokenizer_path(ctx, ckpt) if todo else "")
            base_metrics = ev0.metrics
            tracking.log_metrics(run_id, base_metrics, step=0)
            summary["base_eval"] = ev0.rows
            timeline.lap("base evaluation (iteration 0)", "done by an earlier run (resumed)" if ev0.resumed else "")
        if ws.mode == "demos":  # the warm-started checkpoint is the campaign's iteration 0
            it0 = iteration_run(ctx, 0)
            tracking.log_metrics(it0, base_metrics, step=0)
            summary["warm_start"]["register"] = register_checkpoint(
                ctx, 0, ckpt, base_metrics, it0, eval_rows=summary.get("base_eval")).model_dump(by_alias=True)
            mlflow.MlflowClient().set_terminated(it0)
            timeline.lap("register iteration 0")
        if cfg.algo.max_staleness == 0:
            good = 0  # the iteration whose checkpoint the next one trains from (0: the starting checkpoint)
            for k in range(1, cfg.iterations + 1):
                t_it = time.time()
                resumed = ctx.store().exists(done_key(k, "log"))  # complete: its stages return their markers
                out = rao_iteration(ctx, k, ckpt, good)
                timeline.lap(f"iteration {k}", _iteration_detail(out["times"], time.time() - t_it, resumed))
                collapsed = (out.get("guard") or {}).get("status") == "collapse"
                rollback = collapsed and cfg.guard.action == "rollback"
                # after a collapse (but under 'warn') the last good checkpoint stays on S3: the next iteration's
                # parent, or a re-run's after 'stop'
                _iteration_done(ctx, k, out, summary, timeline, prune=not (collapsed and cfg.guard.action != "warn"))
                if collapsed and cfg.guard.action == "stop" and k < cfg.iterations:
                    summary["guard"]["stopped_at"] = k
                    break
                if not rollback:
                    ckpt, good = out["checkpoint"], k
        elif cfg.iterations >= 1:  # asynchronous RL (overlap_schedule needs an iteration)
            _overlapped_iterations(ctx, ckpt, summary, timeline)
    finally:
        shutdown_server()
    timeline.lap("vLLM stop")
    summary["wall_s"] = round(timeline.total, 1)
    summary["completed_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    tracking.log_metrics(run_id, {"time/campaign_s": summary["wall_s"]})
    mlflow.MlflowClient().set_terminated(run_id)
    timeline.lap("MLflow campaign run end")
    summary.update(timeline=timeline.to_dict(), wall_s=round(timeline.total, 1))
    return summary


def _iteration_done(ctx: RunContext, k: int, finished: dict[str, Any], summary: dict[str, Any],
                    timeline: Timeline, prune: bool = True) -> None:
    """After iteration ``k`` finished (``finished``: :func:`_finish_iteration`'s entry), in either loop:
    ``checkpoints.*`` retention (resume and the registry keep theirs; skipped when not ``prune``: after a
    collapse under ``guard.action`` rollback or stop, whose next iteration, or a re-run's, trains from an older
    checkpoint than the newest), then its
    row of ``summary`` and, for a collapse, the guard's line in ``summary["guard"]["collapses"]``."""
    from infra.retention import prune_campaign

    if prune:
        prune_campaign(ctx.store(), ctx.config.checkpoints, finished["register"]["model"], ctx.local("checkpoints"))
        timeline.lap(f"retention after iteration {k}")
    guard = finished.get("guard")
    summary["iterations"].append({"iteration": k, **{f: finished[f] for f in ("metrics", "times", "register",
                                                                              "eval_rows")},
                                  "evaluated": finished.get("evaluated", True),  # False: eval.every skipped it
                                  "checkpoint_local": finished["checkpoint"].local, "guard": guard})
    if guard and guard.get("line"):
        summary.setdefault("guard", {}).setdefault("collapses", []).append(guard["line"])


def _overlapped_iterations(ctx: RunContext, ckpt: Checkpoint, summary: dict[str, Any], timeline: Timeline) -> None:
    """The iterations of an asynchronous campaign (``algo.max_staleness >= 1``): the steps of
    ``rao_core.async_rl.overlap_schedule``, each a :func:`rao_overlap_step` subflow, from checkpoint ``ckpt``
    (version 0); appends each finished iteration to ``summary`` and each step to ``timeline`` with both sides'
    spans and their overlap. A collapse (the guard) under ``guard.action`` stop or rollback ends the steps."""
    ckpts = {0: ckpt}
    for plan in overlap_schedule(ctx.config.iterations):
        t0 = time.time()
        out = rao_overlap_step(ctx, plan, ckpts[plan.serve], ckpts.get(plan.train - 1) if plan.train else None)
        if out["trained"] is not None:
            ckpts[plan.train] = out["trained"].checkpoint
        what = " + ".join(x for x in (f"train {plan.train}" if plan.train else "",
                                      f"evaluate {plan.evaluate}" if plan.evaluate else "",
                                      f"generate {plan.generate_next}" if plan.generate_next else "") if x)
        timeline.lap(f"step {plan.step} ({what})",
                     f"swap {out['serve_s']:.0f} s; {_spans_text(out['spans'])} (step {time.time() - t0:.0f} s)")
        if out["finished"] is not None:
            _iteration_done(ctx, plan.evaluate, out["finished"], summary, timeline)
            if ((out["finished"].get("guard") or {}).get("status") == "collapse" and ctx.config.guard.action != "warn"
                    and plan.evaluate < ctx.config.iterations):  # a rollback too: the next one trained from it
                summary["guard"]["stopped_at"] = plan.evaluate
                return


