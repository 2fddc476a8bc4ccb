"""``rao run`` (the main job), ``rao evaluate`` (nightly regression) and ``rao deploy`` (Prefect deployments)."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

import typer
from rich.table import Table

from rao_cli import InputError, make_console

console = make_console()


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks stop the services this process started."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _prefect_env() -> None:
    _exit_on_sigterm()
    from infra.orchestration import configure_prefect
    from infra.services import apply_service_env

    apply_service_env()
    configure_prefect()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def prefect_hint() -> str:
    """The end-of-run line saying where the campaign's Prefect runs are: the UI of the API they went to
    (``PREFECT_API_URL``: the server of ``rao services up --prefect-server``, another one, Prefect Cloud), else
    how to serve the embedded API's database (``PREFECT_HOME``): ``rao services up --prefect-server`` serves
    ``$RAO_HOME/prefect`` (:func:`infra.orchestration.prefect_env`); a plain ``prefect server start`` would
    read ``~/.prefect`` and show none of them."""
    from infra.orchestration import prefect_bin, prefect_env

    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    if "api.prefect.cloud" in api:
        return "Prefect:   https://app.prefect.cloud  (the Prefect Cloud workspace of PREFECT_API_URL)"
    if api:
        return f"Prefect:   {api.removesuffix('/api')}  (the UI of PREFECT_API_URL)"
    home = os.environ.get("PREFECT_HOME", "")
    if home == prefect_env()["PREFECT_HOME"]:
        rao = shlex.quote(str(Path(sys.executable).parent / "rao"))  # absolute: works from any folder
        return (f"Prefect:   {rao} services up --prefect-server  then open the printed URL (it serves "
                f"{home}, where these runs are; later runs report to it)")
    return f"Prefect:   PREFECT_HOME={home} {prefect_bin()} server start  then open the printed URL"


def mlflow_hint(summary: dict) -> str:
    """The end-of-run lines saying where the campaign's MLflow runs are: the ``mlflow ui`` command and the page
    of its experiment in the model-training view. MLflow 3's UI picks its view from a browser-wide switch
    (GenAI by default), not from the experiment's ``mlflow.experimentKind`` tag: the ``workflowType`` query
    parameter selects the runs table (``infra.tracking.MODEL_TRAINING_VIEW``)."""
    from infra.tracking import MODEL_TRAINING_VIEW, mlflow_ui_command

    line = f"MLflow:    {mlflow_ui_command(summary['mlflow_uri'])}   (run {summary['mlflow_run_id']})"
    exp = summary.get("mlflow_experiment_id")
    if exp:
        line += (f"\n           then open http://127.0.0.1:5000/#/experiments/{exp}?{MODEL_TRAINING_VIEW} (the runs "
                 "table; or pick \"Model training\" in the sidebar once: the browser remembers it)")
    return line


def _summary_table(summary: dict) -> Table:
    from tasks.bookkeeping import primary_rows

    primary = (summary.get("eval_suite") or {}).get("primary")
    t = Table(title=f"campaign {summary['campaign']}: validation success by iteration")
    for c in ("iter", "train success", "signal (samples / groups)",
              f"eval{f' ({primary})' if primary else ''} (mode/difficulty: success [95% CI])", "version", "champion"):
        t.add_column(c)

    def ev(rows: list[dict]) -> str:
        return "\n".join(f"{r['mode'][:3]}/{r['difficulty']}: {r['success']:.2f} {r['ci95']}"
                         for r in primary_rows(summary, rows))

    if summary.get("base_eval"):
        reg = (summary.get("warm_start") or {}).get("register") or {}
        t.add_row("0", "", "", ev(summary["base_eval"]), str(reg.get("version", "")),
                  "yes" if reg.get("champion") else "")
    for it in summary["iterations"]:
        m = it["metrics"]
        signal = (f"{int(m.get('samples/num_signal_samples', 0))}/{int(m.get('samples/num_samples', 0))} / "
                  f"{int(m.get('samples/num_signal_groups', 0))}/{int(m.get('samples/num_groups', 0))}"
                  + ("" if it["register"].get("updated", True) else "\n(no update)"))
        t.add_row(str(it["iteration"]), f"{m.get('success/root', float('nan')):.2f}", signal, ev(it["eval_rows"]),
                  str(it["register"]["version"]), "yes" if it["register"]["champion"] else "")
    return t


def benchmark_table(summary: dict) -> Table | None:
    """The end-of-run table of held-out success by benchmark: a row per benchmark (and mode/difficulty), a column
    per evaluated iteration (0: the base evaluation), each cell ``success [Wilson 95%] n``
    (``tasks.bookkeeping.benchmark_points``); None when the campaign evaluated one benchmark only."""
    from tasks.bookkeeping import benchmark_points

    its, rows = benchmark_points(summary)
    if len({b for b, _, _ in rows}) < 2:
        return None
    t = Table(title=f"campaign {summary['campaign']}: held-out success by benchmark")
    for c in ("benchmark", "mode/difficulty", *(f"iter {k}" for k in its)):
        t.add_column(c)
    for b, row, by_it in rows:
        t.add_row(b, row, *(f"{r['success']:.2f} {r['ci95']} n {r['n']}" if (r := by_it.get(k)) else "" for k in its))
    return t


def stage_table(summary: dict) -> Table:
    """Wall time per stage and iteration, and the share spent outside generation and training.

    Orchestration overhead = iteration wall - rollout generation - training - evaluation rollouts
    (evaluation is itself model generation), as a fraction of the iteration wall time.
    """
    stages = ["serve", "generate", "judge", "validate", "train", "serve_new", "evaluate", "register"]
    heads = ["serve", "gen", "judge", "val", "train", "swap", "eval", "reg"]
    t = Table(title="wall time per stage (s); overhead = share outside generation and training")
    for c in ["it", *heads, "total", "ovh"]:
        t.add_column(c, justify="right", no_wrap=True, min_width=len(c))
    for it in summary["iterations"]:
        tm = it["times"]
        total = sum(tm.values())
        model = it["metrics"].get("time/generation_model_s", tm.get("generate", 0.0)) + tm.get("train", 0.0) \
            + tm.get("evaluate", 0.0)
        over = (total - model) / total if total else 0.0
        t.add_row(str(it["iteration"]), *(f"{tm[s]:.0f}" if s in tm else "-" for s in stages), f"{total:.0f}",
                  f"{100 * over:.1f}%")
    return t


MAKE_STARTED_AT = "RAO_MAKE_STARTED_AT"  # set by `make run` (epoch seconds) before its set-up check


def run_timeline(summary: dict, *, process_start: float, called_at: float, returned_at: float,
                 now: float | None = None, make_started_at: float | None = None):
    """The whole ``rao run`` as one :class:`rao_core.progress.Timeline`: ``make run``'s set-up check (when
    ``make_started_at`` is given), the process's start-up up to the flow call (``process_start`` to
    ``called_at``), Prefect's local API and flow-run start (to the flow's first line), every stage of the flow
    (``summary["timeline"]``), Prefect's flow-run end (to ``returned_at``) and this summary (to ``now``).
    The rows are consecutive intervals, so they sum to the wall time from the first mark to ``now`` exactly
    (epoch seconds throughout; ``now`` defaults to the current time)."""
    import time

    from rao_core.progress import Timeline

    flow = Timeline.from_dict(summary["timeline"])
    first = make_started_at if make_started_at is not None and make_started_at <= process_start else process_start
    tl = Timeline(first)
    if first < process_start:
        tl.lap("make run: set-up check (scripts/setup.sh)", at=process_start)
    tl.lap("rao start-up: interpreter, imports, config and completion checks", at=called_at)
    tl.lap("Prefect: local API start, flow run created", at=flow.start)
    for row in flow.rows:
        tl.rows.append(dict(row))
    tl.mark = flow.mark
    tl.lap("Prefect: flow run end", at=returned_at)
    tl.lap("end-of-run summary", at=time.time() if now is None else now)
    return tl


def wall_time_table(rows: list[dict], total: float, title: str) -> Table:
    """One table of every stage: seconds, share of ``total`` and detail per row, then the total (the rows'
    sum, which :func:`run_timeline` makes the wall time)."""
    t = Table(title=title)
    for c, j in (("stage", "left"), ("s", "right"), ("share", "right"), ("detail", "left")):
        t.add_column(c, justify=j, overflow="fold")
    for r in rows:
        t.add_row(r["stage"], f"{r['s']:.1f}", f"{100 * r['s'] / total:.1f}%" if total > 0 else "-",
                  r.get("detail", ""))
    t.add_section()
    t.add_row("total (wall time)", f"{total:.1f}", "100.0%", f"sum of the {len(rows)} rows above")
    return t


def print_summary(summary: dict, timeline=None) -> None:
    """Print a campaign's summary (``rao_campaign``'s return value, or the stored one of a complete campaign):
    the results table (the deciding benchmark by iteration, then every benchmark by iteration when the suite has
    several), one table of every stage's wall time, and where its artifacts, MLflow runs and Prefect
    runs are; a last ``warning:`` line when no version became champion (``flows.campaign.no_champion_line``).
    ``timeline``: this command's whole run (:func:`run_timeline`); without it, the flow's own
    stages as stored (a summary from before the timeline existed: the per-iteration table)."""
    from rao_core.paths import rao_home

    console.print(_summary_table(summary))
    if (by_benchmark := benchmark_table(summary)) is not None:
        console.print(by_benchmark)
    if timeline is not None:
        console.print(wall_time_table(timeline.rows, timeline.total,
                                      "wall time per stage of this `rao run` (s); the rows sum to its wall time"))
        console.print(f"wall time: {timeline.total:.1f} s (flow {summary['wall_s']} s)")
    elif summary.get("timeline"):
        from rao_core.progress import Timeline

        flow = Timeline.from_dict(summary["timeline"])
        console.print(wall_time_table(flow.rows, flow.total, "wall time per stage of the run that completed it "
                                      f"({summary.get('completed_at', '?')}), inside its flow (s)"))
        console.print(f"wall time: {summary['wall_s']} s (that run's flow)")
    else:
        console.print(stage_table(summary))
        console.print(f"wall time: {summary['wall_s']} s")
    console.print(f"artifacts: {summary['s3_prefix']}  (local cache: {rao_home() / 'campaigns' / summary['campaign']})")
    console.print(mlflow_hint(summary), soft_wrap=True)
    console.print(prefect_hint())
    if summary.get("no_champion"):  # the nightly's comparison depends on it: said where the run's end is read
        console.print(f"warning: {summary['no_champion']}", soft_wrap=True)


def _process_start() -> float:
    """When this process started (epoch seconds, ``psutil``): the first mark of ``rao run``'s table."""
    import psutil

    return psutil.Process().create_time()


def _make_started_at() -> float | None:
    """``RAO_MAKE_STARTED_AT`` (set by ``make run`` before its set-up check), removed from the environment so
    that no child reads it; None when unset or not a number."""
    value = os.environ.pop(MAKE_STARTED_AT, "")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def completed_campaign(cfg) -> dict | None:
    """The stored summary of campaign ``cfg`` when it is already complete (``tasks.bookkeeping.completed_summary``:
    every iteration asked for has run), else None. Opens the campaign's storage (the configured endpoint, that of
    ``rao services up``, or an embedded SeaweedFS for the duration of the check) and reads one object: no
    Prefect API, no policy server, nothing written to MLflow."""
    from flows.campaign import storage
    from tasks.bookkeeping import completed_summary
    from infra.storage import ArtifactStore

    with storage(cfg) as s3:
        return completed_summary(ArtifactStore(s3, cfg.name), cfg)


def checked_run_inputs(params):
    """The campaign config of ``rao run``'s parameters (``flows.campaign.CampaignParams``), every input it reads
    checked before any service, flow run or process starts, each mistake one ``error:`` line with exit 2
    (``rao_cli.main``): the config file and the ``--set`` overrides (ConfigError, naming the key), the folders
    and files the config names (``model.path``, ``tasks.train_file``, a local ``warm_start.checkpoint``:
    ``CampaignConfig.check_paths``), the default model folder (ModelError) and the records of the task file
    ``tasks.train_file``, read as ``rao eval`` and ``rao tasks stats`` read it (InputError naming the file and
    the line; a file with no task too), an external policy server that cannot serve the campaign's checkpoints
    (``infra.serving_pool.check_external_server``). ``models:/`` and ``s3://`` references are resolved when the
    campaign runs."""
    from infra.models import require_model
    from rao_cli import input_errors
    from tasks.stages import check_task_pool

    cfg = params.resolve()  # ConfigError: the config, the overrides, the paths it names
    from infra.process import ServiceError
    from infra.serving_pool import check_external_server

    try:  # `rao services up --model M`'s server (RAO_POLICY_BASE_URL) serving another model than the campaign's
        check_external_server(cfg)
    except ServiceError as e:
        raise InputError(str(e)) from None
    if cfg.warm_start.mode != "checkpoint":
        require_model(cfg.model.path)  # the default checkpoint (a set model.path is checked by resolve)
    if cfg.tasks.train_file is not None:
        with input_errors("tasks.train_file: "):  # the reader names the file and the line
            n = check_task_pool(cfg)
        if n == 0:
            raise InputError(f"tasks.train_file: {cfg.tasks.train_file}: holds no task (no non-blank line); `rao "
                             "tasks generate` writes task files")
    return cfg


def _key_values(values: list[str]) -> list[str]:
    """typer callback of ``--set``: every value is KEY=VALUE."""
    for v in values:
        if "=" not in v or not v.partition("=")[0].strip():
            raise typer.BadParameter(f"expected KEY=VALUE (e.g. algo.G=8), got {v!r}")
    return values


_OPTION_OF_FIELD = {"overrides": "--set", "arms": "--arm"}


def params_from_options(model, option_names: dict[str, str] | None = None, **options):
    """``model(**options)``: the parameters model of a flow (``flows.campaign.CampaignParams``,
    ``research.experiment.ExperimentParams``) built from a command's options. Raises typer.BadParameter (one
    ``error:`` line, exit 2) naming the option the user wrote (``--iterations``; ``--set`` for ``overrides``,
    ``--arm`` for ``arms``; ``option_names`` maps a field to the command's own option, e.g. ``name`` to
    ``--campaign``) for a value the model refuses, where pydantic's error named the model's class."""
    from pydantic import ValidationError

    from rao_core.jsonl import short_repr

    try:
        return model(**options)
    except ValidationError as e:
        first, *rest = e.errors()
        field = str(first["loc"][0]) if first["loc"] else ""
        option = {**_OPTION_OF_FIELD, **(option_names or {})}.get(field, "--" + field.replace("_", "-"))
        more = f"; and {len(rest)} more" if rest else ""
        raise typer.BadParameter(f"{first['msg']} (got {short_repr(first.get('input'))}){more}",
                                 param_hint=f"'{option}'") from None


def _config_fields(**values):
    """The set ``values`` checked by the rules of the top-level fields of the same names of
    :class:`rao_core.config.CampaignConfig` (``name``, ``iterations``; ``flows.campaign.CampaignParams``
    mirrors them, without importing Prefect here); pydantic's ValidationError otherwise, located at the
    field. For :func:`params_from_options` where no parameters model is built (``rao run --plan``)."""
    from rao_core.config import CampaignConfig

    config = CampaignConfig.model_construct()
    for field, value in values.items():
        if value is not None:
            CampaignConfig.__pydantic_validator__.validate_assignment(config, field, value)
    return config


def _suite(base, envs: list[str], difficulties: list[str], n_tasks: int | None) -> list:
    """The nightly suite of ``rao evaluate``: ``flows.evaluate.SuiteEntry`` per benchmark, checked here, before
    any service starts.

    Without ``--env``: the config's whole suite (``flows.evaluate.default_suite``: its training benchmark and
    ``eval.benchmarks``). Each ``--env E`` (once each) picks the config's benchmark of environment ``E``, else the
    standard suite's (``rao_core.evaluation.STANDARD_BENCHMARKS``, with the config's modes, seed, split and
    grading), else a new benchmark whose difficulties must be named. ``--difficulty ENV=D`` sets the
    difficulties of that environment's benchmark (repeat it for several); a bare ``--difficulty D`` those of the
    one ``--env`` given, or without ``--env`` those of the training benchmark (``tasks.env``); with several
    ``--env`` a bare one is refused as ambiguous. Every benchmark is at ``n_tasks`` tasks per difficulty when
    given, else at its ``regression_n_tasks``.

    Raises typer.BadParameter naming ``--env`` for an unknown environment (listing the known ones), one given
    twice, or one whose difficulties nobody names; ``--difficulty`` for a difficulty the environment does not
    have (``eval.difficulties`` for the config's own), a bare one with several ``--env``, or an ``ENV=`` that
    names no environment of the suite.
    """
    from flows.evaluate import SuiteEntry, default_suite
    from rao_cli import env_option
    from rao_core.envs import canonical_name
    from rao_core.evaluation import STANDARD_BENCHMARKS, benchmark_name

    config_suite = default_suite(base, n_tasks)
    picked: list[tuple[str, SuiteEntry | None]] = [(s.env, s) for s in config_suite]  # (env, the config's entry)
    if envs:
        picked, seen = [], set()
        for e in envs:
            env_option(e)  # first: an unknown environment was reported as a --difficulty problem
            if canonical_name(e) in seen:
                raise typer.BadParameter(f"environment {e!r} is given twice", param_hint="'--env'")
            seen.add(canonical_name(e))
            picked.append((e, next((s for s in config_suite if canonical_name(s.env) == canonical_name(e)), None)))
    named: dict[str, list[str]] = {}
    for d in difficulties:
        env, sep, diff = d.rpartition("=")
        if not sep and len(envs) > 1:
            raise typer.BadParameter(f"{d!r} names no environment and {len(envs)} --env are given: write "
                                     "ENV=DIFFICULTY, e.g. --difficulty oolong=mixed", param_hint="'--difficulty'")
        if sep:
            env_option(env, "'--difficulty'")
            if not any(canonical_name(e) == canonical_name(env) for e, _ in picked):
                raise typer.BadParameter(f"{d!r}: {env!r} is not an environment of the suite "
                                         f"({', '.join(e for e, _ in picked)})", param_hint="'--difficulty'")
        named.setdefault(canonical_name(env if sep else picked[0][0]), []).append(diff)
    out = []
    for e, entry in picked:
        given = named.get(canonical_name(e))
        std = STANDARD_BENCHMARKS.get(benchmark_name(e))
        ds = given or (list(entry.difficulties) if entry else list(std["difficulties"]) if std else [])
        if not ds:
            raise typer.BadParameter(f"environment {e!r} is not a benchmark of the config's suite nor a standard "
                                     f"one: name its difficulties, --difficulty {e}=DIFFICULTY", param_hint="'--env'")
        env = env_option(e)
        for d in ds:
            try:
                env.check_difficulty(d)
            except ValueError as err:
                raise typer.BadParameter(str(err), param_hint="'--difficulty'" if given else "eval.difficulties"
                                         ) from None
        if entry is not None:
            out.append(entry.model_copy(update={"difficulties": ds}))
        else:
            ev = base.eval
            out.append(SuiteEntry(env=e, difficulties=ds, n_tasks=n_tasks or ev.regression_n_tasks,
                                  modes=list(ev.modes), seed=ev.seed, split=ev.split, graded=ev.graded))
    return out


def _registered_model(base, model: str) -> str:
    """``models:/`` URI of ``--model`` (alias, version number or URI, as ``rao-evaluate`` reads it), checked
    (form, then the MLflow registry) before any service starts. ``s3://`` and folder references pass as they
    are (an ``s3://`` one is checked by :func:`_checked_s3_checkpoint`)."""
    if model.startswith(("s3://", "/", ".")):
        return model
    import logging

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from infra.tracking import configure_mlflow

    from tasks.tracking import registered_model_name

    name = registered_model_name(base)
    ref = model if model.startswith("models:/") else (f"models:/{name}/{model}" if model.isdigit()
                                                       else f"models:/{name}@{model}")
    body = ref.removeprefix("models:/")
    if "@" in body:
        reg, _, alias = body.partition("@")
        well_formed = bool(reg and alias)
    else:
        reg, _, version = body.partition("/")
        well_formed = bool(reg) and version.isdigit()
    if not well_formed:  # before MLflow is asked (it failed with a TypeError or its own message)
        raise typer.BadParameter(
            f"{model!r} is not a model reference: expected models:/<name>/<version>, models:/<name>@<alias>, "
            f"a version number or an alias of {name}", param_hint="'--model'")
    uri = configure_mlflow(base.tracking.tracking_uri)
    quiet = [logging.getLogger(n) for n in ("mlflow", "alembic")]  # "Creating initial MLflow database tables..."
    levels = [lg.level for lg in quiet]
    try:
        for lg in quiet:
            lg.setLevel(logging.WARNING)
        if "@" in body:
            MlflowClient().get_model_version_by_alias(*body.split("@", 1))
        else:
            MlflowClient().get_model_version(*body.split("/", 1))
    except MlflowException as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise InputError(f"--model {model}: {ref} is not in the MLflow registry at {uri} ({first}); run campaign "
                         f"{base.name!r} first (`rao run --config CONFIG --name {base.name}`) or pass a registered "
                         "version") from None
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    return ref


def _check_s3_checkpoint(s3, ref: str, model: str) -> None:
    """InputError (exit 2) unless objects lie under the ``s3://BUCKET/KEY`` checkpoint folder ``ref`` in the
    storage ``s3`` (:class:`infra.storage.S3Settings`; the bucket is the URI's), listed as the fetch lists it;
    ValueError (exit 1) when the storage cannot be listed."""
    from dataclasses import replace

    from botocore.exceptions import BotoCoreError, ClientError

    from infra.storage import ArtifactStore

    bucket, _, key = ref.removeprefix("s3://").strip("/").partition("/")
    parent, _, leaf = key.rpartition("/")
    where = s3.endpoint_url or "AWS S3"
    try:
        found = bool(bucket and parent) and bool(ArtifactStore(replace(s3, bucket=bucket), parent).list(leaf + "/"))
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code")) not in ("NoSuchBucket", "404", "NotFound"):
            raise ValueError(f"--model {model}: cannot list {ref} at {where}: {e}") from None
        found = False
    except BotoCoreError as e:
        raise ValueError(f"--model {model}: cannot list {ref} at {where}: {e}") from None
    if not found:  # a reference to nothing: an input error (exit 2); a storage that fails: exit 1
        raise InputError(f"--model {model}: no objects under {ref} at {where} (expected a checkpoint folder a "
                         "campaign uploaded: s3://BUCKET/CAMPAIGN/iter-K/checkpoint)")


@contextlib.contextmanager
def _checked_s3_checkpoint(base, ref: str, model: str):
    """For an ``s3://`` ``--model``: the evaluation's storage (the configured endpoint, that of `rao services
    up`, or an embedded SeaweedFS started here) is opened and the checkpoint checked before Prefect and MLflow
    start; the flow then uses the same storage (its endpoint is exported while it runs: no second SeaweedFS).
    Other references: nothing to do."""
    if not ref.startswith("s3://"):
        yield
        return
    from flows.campaign import storage

    with storage(base) as s3:
        _check_s3_checkpoint(s3, ref, model)
        env = s3.env()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def kill_campaign_runs(cfg, since_ms: int) -> list[str]:
    """Mark KILLED the MLflow runs of campaign ``cfg.name`` that are RUNNING, or that a Prefect crash hook
    marked FAILED at or after ``since_ms`` (the interrupt); returns their ids."""
    import mlflow

    from infra.tracking import configure_mlflow

    configure_mlflow(cfg.tracking.tracking_uri)
    exp = mlflow.get_experiment_by_name(cfg.tracking.experiment)
    if exp is None:
        return []
    runs = mlflow.search_runs([exp.experiment_id], output_format="list",  # names are [a-z0-9-]: no quoting
                              filter_string=f"tags.`rao.campaign` = '{cfg.name}'")
    ended = [r.info.run_id for r in runs if r.info.status == "RUNNING"
             or (r.info.status == "FAILED" and (r.info.end_time or 0) >= since_ms)]
    for run_id in ended:
        mlflow.MlflowClient().set_terminated(run_id, status="KILLED")
    return ended


def _embedded_prefect_api_checked() -> None:
    """With Prefect's embedded API (no ``PREFECT_API_URL``): forget this process's API server if it no longer
    answers (a Ctrl-C in a terminal reaches its process group too), so that the next client starts another one
    on the same database (``PREFECT_HOME``)."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    import httpx
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the one instance of this process (the flows' own), if started
    if server.server_process is None:
        return
    try:
        httpx.get(f"{server.api_url}/health", timeout=5).raise_for_status()
    except httpx.HTTPError:
        server.stop()


def cancel_flow_runs(flows: list[str], since_ms: int, names=lambda name: True) -> list[str]:
    """Set CANCELLED the runs of the Prefect flows named ``flows`` that started at or after ``since_ms``, are
    still RUNNING, PENDING, PAUSED or CANCELLING and whose name passes ``names``; returns their names.

    The state is forced (``set_flow_run_state(..., force=True)``): the process running them is stopping and
    no engine will report their end, so they would stay RUNNING in the UI. The embedded API is started again
    if the interrupt stopped it (:func:`_embedded_prefect_api_checked`). Raises the client's errors
    (``httpx.HTTPError``, ...) when the API does not answer a request within 10 s."""
    from datetime import datetime, timezone

    from prefect import get_client
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStartTime,
                                                FlowRunFilterState, FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    _embedded_prefect_api_checked()
    live = [StateType.RUNNING, StateType.PENDING, StateType.PAUSED, StateType.CANCELLING]
    started = FlowRunFilterStartTime(after_=datetime.fromtimestamp(since_ms / 1000, timezone.utc))
    with get_client(httpx_settings={"timeout": 10.0}, sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=list(flows))),
                                     flow_run_filter=FlowRunFilter(start_time=started, state=FlowRunFilterState(
                                         type=FlowRunFilterStateType(any_=live))))
        mine = [r for r in runs if names(r.name)]
        for r in mine:
            client.set_flow_run_state(r.id, Cancelled(message="interrupted (Ctrl-C or SIGTERM)"), force=True)
    return sorted(r.name for r in mine)


def _interrupt_handler(kill, since_ms: int, subject: str, tail: str = "", cancel=None):
    """``on_interrupt`` for :func:`infra.process.run_interruptible`: ``kill(since_ms)`` marks the MLflow runs
    the command started KILLED (a remote MLflow that is down fails in seconds), then ``cancel(since_ms)``
    (if given) marks its Prefect flow runs CANCELLED (:func:`cancel_flow_runs`); returns the one-line message
    ``interrupted (SIGNAL): <subject> stopped, <which runs were marked>[, <which flow runs>]<tail>``. Neither
    raises: what could not be marked is said in the message."""
    import signal

    def first_line(e: Exception) -> str:
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"

    def on_interrupt(signum: int) -> str:
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "10"
        try:
            ended = kill(since_ms)
            runs = f"MLflow run{'s' * (len(ended) > 1)} {', '.join(ended)} marked KILLED" if ended else \
                "no MLflow run was running"
        except Exception as e:  # noqa: BLE001 - the interrupt is still reported on one line
            runs = f"its MLflow runs could not be marked KILLED ({first_line(e)})"
        try:
            cancelled = cancel(since_ms) if cancel else []
            flows = f", Prefect flow run{'s' * (len(cancelled) > 1)} {', '.join(cancelled)} marked CANCELLED" \
                if cancelled else ""
        except Exception as e:  # noqa: BLE001 - as above
            flows = f", its Prefect flow runs could not be marked CANCELLED ({first_line(e)})"
        return f"interrupted ({signal.Signals(signum).name}): {subject} stopped, {runs}{flows}{tail}"

    return on_interrupt


def _interrupted(cfg):
    """``on_interrupt`` of ``rao run``: the campaign's MLflow runs become KILLED and its Prefect flow runs
    (``rao-campaign`` named ``cfg.name``, ``rao-iteration`` named ``<name>-iter-K``) CANCELLED: those started
    up to 20 s before the signal (it came before the flow's 5 s grace period)."""
    import time

    def mine(run_name: str) -> bool:
        return run_name == cfg.name or run_name.startswith(f"{cfg.name}-iter-")

    return _interrupt_handler(lambda since: kill_campaign_runs(cfg, since), int(time.time() * 1000) - 20_000,
                              f"campaign {cfg.name!r}", "; re-run the same command to resume",
                              cancel=lambda since: cancel_flow_runs(["rao-campaign", "rao-iteration"], since, mine))


def kill_evaluation_runs(cfg, since_ms: int) -> list[str]:
    """Mark KILLED the evaluation runs (tag ``rao.kind = evaluation``) of ``cfg``'s experiment that started at
    or after ``since_ms`` and are RUNNING or were marked FAILED by a crash hook; returns their ids."""
    import mlflow

    from infra.tracking import configure_mlflow

    configure_mlflow(cfg.tracking.tracking_uri)
    exp = mlflow.get_experiment_by_name(cfg.tracking.experiment)
    if exp is None:
        return []
    runs = mlflow.search_runs([exp.experiment_id], output_format="list",
                              filter_string=f"tags.`rao.kind` = 'evaluation' and attributes.start_time >= {since_ms}")
    ended = [r.info.run_id for r in runs if r.info.status in ("RUNNING", "FAILED")]
    for run_id in ended:
        mlflow.MlflowClient().set_terminated(run_id, status="KILLED")
    return ended


COMPARISON_COLUMNS = ("metric", "n", "champion", "candidate", "losses/wins", "drop", "drop_bound", "p", "p_holm",
                      "status")


def comparison_table(out: dict) -> Table:
    """The table ``rao evaluate`` prints from ``rao_evaluate``'s result: per metric n, both rates with their
    Wilson 95% intervals, losses/wins, the drop and its lower bound, p and the decision; the caption names the
    test and says when candidate and champion are one checkpoint."""
    rows = out.get("comparison") or []
    t = Table(title=f"{out['model']} vs champion (v{out['champion']})")
    for c in COMPARISON_COLUMNS:
        t.add_column(c)
    for r in rows:
        t.add_row(*(str(r.get(c, "")) for c in COMPARISON_COLUMNS))
    notes = sorted({r["test"] for r in rows if r.get("test")})
    if out.get("same_checkpoint"):
        notes.append(f"candidate and champion are the same checkpoint ({out['same_checkpoint']})")
    t.caption = "; ".join(notes) or None
    return t


def _evaluation_interrupted(cfg, ref: str, flow_run_prefix: str):
    """``on_interrupt`` of ``rao evaluate``: the evaluation runs it started become KILLED, its ``rao-evaluate``
    flow run (named ``flow_run_prefix`` and its date, ``EvaluateParams.flow_run_name``) CANCELLED."""
    import time

    return _interrupt_handler(lambda since: kill_evaluation_runs(cfg, since), int(time.time() * 1000),
                              f"evaluation of {ref}", cancel=lambda since: cancel_flow_runs(
                                  ["rao-evaluate"], since, lambda run_name: run_name.startswith(flow_run_prefix + "-")))


@contextlib.contextmanager
def _prefect_failures_quiet():
    """Drop Prefect's console report of a failed run (the exception with its traceback, "Finished in state
    Failed"): ``rao_cli.main`` prints the error as one line. ``RAO_DEBUG=1`` keeps them."""
    import logging

    if os.environ.get("RAO_DEBUG"):
        yield
        return

    def keep(record: logging.LogRecord) -> bool:
        return not (record.name.startswith("prefect") and (record.exc_info or record.levelno >= logging.ERROR))

    handlers = [h for h in logging.getLogger().handlers if type(h).__name__ == "PrefectConsoleHandler"]
    for h in handlers:
        h.addFilter(keep)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(keep)


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        config: str = typer.Option("configs/cpu-smoke.yaml", help="Campaign config (YAML)."),
        name: str = typer.Option(None, help="Campaign name (resume key); default from the config."),
        iterations: int = typer.Option(None, help="RL iterations."),
        override: list[str] = typer.Option([], "--set", callback=_key_values,
                                           help="KEY=VALUE config override (repeatable), e.g. algo.G=8."),
        plan: bool = typer.Option(False, "--plan", help="Print the GPU plan (placement, vLLM and trainer commands, "
                                  "memory per GPU, switch time) and start nothing; exit 1 if it cannot fit."),
        gpus: int = typer.Option(None, "--gpus", min=1, help="With --plan: GPUs of the target machine "
                                 "(default: those nvidia-smi sees)."),
        gpu_mem_gib: float = typer.Option(None, "--gpu-mem-gib", min=1, help="With --plan: memory per GPU, GiB."),
    ) -> None:
        """Run (or resume) a RAO campaign: the main job. Defaults: SmolLM2-135M on TextCraft-Synth tier1.

        Ctrl-C or SIGTERM stops it within seconds: its MLflow runs are marked KILLED and its Prefect flow
        runs CANCELLED, every process it started is stopped, one error: line is printed (exit 130 / 143); the
        same command resumes.
        """
        if plan:  # nothing is started: no Prefect, S3, MLflow or vLLM
            from infra.plan import plan_config, run_plan

            # named as written (--iterations, --name), not as the `--set` overrides run_plan makes of them
            params_from_options(_config_fields, name=name, iterations=iterations)
            plan_config(config, list(override))  # a config mistake is named before the missing --gpus
            if gpus is None or gpu_mem_gib is None:  # the target machine: this one's GPUs, else a usage error
                from infra.plan import detect_gpus

                seen = detect_gpus()
                if seen is None:
                    missing = ("--gpus N --gpu-mem-gib M" if gpus is None and gpu_mem_gib is None else
                               "--gpu-mem-gib M" if gpu_mem_gib is None else "--gpus N")
                    raise typer.BadParameter(f"no NVIDIA GPU visible here: give the target machine as {missing}",
                                             param_hint="'--gpus' / '--gpu-mem-gib'")
                gpus, gpu_mem_gib = gpus or seen[0], gpu_mem_gib or seen[1]

            run_plan(config, list(override), name=name, iterations=iterations, gpus=gpus, gpu_mem_gib=gpu_mem_gib)
            return
        if gpus is not None or gpu_mem_gib is not None:  # they describe a target machine, only for the plan
            raise typer.BadParameter("--gpus and --gpu-mem-gib only go with --plan")
        _prefect_env()
        from flows.campaign import CampaignParams, rao_campaign
        from infra.models import ModelError

        params = params_from_options(CampaignParams, config=config, name=name, iterations=iterations,
                                     overrides=list(override))
        cfg = checked_run_inputs(params)  # every input, before any service, flow run or process starts

        done = completed_campaign(cfg)  # complete already: its summary, no Prefect, vLLM or MLflow write
        if done is not None:
            from flows.campaign import already_complete_line

            console.print(already_complete_line(done, cli=True), soft_wrap=True)
            print_summary(done)
            return
        from infra.process import run_interruptible
        from rao_core.train.launch import TrainingProcessError

        import time

        called_at = time.time()
        try:  # Ctrl-C / SIGTERM: MLflow runs KILLED, flow runs CANCELLED, children stopped, one line, 130 / 143
            with _prefect_failures_quiet():  # a failed stage is one error: line (RAO_DEBUG=1: Prefect's report)
                summary = run_interruptible(lambda: rao_campaign(params), _interrupted(cfg))
        except ModelError as e:  # on stderr, like every error (rao_cli.main)
            typer.echo(f"error: {' '.join(str(e).split())}", err=True)
            raise typer.Exit(2) from None
        except TrainingProcessError as e:  # one line: the training child's own error and its last stderr lines
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        returned_at = time.time()
        print_summary(summary, run_timeline(summary, process_start=_process_start(), called_at=called_at,
                                            returned_at=returned_at, make_started_at=_make_started_at())
                      if summary.get("timeline") and not summary.get("already_complete") else None)

    @app.command()
    def evaluate(
        model: str = typer.Option("candidate", help="Alias, version, or models:/ URI of the registered "
                                  "model, or an s3:// checkpoint folder."),
        config: str = typer.Option("configs/cpu-smoke.yaml", help="Config (serving, runtime, storage, eval)."),
        env: list[str] = typer.Option([], help="Environments of the suite (repeatable), each the config's benchmark "
                                      "of that environment (else the standard one); default: the config's whole "
                                      "suite (its training benchmark and eval.benchmarks: TextCraft, Oolong, "
                                      "DeepDive, ART-E by default)."),
        difficulty: list[str] = typer.Option([], help="Difficulties (repeatable): ENV=D for environment ENV's "
                                             "benchmark (e.g. oolong=mixed); a bare D for the one --env given, or "
                                             "without --env for the config's training benchmark; default: each "
                                             "benchmark's own (eval.difficulties for the training one)."),
        n_tasks: int = typer.Option(None, min=1, help="Tasks per difficulty of every benchmark (the paired test's "
                                    "n); default: each benchmark's eval.regression_n_tasks."),
        tolerance: float = typer.Option(None, min=0, help="Allowed drop vs champion: a regression is a drop beyond "
                                        "it at the config's eval.regression_alpha; default: eval.tolerance."),
        campaign: str = typer.Option(None, help="Campaign whose registered model is evaluated (its "
                                     "model.registered_model, e.g. rao-policy-CAMPAIGN), as `rao run --name` "
                                     "named it; default: the config's name."),
    ) -> None:
        """Evaluate a registered checkpoint and test it against the champion (the nightly regression).

        The suite defaults to the config's (its training benchmark and eval.benchmarks: TextCraft, Oolong,
        DeepDive and ART-E by default), each at its eval.regression_n_tasks tasks; the champion is evaluated on
        the same tasks (or its stored outcomes of them are used) and each metric is decided by a one-sided paired
        test of "worse by more than the tolerance" (rao_core.regression), Holm-corrected over the metrics.
        Config, suite and model reference are checked before any service starts; a failure is one `error:` line
        (`RAO_DEBUG=1`: Prefect's log and the traceback). Ctrl-C or SIGTERM stops it within seconds: its MLflow
        run is marked KILLED and its Prefect flow run CANCELLED, every process it started is stopped, one error:
        line is printed (exit 130 / 143).
        """
        _prefect_env()
        from flows.campaign import CampaignParams
        from flows.evaluate import EvaluateParams, NothingCompared, RegressionError, rao_evaluate

        base = params_from_options(CampaignParams, {"name": "--campaign"}, config=config,
                                   name=campaign or "").resolve()
        suite = _suite(base, env, difficulty, n_tasks)
        ref = _registered_model(base, model)
        from infra.process import run_interruptible

        params = EvaluateParams(config=config, model=ref, suite=suite, tolerance=tolerance, campaign=campaign or "")
        try:  # Ctrl-C / SIGTERM: MLflow run KILLED, flow run CANCELLED, children stopped, one line, 130 / 143
            with _checked_s3_checkpoint(base, ref, model), _prefect_failures_quiet():
                out = run_interruptible(lambda: rao_evaluate(params),
                                        _evaluation_interrupted(base, ref, params.flow_run_prefix()))
        except RegressionError as e:
            console.print(f"[red]regression:[/red] {e}", soft_wrap=True)
            raise typer.Exit(1) from None
        except NothingCompared as e:  # it could not catch a regression: not an "ok"
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        console.print(comparison_table(out))

    @app.command()
    def deploy(
        pool: str = typer.Option("rao-pool", help="Prefect work pool (process type) for the deployments."),
    ) -> None:
        """Create the Prefect deployments of prefect.yaml (campaign on demand, nightly evaluation on cron)."""
        _prefect_env()
        from infra.orchestration import check_api, deploy as _deploy, worker_command

        from rao_cli.prefect_hints import prefect_hints_rewritten

        api = check_api(os.environ.get("PREFECT_API_URL"))  # no server or none answering: one error line
        with prefect_hints_rewritten(api):  # Prefect's own hints lack PREFECT_API_URL: the one below is right
            rc = _deploy(pool)
        if rc:
            raise typer.Exit(rc)
        console.print(f"deployments created; start a worker: {worker_command(api, pool)}", soft_wrap=True)
