"""The ``rao-evaluate`` flow: the nightly benchmark regression.

Evaluates a registered model version or alias (default ``candidate``) on a benchmark suite (by default the
config's suite, :func:`default_suite`: its training benchmark and ``eval.benchmarks``, TextCraft, Oolong, DeepDive
and ART-E unless the config says otherwise, each at its ``eval.regression_n_tasks`` tasks per difficulty) and
decides, per ``/success`` metric (``eval/<benchmark>/<mode>/<difficulty>/success``), whether it is worse than the
``champion`` alias by more than the tolerance, by a one-sided paired test on the per-task outcomes of both
(``rao_core.regression``), the metrics' p-values Holm-corrected together (``rao_core.regression.holm_decisions``),
so a candidate within the tolerance on every benchmark fails at most ``eval.regression_alpha`` of nights. The
champion's outcomes come from its stored evaluation of the same tasks, benchmark by benchmark
(:func:`evaluation_key`), or from evaluating it in the same run. A regression fails the flow run with one line per
metric and Prefect artifacts. Each checkpoint is evaluated on the whole suite by one
``tasks.stages.evaluate_checkpoint`` call; tasks are fixed by each benchmark's seed, request seeds follow
``serving.request_seeds``. Docs: docs/pipeline/nightly.md.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from prefect import flow, get_run_logger
from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from flows.forms import FormParams, OptionalFloat, config_value, no_default, plain_description
from rao_core.config import CampaignConfig
from rao_core.evaluation import Benchmark, EvalConfig, Mode, metric_key, named_key
from rao_core.runtime.config import RuntimeConfig
from tasks import tracking
from infra.stage_io import RunContext
from flows.campaign import FLOW_END_HOOKS
from tasks.serve import serve_checkpoint, shutdown_server
from tasks.stages import checkpoint_from_uri, evaluate_checkpoint


class RegressionError(RuntimeError):
    """The evaluated model is worse than the champion beyond the tolerance."""


DEFAULT_CONFIG = "configs/cpu-smoke.yaml"  # the nightly deployment's config (prefect.yaml)


def _default_config_eval() -> dict[str, Any]:
    """``env``, ``difficulties`` and ``modes`` of :data:`DEFAULT_CONFIG`'s own evaluation and its nightly task
    count (``eval.regression_n_tasks``): the defaults of a suite entry, so that an entry added in the Prefect form
    starts from them. The plain ``EvalConfig`` defaults when the file cannot be read (import never fails on it)."""
    try:
        from rao_core.config import load_config
        from rao_core.paths import REPO_ROOT

        cfg = load_config(REPO_ROOT / DEFAULT_CONFIG)
        return {"env": cfg.tasks.env, "difficulties": list(cfg.eval.difficulties),
                "n_tasks": cfg.eval.regression_n_tasks, "modes": list(cfg.eval.modes)}
    except Exception:  # noqa: BLE001 - the form loses its defaults, the flow still runs
        d = EvalConfig()
        from rao_core.regression import DEFAULT_N_TASKS

        return {"env": "textcraft-synth", "difficulties": d.difficulties, "n_tasks": DEFAULT_N_TASKS, "modes": d.modes}


_FORM = _default_config_eval()


class SuiteEntry(Benchmark):
    """One benchmark of the nightly suite: a ``rao_core.evaluation.Benchmark`` (name, environment and its
    options, difficulties, tasks, modes).

    ``difficulties``, ``n_tasks`` and ``modes`` always come from the entry; their defaults (plain values, so
    the Prefect form shows them in a new entry) are those of :data:`DEFAULT_CONFIG`'s ``eval`` section and
    environment, ``n_tasks`` its ``regression_n_tasks``. ``seed``, ``split`` and ``graded`` only when set, else
    from the config's ``eval`` section (so champion and candidate are evaluated on the same tasks):
    :meth:`resolved`. No trees are stored (``stored_trees`` 0, not in the form).
    """

    model_config = ConfigDict(json_schema_extra=plain_description(
        "One benchmark: an environment (and its options), its difficulties, tasks per difficulty and modes (the "
        "evaluation seed, split and grading are the config's unless set)."))

    env: str = Field(_FORM["env"], description="Environment, e.g. textcraft-synth, oolong, deepdive, arte.")
    difficulties: list[str] = Field(_FORM["difficulties"], description="Task difficulties evaluated, each "
                                    "reported separately.")
    n_tasks: int = Field(_FORM["n_tasks"], ge=1, description="Held-out tasks per difficulty (the decision's n; "
                         "the config's eval.regression_n_tasks).")
    modes: list[Mode] = Field(_FORM["modes"], description="'recursive' and/or 'single' (delegation off).")
    stored_trees: SkipJsonSchema[int] = Field(0, ge=0, description="Compact trees kept per row (none: the nightly "
                                              "stores per-task outcomes).")

    def resolved(self, base: CampaignConfig) -> SuiteEntry:
        """This entry with ``seed``, ``split`` and ``graded`` taken from ``base``'s ``eval`` section where the
        entry does not set them."""
        inherit = {f: getattr(base.eval, f) for f in ("seed", "split", "graded") if f not in self.model_fields_set}
        return self.model_copy(update=inherit)


def default_suite(base: CampaignConfig, n_tasks: int | None = None) -> list[SuiteEntry]:
    """The one rule for what a nightly evaluates by default (the deployment with an empty suite, and
    ``rao evaluate`` without ``--env``): config ``base``'s evaluation suite (``CampaignConfig.suite``: its
    training benchmark with the ``eval`` section's difficulties, modes, seed, split and grading, then
    ``eval.benchmarks``, by default the standard suite's other three), each at the nightly's task count
    (``n_tasks`` when given, else its ``regression_n_tasks``, by default ``eval.regression_n_tasks``, sized for
    the decision's power): the campaign's evaluation tasks first (a larger draw of the same stream starts with
    them), and the same tasks for champion and candidate."""
    return [SuiteEntry(name=b.name, env=b.env, env_options=b.env_options, generator_options=b.generator_options,
                       difficulties=list(b.difficulties), n_tasks=n_tasks or b.regression_n_tasks, modes=list(b.modes),
                       seed=b.seed, split=b.split, graded=b.graded) for b in base.suite()]


def champion_suite(base: CampaignConfig, n_tasks: int | None = None) -> SuiteEntry:
    """The training benchmark's entry of :func:`default_suite`: ``tasks.env`` with the ``eval`` section's own
    evaluation at the nightly's task count (the benchmark the champion rule ranks by, unless
    ``eval.primary_benchmark`` names another)."""
    return default_suite(base, n_tasks)[0]


class NothingCompared(RuntimeError):
    """A nightly evaluation with no champion outcome to pair any metric with (no champion, or no task scored
    in both): it cannot catch a regression, so its flow run fails instead of reporting "no regression"."""


class NoRegisteredModel(RuntimeError):
    """The evaluated model is not in the MLflow registry (its campaign has not registered a checkpoint yet):
    one line naming the campaign to run first, with its command."""


_TOLERANCE = config_value("eval.tolerance", DEFAULT_CONFIG)


class EvaluateParams(FormParams):
    """Parameters of ``rao-evaluate`` (a Prefect UI form)."""

    model_config = ConfigDict(json_schema_extra=plain_description(
        "The nightly regression: evaluate a checkpoint and test whether it is worse than the champion by more "
        "than the tolerance."))

    config: str = Field(DEFAULT_CONFIG, description="Campaign config (serving, runtime, storage, eval).")
    model: str = Field("candidate", description="Alias or version of the campaign's registered model, a "
                       "models:/... URI, or an s3:// checkpoint folder (any campaign's).")
    suite: list[SuiteEntry] = Field(default_factory=list, description="Benchmarks to evaluate, each with its own "
                                    "paired test, Holm-corrected together. Empty (the default): the config's "
                                    "suite (its training benchmark and eval.benchmarks: TextCraft, Oolong, "
                                    "DeepDive and ART-E by default), each at its eval.regression_n_tasks tasks "
                                    "per difficulty. A new entry starts from the default config's training "
                                    "benchmark.")
    tolerance: OptionalFloat = Field(None, ge=0, json_schema_extra=no_default, description="Allowed drop of "
                                     "success vs the champion: a regression is a drop beyond it, shown at the "
                                     f"config's eval.regression_alpha. Empty: the config's eval.tolerance "
                                     f"({DEFAULT_CONFIG.rsplit('/', 1)[-1]}: {_TOLERANCE}).")
    name: str = Field("nightly", description="S3 prefix and MLflow run name of the evaluation (the flow run is "
                      "named NAME-MODEL-DATE).")
    # a plain text field (a `str | None` one needs its "None" toggle clicked in the form); empty = None
    campaign: str = Field("", description="Campaign whose registered model is evaluated (its "
                          "model.registered_model); empty: the config's campaign name.")
    fresh_champion: bool = Field(False, description="Evaluate the champion in this run even when it has a stored "
                                 "evaluation of the same tasks (the false-alarm benchmark does).")

    @field_validator("campaign", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return "" if v is None else v

    @model_validator(mode="after")
    def _one_entry_per_name(self) -> EvaluateParams:
        names = [e.name for e in self.suite]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"suite: benchmark {twice[0]!r} is listed twice (its metric keys would collide); give "
                             "one of them another name")
        return self

    def flow_run_prefix(self) -> str:
        """``<name>-<model>``, e.g. ``nightly-candidate``: the start of this evaluation's flow-run name."""
        return f"{self.name}-{self.model}".replace("models:/", "")

    def flow_run_name(self, when: float | None = None) -> str:
        """Prefect flow-run name of this evaluation: ``<name>-<model>-<UTC date and time>``, e.g.
        ``nightly-candidate-2026-12-03-0200``, so every night's run has its own name."""
        return f"{self.flow_run_prefix()}-{time.strftime('%Y-%m-%d-%H%M', time.gmtime(when))}"


def evaluate_run_name() -> str:
    """Prefect flow-run name of an evaluation (:meth:`EvaluateParams.flow_run_name`)."""
    from prefect.runtime import flow_run

    p = flow_run.parameters.get("params") or {}
    return (p if isinstance(p, EvaluateParams) else EvaluateParams.model_validate(p)).flow_run_name()


def evaluation_key(bench: Benchmark, runtime: RuntimeConfig) -> str:
    """What a benchmark's per-task outcomes depend on besides the weights: the environment and its options,
    the tasks (generator options, difficulties, n_tasks, seed, split), modes, grading (``Benchmark.spec``) and
    the runtime; 12 hex digits of its sha256 (for a campaign's training benchmark the key its nightly stored
    before the suite had other benchmarks). A stored evaluation stands in for the champion's only under the same
    key."""
    s = bench.spec()
    what = [s["env"], s["env_options"], s["generator_options"], s["difficulties"], s["n_tasks"], s["seed"], s["split"],
            s["modes"], s["graded"], runtime.model_dump(mode="json")]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


def outcomes_by_metric(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{success metric: {task id: outcome}}`` of an evaluation's table rows (their ``per_task``), each metric
    named by its row's benchmark (``rao_core.evaluation.metric_key``)."""
    return {metric_key(r.get("benchmark", ""), r["mode"], r["difficulty"]): dict(r.get("per_task") or {})
            for r in rows}


def named_outcomes(outcomes: dict[str, Any], bench: Benchmark) -> dict[str, Any]:
    """Stored per-task outcomes of ``bench`` (a champion's, from an earlier night) under this suite's metric names:
    a key written before keys named their benchmark, ``eval/<mode>/<difficulty>/success`` (the config's own
    environment) or ``eval/<env>/<mode>/<difficulty>/success`` (another one), becomes
    ``eval/<benchmark>/<mode>/<difficulty>/success``. The stored set is the one of ``bench``'s key
    (:func:`evaluation_key`), so its metrics are this benchmark's."""
    out = {}
    for k, v in outcomes.items():
        parts = k.split("/")
        if len(parts) == 5 and parts[1] == bench.env and parts[1] != bench.name:
            k = metric_key(bench.name, parts[2], parts[3], parts[4])
        out[named_key(k, bench.name)] = v
    return out


def same_checkpoint(candidate: Any | None, champion: Any | None, ref: str) -> str:
    """What candidate and champion share when they are one checkpoint: ``"v2"`` (one registry version),
    ``"same folder s3://..."`` (two versions, or a folder reference, with one source), else ``""``."""
    if champion is None:
        return ""
    if candidate is not None and candidate.name == champion.name and str(candidate.version) == str(champion.version):
        return f"v{champion.version}"
    source = (candidate.source if candidate is not None else ref).rstrip("/")
    return f"same folder {source}" if source == str(champion.source).rstrip("/") else ""


def _registered(ref: str, name: str, campaign: str, config: str, uri: str) -> Any:
    """The ModelVersion behind ``ref``; :class:`NoRegisteredModel` (one line, with the command to run first)
    when the registry has no such model or version."""
    run_first = (f"run campaign {campaign!r} first: `rao run --config {config} --name {campaign}` (or the "
                 f"campaign deployment with name {campaign} in the Prefect UI), or set `campaign` to one that ran")
    if not tracking.registered_model_exists(name):
        raise NoRegisteredModel(f"error: {name} is not a registered model in MLflow at {uri}: campaign "
                                f"{campaign!r} has not registered a checkpoint yet; {run_first}")
    mv = tracking.model_version(ref)
    if mv is None:
        raise NoRegisteredModel(f"error: {ref} is not in the MLflow registry at {uri} ({name} exists, this alias "
                                f"or version does not); {run_first}")
    return mv


def no_champion_reason(name: str) -> str:
    """Why registered model ``name`` has no ``champion`` alias, in words: not registered, or its versions and
    why none was promoted (no optimizer step, not evaluated: ``tasks.stages.register_checkpoint``'s rules)."""
    if not tracking.registered_model_exists(name):
        return f"{name} is not a registered model (no campaign of it registered a checkpoint)"
    import mlflow

    versions = mlflow.MlflowClient().search_model_versions(f"name = '{name}'")
    if not versions:
        return f"{name} has no version"
    why = []
    for v in sorted(versions, key=lambda v: int(v.version)):
        tags = v.tags or {}
        if tags.get("rao.updated") == "false":
            why.append(f"v{v.version} no optimizer step")
        elif tags.get("rao.evaluated") == "false":
            why.append(f"v{v.version} not evaluated")
        else:
            why.append(f"v{v.version} not promoted")
    return (f"{name} has {len(versions)} version{'s' * (len(versions) > 1)} and none holds the 'champion' alias "
            f"({', '.join(why)}); a campaign promotes a version that made an update and was evaluated")


def _evaluate(ctx: RunContext, ref: str, benchmarks: list[Benchmark]) -> Any:
    """Serve checkpoint ``ref`` and evaluate it on ``benchmarks`` (``tasks.stages.evaluate_checkpoint``: one
    server start or switch for the whole suite)."""
    from tasks.serve import checkpoint_local

    ckpt = checkpoint_from_uri(ctx, ref)
    served = serve_checkpoint(ctx, ckpt)
    return evaluate_checkpoint(ctx, served, str(checkpoint_local(ctx, ckpt)), None, benchmarks)


def _scalars(row: dict[str, Any]) -> dict[str, Any]:
    """A results-table row without its audit fields (per-task outcomes, histograms, trees)."""
    return {k: v for k, v in row.items() if not isinstance(v, (dict, list))}


def decision_note(n_tasks: list[int], tolerance: float, alpha: float, same: str, family: int = 1) -> str:
    """The markdown note of the decision artifact: the rule (with Holm's correction over the ``family`` metrics
    tested when there are several), its power at the evaluated n, the same-checkpoint case."""
    from rao_core.regression import detectable_drop

    power = "; ".join(f"n = {n}: " + (f"a drop of {d:.2f} is caught with 80% power" if (d := detectable_drop(
        n, tolerance=tolerance, alpha=alpha)) is not None else "no drop is caught with 80% power (too few tasks)")
        for n in sorted(set(n_tasks)))
    out = (f"**Rule**: per metric, a one-sided paired test on the per-task outcomes of champion and candidate "
           f"(Tango's score test; McNemar's at tolerance 0) of *the candidate is worse by more than {tolerance:g}* "
           f"at alpha {alpha:g}: a candidate within the tolerance fails at most {alpha:.0%} of nights.")
    if family > 1:
        out += (f" The {family} metrics tested are decided together by Holm's correction (p_holm < {alpha:g}), so a "
                f"candidate within the tolerance on every benchmark still fails at most {alpha:.0%} of nights.")
    out += (f"\n\n**Power**: {power} (two independent evaluations, champion success 0.5: a lower bound; with "
            "several metrics, Holm's correction lowers it).")
    if same:
        out += (f"\n\n**Same checkpoint**: candidate and champion are one checkpoint ({same}): this compares two "
                "evaluations of it, so any difference is evaluation noise.")
    return out


@flow(name="rao-evaluate", log_prints=True, flow_run_name=evaluate_run_name, **FLOW_END_HOOKS)
def rao_evaluate(params: EvaluateParams = EvaluateParams()) -> dict[str, Any]:
    """Evaluate a registered checkpoint on the suite and test whether it is worse than the champion beyond the
    tolerance: the candidate on every benchmark (one server), the champion on those it has no stored outcomes of
    (one more), a paired test per metric, Holm's correction over them."""
    import mlflow

    from flows.campaign import CampaignParams, storage
    from tasks.bookkeeping import mlflow_setup
    from rao_core.regression import decide, holm_decisions

    log = get_run_logger()
    base = CampaignParams(config=params.config, name=params.name).resolve()
    uri, exp_id = mlflow_setup(base)
    campaign = params.campaign or CampaignParams(config=params.config).resolve().name
    name = tracking.registered_model_name(base, campaign)
    ref = params.model
    if not ref.startswith(("models:/", "s3://", "/", ".")):  # an alias or a version of the campaign's model
        ref = f"models:/{name}/{ref}" if ref.isdigit() else f"models:/{name}@{ref}"
    candidate = None
    if ref.startswith("models:/"):  # compared with the champion of the evaluated model
        name = ref.removeprefix("models:/").split("@")[0].split("/")[0]
        try:
            candidate = _registered(ref, name, campaign, params.config, uri)
        except NoRegisteredModel as e:
            log.error(str(e))
            raise
    champ = tracking.alias_version(name, "champion")
    if champ is None:  # nothing to compare with: refused before any server starts or any task is evaluated
        e = NothingCompared(f"{ref}: no champion to compare with: {no_champion_reason(name)}; nothing was evaluated "
                            "(`rao eval` measures a checkpoint without a comparison)")
        log.error(str(e))
        raise e
    tol = params.tolerance if params.tolerance is not None else base.eval.tolerance
    alpha = base.eval.regression_alpha
    same = same_checkpoint(candidate, champ, ref)
    suite = [e.resolved(base) for e in params.suite or default_suite(base)]
    keys = {b.name: evaluation_key(b, base.runtime) for b in suite}
    run_id = mlflow.MlflowClient().create_run(
        exp_id, run_name=f"{params.name}-{time.strftime('%Y%m%d-%H%M%S')}",
        tags={"rao.kind": "evaluation", "rao.model": ref, "rao.benchmarks": ", ".join(keys),
              **tracking.prefect_link_tags(),
              **({"rao.candidate_version": str(candidate.version)} if candidate is not None else {}),
              "rao.champion_version": str(champ.version)}).info.run_id
    if same:
        log.info(f"{ref} and the champion are the same checkpoint ({same}): two evaluations of it are compared")
    log.info(f"{ref}: suite of {len(suite)} benchmark{'s' * (len(suite) > 1)}: "
             + "; ".join(f"{b.name} ({b.env} {', '.join(b.difficulties)}, {b.n_tasks} tasks each, "
                         f"{', '.join(b.modes)})" for b in suite))
    outcomes: dict[str, Any] = {"candidate": {}, "champion": {}, "champion_from": {}}
    with storage(base) as s3:
        ctx = RunContext(config=base, s3=s3.__dict__, mlflow_uri=uri, mlflow_experiment_id=exp_id)
        try:
            res = _evaluate(ctx, ref, suite)
            metrics: dict[str, float] = dict(res.metrics)
            all_rows = [{"env": _row_env(suite, r), "checkpoint": "candidate", **_scalars(r)} for r in res.rows]
            cand = outcomes_by_metric(res.rows)
            outcomes["candidate"] = cand
            stored = [("candidate", keys[b.name]) for b in suite]
            champ_out: dict[str, Any] = {}
            source: dict[str, str] = {}
            todo = []
            for b in suite:  # the champion's stored outcomes of exactly these tasks, benchmark by benchmark
                mine = {m for m in cand if m.split("/")[1] == b.name}
                found = None if params.fresh_champion else tracking.stored_outcomes(champ, keys[b.name])
                named = named_outcomes(found[0], b) if found is not None else {}
                if found is not None and mine <= set(named):
                    champ_out.update({m: named[m] for m in mine})
                    source.update({m: found[1] for m in mine})
                else:
                    todo.append(b)
            if todo:  # no stored evaluation of these tasks: evaluate the champion now, on the same tasks
                cres = _evaluate(ctx, f"models:/{name}/{champ.version}", todo)
                fresh = outcomes_by_metric(cres.rows)
                champ_out.update(fresh)
                source.update({m: "this run" for m in fresh})
                metrics.update({f"champion/{k}": v for k, v in cres.metrics.items() if k.endswith("/success")})
                all_rows += [{"env": _row_env(suite, r), "checkpoint": f"champion v{champ.version}", **_scalars(r)}
                             for r in cres.rows]
                stored += [("champion", keys[b.name]) for b in todo]
        finally:
            shutdown_server()
    decisions = []
    for m in sorted(cand):
        outcomes["champion"][m] = champ_out.get(m)
        outcomes["champion_from"][m] = source.get(m, "")
        decisions.append(decide(m, champ_out.get(m), cand[m], tolerance=tol, alpha=alpha, same_checkpoint=same,
                                champion_from=source.get(m, "")))
    decisions = holm_decisions(decisions)  # several metrics (benchmarks) in one night: one family
    family = sum(1 for d in decisions if d.result is not None)
    note = decision_note([b.n_tasks for b in suite], tol, alpha, same, family)
    rows, bad = tracking.log_evaluation(run_id, params.name, ref, metrics, all_rows, decisions, outcomes, note)
    for role, key in stored:  # the next night pairs with these outcomes instead of evaluating again
        version = candidate if role == "candidate" else champ
        if version is not None:
            tracking.tag_stored_outcomes(version.name, str(version.version), key, run_id, role)
    if bad:
        raise RegressionError(f"{ref} regressed vs champion v{champ.version}"
                              + (f" (the same checkpoint: {same})" if same else "") + ": " + "; ".join(bad))
    compared = [d.metric for d in decisions if d.result is not None]
    if not compared:
        measured = ", ".join(sorted(outcomes["candidate"])) or "none"
        raise NothingCompared(
            f"{ref}: no metric compared with the champion, so no regression could be caught: no task was scored in "
            f"both evaluations of champion v{champ.version}; this evaluation measured {measured}")
    log.info(f"{ref}: no regression vs champion v{champ.version} ({len(compared)} of {len(rows)} metrics compared"
             + (f", Holm over {family}" if family > 1 else "") + (f"; the same checkpoint: {same}" if same else "")
             + ")")
    return {"model": ref, "metrics": metrics, "comparison": rows, "rows": all_rows, "compared": compared,
            "champion": champ.version, "same_checkpoint": same, "outcomes": outcomes, "json": json.dumps(rows)}


def _row_env(suite: list[Benchmark], row: dict[str, Any]) -> str:
    """The environment of the suite's benchmark that ``row`` names ("" when none does)."""
    return next((b.env for b in suite if b.name == row.get("benchmark")), "")
