"""An experiment as units: runs that each finish within one sitting and survive a new machine.

A multi-arm, multi-seed experiment (``research.designs.unit_design``) is a set of units:

- ``warm-<kind>``: one warm start (``recursive``: the recursive and outcome arms'; ``single``: the single agent's
  own, when the design gives it one) built from the config by the project's one warm start
  (``rao_core.warmstart.run_warm_start``, as the campaign's ``warm_start`` stage calls it) and evaluated on the
  experiment's held-out set (iteration 0);
- ``<arm>-seed<S>``: the warm start REBUILT the same way, its weights' sha256 compared with the one the warm-start
  unit's record holds, then one campaign (``flows.campaign.rao_campaign``) of the config's RL iterations with the
  arm's overrides (``research.designs.arm_overrides``) and the seed's, and the evaluation of its last checkpoint.
  When the rebuilt weights differ from the recorded ones (another CPU, another library), or no warm-start record
  exists yet, the unit says so (``warm_start_sha256_matches``: false / null) and evaluates its own warm start too, so
  its comparison stays paired inside the unit; so does an arm whose evaluation (modes, runtime) is not the one its
  warm-start unit made (:func:`eval_signature`: e.g. the single arm of a design that shares the recursive warm
  start);
- in a design with variants (a sweep, ``UnitDesign.variants``), ``<variant>-seed<S>`` instead: the same for its one
  arm with the variant's overrides, every variant from the one warm start.

A design with ``eval_on_training`` evaluates every unit on one set of training-split problems that no unit trains
on (:attr:`UnitPlan.eval_tasks`) instead of the config's held-out set.

Every evaluation is ``infra.checkpoint_eval.serve_and_evaluate`` of the config's ``eval`` section (the tasks, modes
and runtime the campaign evaluates with); the campaign itself runs with ``eval.enabled`` false, so no point is
evaluated twice. A unit starts from nothing but a clone: it clears its own state under ``$RAO_HOME`` (earlier
attempts' campaigns included, on S3 too) and never resumes a half-done attempt. Its record,
``docs/results/units/<experiment>/<unit>.json``, is written once, atomically (a temporary file, then
``os.replace``), when the unit has finished: a killed unit leaves none and runs again from its start.

``status_text`` lists the units: done (a record), to do, the next command, and each unit's time, measured (the
record's) or estimated from the config (:func:`estimate_unit`, :class:`Pace`); a unit whose estimate exceeds
:data:`MAX_UNIT_MIN` minutes is flagged. Docs: docs/experiments.md#units.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rao_core.paths import REPO_ROOT, rao_home
from research.designs import ARM_MODES, UnitDesign, arm_overrides, git_output, unit_design

#: A unit must finish within this many minutes on a quiet 2-core machine (one sitting, with room to spare).
MAX_UNIT_MIN = 100
#: Where the records go, under the repository (``<experiment>/<unit>.json``).
UNITS_DIR = "docs/results/units"
#: A warm-start unit's name is this prefix and its kind (``recursive``, ``single``).
WARM_PREFIX = "warm-"


@dataclass(frozen=True)
class Unit:
    """One unit of an experiment: ``name`` (``warm-<kind>``, ``<arm>-seed<S>`` or, in a design with variants,
    ``<variant>-seed<S>``), its ``warm`` kind (the warm start it builds or starts from), and for an arm unit its
    ``arm``, ``seed`` and ``variant`` (None outside a sweep)."""

    name: str
    warm: str
    arm: str | None = None
    seed: int | None = None
    variant: str | None = None

    @property
    def is_warm_start(self) -> bool:
        """True for a warm-start unit (the warm start and its evaluation)."""
        return self.arm is None

    @property
    def label(self) -> str | None:
        """What the unit's points are labelled with in the seed records: its variant, else its arm."""
        return self.variant or self.arm


@dataclass
class UnitPlan:
    """The units of ``experiment`` from ``config`` with ``overrides`` (``KEY=VALUE``, every unit's) under
    ``design``; ``configs[unit name]`` is each unit's resolved campaign config (an arm unit's: the campaign it runs;
    a warm-start unit's: the config its warm start is built and evaluated with)."""

    experiment: str
    config: str
    overrides: list[str]
    design: UnitDesign
    units: list[Unit]
    configs: dict[str, Any] = field(default_factory=dict)
    default_config: str | None = None  # the command's default --config (left out of the printed commands)
    #: arm unit -> its evaluation (the eval section's tasks and modes, the runtime) is its warm-start unit's, so
    #: that unit's iteration-0 point is this arm's when the weights are the same
    shares_warm_eval: dict[str, bool] = field(default_factory=dict)
    #: the evaluation tasks every unit evaluates (a design with ``eval_on_training``:
    #: ``rao_core.task_sets.evaluation_tasks`` without any unit's training problems); None: each evaluation draws
    #: its config's held-out set (``rao_core.evaluation.eval_tasks``)
    eval_tasks: list[Any] | None = None

    def unit(self, name: str) -> Unit:
        """The unit called ``name``; ValueError naming the known units otherwise."""
        for u in self.units:
            if u.name == name:
                return u
        raise ValueError(f"--unit {name!r}: no such unit of {self.experiment} (units: "
                         f"{', '.join(u.name for u in self.units)})")

    def command(self, unit: str | None = None) -> str:
        """The command that runs ``unit`` (``--status`` without one)."""
        cfg = "" if self.config == self.default_config else f" --config {self.config}"
        sets = "".join(f" --set {o}" for o in self.overrides)
        return f"rao experiment {self.experiment}{cfg}" + (f" --unit {unit}" if unit else " --status") + sets


def warm_kind(design: UnitDesign, arm: str) -> str:
    """The warm-start kind arm ``arm`` starts from: ``single`` for the single arm of a design whose single agent has
    its own warm start, else ``recursive``."""
    return "single" if arm == "single" and design.single_warm_start == "own" else "recursive"


def plan_units(experiment: str, config: str, overrides: list[str] | None = None,
               design: UnitDesign | None = None, default_config: str | None = None) -> UnitPlan:
    """The units of ``experiment`` (warm starts first, then arm x seed in the design's order, or variant x seed for
    a design with variants), each config resolved and the evaluation set checked: the held-out set against the
    training pool and the demonstrations (``rao_core.task_sets.check_task_sets``), or, for a design with
    ``eval_on_training``, drawn from the training split without any unit's training problems
    (``rao_core.task_sets.evaluation_tasks``, :attr:`UnitPlan.eval_tasks`). Raises ConfigError / ValueError (one
    line) before anything runs, e.g. for ``eval_on_training`` with an ``eval.split`` other than ``train`` or with
    units whose evaluations differ."""
    from rao_core.evaluation import EvalConfig
    from rao_core.task_sets import check_task_sets, evaluation_tasks, training_problems

    overrides = list(overrides or [])
    base = _resolve(config, overrides)
    design = design or unit_design(experiment)
    seeds = list(design.seeds) if design.seeds else [base.seed]
    kinds = list(dict.fromkeys(warm_kind(design, a) for a in design.arms))
    units = [Unit(f"{WARM_PREFIX}{k}", k) for k in kinds]
    if design.variants:
        (arm,) = design.arms
        units += [Unit(f"{v}-seed{s}", warm_kind(design, arm), arm, s, v) for v in design.variants for s in seeds]
    else:
        units += [Unit(f"{a}-seed{s}", warm_kind(design, a), a, s) for a in design.arms for s in seeds]
    plan = UnitPlan(experiment, config, overrides, design, units, default_config=default_config)
    for u in units:
        plan.configs[u.name] = _resolve(config, unit_overrides(plan, u, checkpoint=None))
    for u in units:
        if not u.is_warm_start:
            plan.shares_warm_eval[u.name] = (eval_signature(plan.configs[u.name])
                                             == eval_signature(plan.configs[f"{WARM_PREFIX}{u.warm}"]))
    if not design.eval_on_training:
        check_task_sets(plan.configs[units[-1].name])
        return plan
    first = plan.configs[units[0].name]
    if first.eval.split != "train":
        raise ValueError(f"{experiment}: the design evaluates training-split problems (eval_on_training) but "
                         f"eval.split is {first.eval.split!r}; set eval.split: train")
    fields = set(EvalConfig.model_fields)
    for u in units:
        if plan.configs[u.name].eval.model_dump(include=fields) != first.eval.model_dump(include=fields):
            raise ValueError(f"{experiment}: unit {u.name}'s eval section differs from unit {units[0].name}'s; a "
                             "design that evaluates training-split problems evaluates every unit on one set")
    skip = set().union(*(training_problems(plan.configs[u.name]) for u in units))
    plan.eval_tasks = evaluation_tasks(first, skip)
    return plan


def eval_signature(cfg: Any) -> str:
    """What an evaluation point of ``cfg`` depends on besides the weights: its ``eval`` section's
    ``rao_core.evaluation.EvalConfig`` fields (tasks, seed, modes), the environment and task generator, and the
    runtime; as canonical JSON."""
    from rao_core.evaluation import EvalConfig

    ev = {k: getattr(cfg.eval, k) for k in EvalConfig.model_fields}
    return json.dumps({"eval": ev, "runtime": cfg.runtime.model_dump(mode="json"), "env": cfg.tasks.env,
                       "env_options": cfg.tasks.env_options, "generator": cfg.tasks.generator_options},
                      sort_keys=True, default=str)


def _resolve(config: str, overrides: list[str]) -> Any:
    from flows.campaign import CampaignParams

    return CampaignParams(config=config, overrides=overrides).resolve()


def _warm_arm(design: UnitDesign, kind: str) -> str:
    """The first arm of the design that starts from warm start ``kind`` (its overrides build it)."""
    return next(a for a in design.arms if warm_kind(design, a) == kind)


def warm_overrides(plan: UnitPlan, kind: str) -> list[str]:
    """Overrides of the config the ``kind`` warm start is built and evaluated with: the first arm of that kind's
    (its runtime and evaluation mode), the config's seed (every seed starts from this one warm start), for an own
    single-agent warm start its demonstrations without delegation, and the design's recipe for that kind."""
    base = _resolve(plan.config, plan.overrides)
    arm = _warm_arm(plan.design, kind)
    extra = arm_overrides(arm, plan.overrides, base.model.registered_model, None, base.runtime.whole_tree_steps)
    if kind == "single":
        extra += ["warm_start.options.single_agent_fraction=1.0"]
    return extra + ["warm_start.mode=demos"] + list(plan.design.warm_overrides.get(kind, ()))


def unit_overrides(plan: UnitPlan, unit: Unit, checkpoint: str | None) -> list[str]:
    """Overrides of ``unit``'s config: a warm-start unit's :func:`warm_overrides`; an arm unit's campaign: the arm's
    (``research.designs.arm_overrides``) from warm-start folder ``checkpoint`` (None: planning, the warm start's
    recipe kept), then its variant's (``UnitDesign.variants``, after the command's and the arm's), the seed's (task
    stream, sampling, trainer), no evaluation inside the campaign (the unit evaluates) and the newest checkpoint
    kept locally."""
    if unit.is_warm_start:
        return warm_overrides(plan, unit.warm)
    base = _resolve(plan.config, plan.overrides)
    extra = arm_overrides(unit.arm, plan.overrides, base.model.registered_model, checkpoint,
                          base.runtime.whole_tree_steps)
    extra += list(plan.design.variants[unit.variant]) if unit.variant else []
    return extra + [f"seed={unit.seed}", f"trainer.seed={unit.seed}", "eval.enabled=false",
                    "checkpoints.local_copies=latest"]


# ---------------------------------------------------------------------------------------------- records


def record_path(experiment: str, unit: str, root: Path | None = None) -> Path:
    """``<root>/docs/results/units/<experiment>/<unit>.json`` (root: the repository)."""
    return (root or REPO_ROOT) / UNITS_DIR / experiment / f"{unit}.json"


def read_record(experiment: str, unit: str, root: Path | None = None) -> dict[str, Any] | None:
    """The unit's record, None when there is none. Raises ValueError naming the file when it is not JSON."""
    p = record_path(experiment, unit, root)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not a JSON record: {e}") from None


def write_record(path: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` to ``path`` atomically: a temporary file in the same folder (owner-only), flushed to disk,
    then ``os.replace``; a process killed before the replace leaves no record (only, at worst, the temporary
    file, which the next write replaces). Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record, indent=1, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def weights_sha256(folder: str | Path) -> str:
    """sha256 (hex) of a checkpoint folder's weights: its ``model.safetensors``; a sharded checkpoint's
    ``*.safetensors`` files hashed in name order as one stream. Raises FileNotFoundError when it has none."""
    folder = Path(folder)
    files = [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else sorted(
        folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no model.safetensors")
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def machine() -> dict[str, Any]:
    """What a rebuild's weights may depend on: CPU model, cores, torch and transformers versions."""
    import torch
    import transformers

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


# ---------------------------------------------------------------------------------------------- running


def build_warm_start(cfg: Any, out_dir: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Build ``cfg``'s warm start (``warm_start.mode`` demos) into ``out_dir``: the call the campaign's
    ``warm_start`` stage makes (``rao_core.warmstart.run_warm_start`` with ``campaign_demo_config(cfg)``,
    ``warm_start.trainer`` and ``runtime``). Returns its stats, SFT steps and the two stages' seconds."""
    import rao_core.warmstart
    from rao_core.envs import get_env
    from rao_core.task_sets import campaign_demo_config

    env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
    res = rao_core.warmstart.run_warm_start(env, cfg.model.path, out_dir, demo_config=campaign_demo_config(cfg),
                                            trainer_config=cfg.warm_start.trainer, runtime_config=cfg.runtime,
                                            on_status=lambda line: say(f"warm start: {line}"))
    return {"stats": json.loads(json.dumps(res.stats, default=str)), "sft_steps": len(res.train_metrics),
            "demo_s": round(res.demo_wall_s, 1), "sft_s": round(res.sft_wall_s, 1)}


def evaluate_checkpoints(cfg: Any, checkpoints: list[tuple[int, Path]], say: Callable[[str], None] = print,
                         control: str | None = None, tasks: list[Any] | None = None
                         ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Evaluate each ``(iteration, folder)`` on ``cfg``'s held-out set (its ``eval`` section: difficulties,
    n_tasks, seed, split, modes), or on ``tasks`` when given (:attr:`UnitPlan.eval_tasks`, in the eval section's
    modes), with its runtime, each checkpoint served once
    (``infra.checkpoint_eval.serve_and_evaluate``); with ``control`` (a difficulty), the last checkpoint also on
    that difficulty's tasks with ``runtime.max_depth`` 1 (the depth-limited control; its points say ``control``:
    true). Returns the points (``research.studies.study_point`` of each row, with ``iteration``,
    ``checkpoint_sha256``, ``control`` and ``per_task``: task id -> outcome) and the seconds per iteration's
    evaluation (``evaluate_it<I>_s``)."""
    from infra.checkpoint_eval import EvalJob, serve_and_evaluate
    from rao_core.envs import get_env
    from rao_core.evaluation import EvalConfig
    from research.studies import study_point

    env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
    ev = EvalConfig(**{k: getattr(cfg.eval, k) for k in EvalConfig.model_fields})
    points: list[dict[str, Any]] = []
    times: dict[str, float] = {}
    for it, folder in checkpoints:
        t0 = time.monotonic()
        sha = weights_sha256(folder)
        jobs = [EvalJob(label=f"iteration {it}", config=ev, runtime=cfg.runtime, tasks=tasks)]
        if control and (it, folder) == checkpoints[-1]:
            jobs.append(EvalJob(label=f"iteration {it}, depth-limited control (runtime.max_depth 1)",
                                config=ev.model_copy(update={"difficulties": [control]}),
                                runtime=cfg.runtime.model_copy(update={"max_depth": 1})))
        for job, report in zip(jobs, serve_and_evaluate(cfg, folder, jobs, env=env, say=say)):
            for row in report.rows:
                trees = [t for t in report.trees if t.meta.get("difficulty") == row.difficulty
                         and t.meta.get("mode", row.mode) == row.mode]
                points.append(study_point(row, trees, iteration=it, checkpoint_sha256=sha,
                                          control=job is not jobs[0]))
        times[f"evaluate_it{it}_s"] = round(time.monotonic() - t0, 1)
    return points, times


def clear_unit_state(plan: UnitPlan, unit: Unit, cfg: Any, say: Callable[[str], None] = print) -> Path:
    """Remove what earlier attempts of ``unit`` left: its work folder ``$RAO_HOME/units/<experiment>/<unit>`` and
    its campaigns (``<experiment>-<unit>-<stamp>``: the local folders, and their objects on the campaign's S3
    store). Returns the (new, empty) work folder."""
    work = rao_home() / "units" / plan.experiment / unit.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    local = rao_home() / "campaigns"
    old = sorted(p for p in local.glob(f"{plan.experiment}-{unit.name}-*") if p.is_dir()) if local.is_dir() else []
    if old:
        say(f"unit {unit.name}: removing {len(old)} earlier attempt(s): {', '.join(p.name for p in old)}")
        from flows.campaign import storage
        from infra.storage import ArtifactStore

        with storage(cfg) as s3:
            for p in old:
                store = ArtifactStore(s3, p.name)
                for key in store.list():
                    store.delete(key)
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
    return work


def run_unit(plan: UnitPlan, name: str, *, root: Path | None = None, say: Callable[[str], None] = print
             ) -> dict[str, Any]:
    """Run unit ``name`` of ``plan`` from its start and write its record (:func:`record_path`, atomically, at the
    end); returns the record. Raises ValueError for an unknown unit (before anything runs); whatever a stage
    raises propagates and no record is written."""
    from flows.campaign import rao_campaign
    from rao_core.train.checkpoint import is_checkpoint
    from research.experiment import _training

    unit = plan.unit(name)
    t_start = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    commit = git_output("rev-parse", "HEAD")
    dirty = git_output("status", "--porcelain", "--untracked-files=no")
    warm_cfg = _resolve(plan.config, warm_overrides(plan, unit.warm))
    work = clear_unit_state(plan, unit, warm_cfg, say)
    stages: dict[str, float] = {}
    # 1. the warm start, rebuilt from the config
    say(f"unit {unit.name}: building the {unit.warm} warm start (demonstrations, SFT) in {work / 'warm-start'}")
    t0 = time.monotonic()
    folder = work / "warm-start"
    ws = build_warm_start(warm_cfg, folder, say)
    stages["warm_start_s"] = round(time.monotonic() - t0, 1)
    sha = weights_sha256(folder)
    base_sha = weights_sha256(warm_cfg.model.path)
    rec: dict[str, Any] = {
        "experiment": plan.experiment, "unit": unit.name, "kind": "warm_start" if unit.is_warm_start else "arm",
        "arm": unit.arm, "seed": unit.seed, "variant": unit.variant,
        "variant_overrides": list(plan.design.variants.get(unit.variant, ())) if unit.variant else None,
        "warm_start_kind": unit.warm, "command": plan.command(unit.name),
        "config": plan.config, "overrides": plan.overrides, "commit": commit or "unknown",
        "dirty": None if dirty is None else bool(dirty), "started": started, "machine": machine(),
        "eval_on_training": plan.design.eval_on_training,
        "warm_start": {**ws, "sha256": sha, "base_model": str(warm_cfg.model.path), "base_model_sha256": base_sha}}
    say(f"unit {unit.name}: warm start sha256 {sha}")
    if unit.is_warm_start:
        rec["started_from_sha256"] = base_sha
        points, times = evaluate_checkpoints(warm_cfg, [(0, folder)], say, tasks=plan.eval_tasks)
        stages.update(times)
        rec["config_values"] = warm_cfg.model_dump(mode="json")
        rec["points"] = points
    else:
        ref = read_record(plan.experiment, f"{WARM_PREFIX}{unit.warm}", root)
        ref_sha = (ref or {}).get("warm_start", {}).get("sha256")
        matches = None if ref_sha is None else ref_sha == sha
        rec.update(started_from_sha256=sha, warm_start_reference_sha256=ref_sha, warm_start_sha256_matches=matches,
                   warm_start_reference=str(record_path(plan.experiment, f"{WARM_PREFIX}{unit.warm}", REPO_ROOT)
                                            .relative_to(REPO_ROOT)))
        if matches is False:
            say(f"unit {unit.name}: the rebuilt warm start DIFFERS from the warm-start unit's record (sha256 {sha} vs "
                f"{ref_sha}); going on with the rebuilt one, evaluated inside this unit")
        elif matches is None:
            say(f"unit {unit.name}: no warm-start record ({rec['warm_start_reference']}); the rebuilt warm start is "
                "evaluated inside this unit")
        # a new campaign per attempt (a stamp and 4 random hex digits): nothing of an earlier one is resumed
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime()) + secrets.token_hex(2)
        campaign = f"{plan.experiment}-{unit.name}-{stamp}"
        overrides = unit_overrides(plan, unit, str(folder))
        cfg = _resolve(plan.config, [*overrides, f"name={campaign}"])
        rec["campaign"] = campaign
        rec["config_values"] = cfg.model_dump(mode="json")
        rec["warm_start"]["config_values"] = warm_cfg.model_dump(mode="json")  # the config it was rebuilt with
        t0 = time.monotonic()
        from flows.campaign import CampaignParams

        summary = rao_campaign(CampaignParams(config=plan.config, name=campaign, overrides=overrides))
        stages["campaign_s"] = round(time.monotonic() - t0, 1)
        its = summary.get("iterations") or []
        if not its:
            raise RuntimeError(f"unit {unit.name}: campaign {campaign} ran no iteration (config iterations "
                               f"{cfg.iterations}); nothing to evaluate")
        last = its[-1]
        if not last.get("checkpoint_local") or not is_checkpoint(last["checkpoint_local"]):
            raise RuntimeError(f"unit {unit.name}: campaign {campaign}'s last checkpoint (iteration "
                               f"{last['iteration']}) is not on this machine ({last.get('checkpoint_local')}); "
                               "checkpoints.local_copies latest keeps it")
        shared = bool(matches and plan.shares_warm_eval.get(unit.name))
        rec["iteration_0_from"] = rec["warm_start_reference"] if shared else "this unit"
        todo = [] if shared else [(0, folder)]
        todo.append((last["iteration"], Path(last["checkpoint_local"])))
        control = plan.design.control_difficulty if unit.arm in plan.design.depth_control else None
        points, times = evaluate_checkpoints(cfg, todo, say, control=control, tasks=plan.eval_tasks)
        stages.update(times)
        rec["points"] = points
        rec["training"] = _training(unit.arm, summary)
        rec["campaign_timeline"] = summary.get("timeline")
        rec["iterations"] = last["iteration"]
        rec["last_checkpoint_sha256"] = weights_sha256(last["checkpoint_local"])
        rec["guard"] = summary.get("guard")
    stages["total_s"] = round(time.monotonic() - t_start, 1)
    rec["stages"] = stages
    rec["wall_s"] = stages["total_s"]
    rec["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    rec["complete"] = True
    path = write_record(record_path(plan.experiment, unit.name, root), rec)
    say(f"unit {unit.name}: done in {rec['wall_s'] / 60:.1f} min; record {path} (commit it: git add {path})")
    return rec


# ---------------------------------------------------------------------------------------------- reading


def seed_records(plan: UnitPlan, root: Path | None = None) -> list[dict[str, Any]]:
    """The experiment's records per seed, in the form ``research.experiment.write_seeds_section`` reads (the form
    ``rao experiment`` writes: ``experiment``, ``seed``, ``points`` with ``arm`` (in a design with variants: the
    variant's name), ``iteration``, ``difficulty``, ``mode``, ``per_task``; ``endpoint``, ``config_values``),
    assembled from the finished units' records: each arm
    unit's points, and as its iteration 0 the unit's own evaluation of its warm start (its rebuild differed) or else
    the warm-start unit's (the same weights). Depth-limited control points are left out. Seeds without any finished
    arm unit are left out; an empty list when none has one. Raises ValueError naming a record that is not JSON."""
    base = _resolve(plan.config, plan.overrides)
    out = []
    seeds = sorted({u.seed for u in plan.units if not u.is_warm_start})
    for seed in seeds:
        points: list[dict[str, Any]] = []
        units: dict[str, Any] = {}
        for u in plan.units:
            if u.seed != seed or not (rec := read_record(plan.experiment, u.name, root)) or not rec.get("complete"):
                continue
            own = [p for p in rec.get("points", []) if not p.get("control")]
            if not any(p["iteration"] == 0 for p in own):
                warm = read_record(plan.experiment, f"{WARM_PREFIX}{u.warm}", root) or {}
                own = [p for p in warm.get("points", []) if not p.get("control")] + own
            points += [{**p, "arm": u.label, "unit": u.name} for p in own]
            units[u.label] = {"unit": u.name, "commit": rec.get("commit"), "wall_s": rec.get("wall_s"),
                              "warm_start_sha256_matches": rec.get("warm_start_sha256_matches")}
        if not units:
            continue
        cfg = plan.configs[next(u.name for u in plan.units if u.seed == seed)]
        name = plan.experiment if seed == base.seed else f"{plan.experiment}-seed{seed}"
        out.append({"experiment": name, "seed": seed, "arms": list(units), "units": units, "points": points,
                    "config": plan.config, "eval_seed": cfg.eval.seed,
                    "endpoint": cfg.eval.endpoint.model_dump(mode="json") if cfg.eval.endpoint else None,
                    "config_values": cfg.model_dump(mode="json")})
    return out


def control_records(plan: UnitPlan, records: list[dict[str, Any]], root: Path | None = None
                    ) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each of :func:`seed_records`' ``records`` with its depth-limited control in the form of a
    ``rao experiment depth-control`` record (``research.studies.depth_control_rows`` reads it): the recursive unit's
    control points (``control``: true) and, as their ``reference``, the same unit's full-depth point on the same
    difficulty and iteration; None for a seed whose unit has no control points."""
    out = []
    for rec in records:
        unit = (rec.get("units") or {}).get("recursive", {}).get("unit")
        urec = read_record(plan.experiment, unit, root) if unit else None
        ctrl = [p for p in (urec or {}).get("points", []) if p.get("control")]
        full = {(p["iteration"], p["difficulty"]): p for p in (urec or {}).get("points", []) if not p.get("control")}
        ref = {str(p["iteration"]): full[(p["iteration"], p["difficulty"])] for p in ctrl
               if (p["iteration"], p["difficulty"]) in full}
        out.append((rec, {"experiment": f"{rec['experiment']}-control", "unit": unit, "points": ctrl,
                          "reference": ref} if ctrl else None))
    return out


# ---------------------------------------------------------------------------------------------- status


@dataclass(frozen=True)
class Pace:
    """The stage times an estimate is built from, seconds, measured on the quiet 2-core machine (textcraft-deeper's
    seed-0 recursive arm and probe, textcraft-nested's warm start: docs/experiments/textcraft-deeper.md "Expected
    time"); midpoints of the measured ranges."""

    vllm_start_s: float = 160.0  # a vLLM start: 127-193 s
    eval_tree_s: float = 7.5  # an evaluation point of 200 trees: 18.5-31.5 min, 25 min / 200
    rollout_tree_s: float = 4.0  # an iteration's 48 rollout trees: 141-238 s, 190 s / 48
    train_pass_s: float = 283.0  # one pass over an iteration's samples (there: one optimizer step): 90-476 s; more
    #                              minibatches split the same pass into more steps (their extra optimizer updates,
    #                              not measured, are left out)
    iteration_other_s: float = 82.0  # judge, validate, reload, register, log: an iteration's 7.5-11 min (555 s)
    #                                   less its generation and step
    sft_demo_epoch_s: float = 16.0  # SFT per demonstration and epoch: textcraft-nested 635 s for 20 x 2
    single_tree_factor: float = 1.5  # a single-agent tree vs a recursive one: probe 50.4 s vs 33.6 s per tree
    fixed_s: float = 120.0  # start-up, S3 and MLflow, uploads, the record


PACE = Pace()


def _trees_per_point(cfg: Any) -> int:
    return cfg.eval.n_tasks * len(cfg.eval.difficulties) * len(cfg.eval.modes)


def estimate_unit(plan: UnitPlan, unit: Unit, pace: Pace = PACE) -> dict[str, float]:
    """The estimated seconds of ``unit`` from its config and ``pace``: ``warm_start`` (demonstrations x epochs x
    ``sft_demo_epoch_s``), ``campaign`` (a vLLM start, then per iteration its rollout trees x ``rollout_tree_s``,
    its passes over the batch (``trainer.epochs``, however many minibatches each) x ``train_pass_s`` and
    ``iteration_other_s``), ``evaluate`` (a vLLM start and the point's
    trees x ``eval_tree_s``; a unit with the depth-limited control: its trees too), ``fixed``; tree times x
    ``single_tree_factor`` where the trees are a single agent's.
    ``total``: the expected time (an arm unit whose rebuilt warm start matches the record: one evaluation point,
    two where its evaluation is not its warm-start unit's); ``total_if_differs``: when it evaluates its own warm
    start too."""
    cfg = plan.configs[unit.name]
    warm = plan.configs[f"{WARM_PREFIX}{unit.warm}"]
    single = (unit.arm or _warm_arm(plan.design, unit.warm)) == "single" or ARM_MODES.get(unit.arm or "") == "single"
    f = pace.single_tree_factor if single else 1.0
    sft = warm.warm_start.n_tasks * warm.warm_start.trainer.epochs * pace.sft_demo_epoch_s
    point = pace.vllm_start_s + _trees_per_point(cfg) * pace.eval_tree_s * f
    out = {"warm_start": sft, "fixed": pace.fixed_s}
    if unit.is_warm_start:
        out["evaluate"] = point
        out["total"] = out["total_if_differs"] = sft + pace.fixed_s + point
        return out
    per_it = (cfg.tasks.tasks_per_iteration * cfg.algo.G * pace.rollout_tree_s * f
              + cfg.trainer.epochs * pace.train_pass_s + pace.iteration_other_s)
    out["campaign"] = pace.vllm_start_s + cfg.iterations * per_it
    control = (cfg.eval.n_tasks * len(cfg.eval.modes) * pace.eval_tree_s * f
               if unit.arm in plan.design.depth_control else 0.0)
    out["evaluate"] = point + control
    out["total"] = sft + pace.fixed_s + out["campaign"] + point + control
    if not plan.shares_warm_eval.get(unit.name):  # its own iteration-0 point in any case
        out["evaluate"] += point
        out["total"] += point
    out["total_if_differs"] = out["total"] + (point if plan.shares_warm_eval.get(unit.name) else 0.0)
    return out


def _git_tracked(path: Path) -> bool | None:
    try:
        rel = path.resolve().relative_to(REPO_ROOT)
    except ValueError:
        return None
    out = git_output("ls-files", "--error-unmatch", str(rel))
    return out is not None


def unit_rows(plan: UnitPlan, root: Path | None = None, pace: Pace = PACE) -> list[dict[str, Any]]:
    """One row per unit: ``unit``, ``done`` (a record exists), ``committed`` (git tracks it; None outside the
    repository), ``minutes`` (the record's wall time when done, else the estimate), ``measured``,
    ``minutes_if_differs`` (an arm unit's estimate when its rebuilt warm start differs), ``over`` (the time exceeds
    :data:`MAX_UNIT_MIN`) and, when done, ``matches`` (the record's ``warm_start_sha256_matches``)."""
    rows = []
    for u in plan.units:
        rec = read_record(plan.experiment, u.name, root)
        est = estimate_unit(plan, u, pace)
        done = bool(rec and rec.get("complete"))
        minutes = rec["wall_s"] / 60 if done else est["total"] / 60
        rows.append({"unit": u.name, "done": done, "measured": done, "minutes": minutes,
                     "minutes_if_differs": est["total_if_differs"] / 60, "estimate": est,
                     "committed": _git_tracked(record_path(plan.experiment, u.name, root)) if done else None,
                     "matches": (rec or {}).get("warm_start_sha256_matches") if done else None,
                     "over": minutes > MAX_UNIT_MIN})
    return rows


def status_text(plan: UnitPlan, root: Path | None = None, pace: Pace = PACE) -> str:
    """``rao experiment NAME --status``: the units, which are done (a record under
    ``docs/results/units/<experiment>/``) and which remain, each unit's measured or estimated minutes (units over
    :data:`MAX_UNIT_MIN` flagged ``OVER``), the next command and how the estimate is made; for a design with
    variants, each variant's overrides, and for one with ``eval_on_training``, its evaluation set."""
    rows = unit_rows(plan, root, pace)
    any_cfg = plan.configs[plan.units[-1].name]
    n_warm = sum(u.is_warm_start for u in plan.units)
    kind = "variant x seed" if plan.design.variants else "arm x seed"
    lines = [f"{plan.experiment}: {len(plan.units)} units ({n_warm} warm start(s) with their evaluation, "
             f"{len(plan.units) - n_warm} {kind}), config {plan.config}, {any_cfg.iterations} RL iteration(s) per "
             f"arm unit; records in {UNITS_DIR}/{plan.experiment}/"]
    if plan.design.variants:
        (arm,) = plan.design.arms
        lines.append(f"variants (each the {arm} arm from warm-{warm_kind(plan.design, arm)}, with these overrides):")
        lines += [f"  {v:<16} {' '.join(o)}" for v, o in plan.design.variants.items()]
    if plan.eval_tasks is not None:
        ev = plan.configs[plan.units[0].name].eval
        lines.append(f"evaluation set: {len(plan.eval_tasks)} problems of the training split (eval.seed {ev.seed}, "
                     f"{', '.join(ev.difficulties)}, {', '.join(ev.modes)} mode), none of them in any unit's RL task "
                     "pool or demonstrations")
    lines += ["", f"{'unit':<18} {'state':<26} {'minutes':>8}  {'if the warm start differs':>26}"]
    for r in rows:
        if r["done"]:
            state = "done" + ("" if r["committed"] is not False else " (record not committed)")
            if r["matches"] is False:
                state += ", warm start differs"
            mins = f"{r['minutes']:.0f} meas."
        else:
            state, mins = "to do", f"{r['minutes']:.0f} est."
        differs = "" if r["unit"].startswith(WARM_PREFIX) or r["done"] else f"{r['minutes_if_differs']:.0f} est."
        flag = f"  OVER {MAX_UNIT_MIN} min" if r["over"] else ""
        if not r["done"] and not r["unit"].startswith(WARM_PREFIX) and r["minutes_if_differs"] > MAX_UNIT_MIN:
            flag += f"  (over {MAX_UNIT_MIN} min if its warm start differs)"
        lines.append(f"{r['unit']:<18} {state:<26} {mins:>8}  {differs:>26}{flag}")
    todo = [r["unit"] for r in rows if not r["done"]]
    done = len(rows) - len(todo)
    lines.append("")
    lines.append(f"done: {done} of {len(rows)}" + (f"; to do: {', '.join(todo)}" if todo else "; every unit is done"))
    if todo:
        lines.append(f"next: {plan.command(todo[0])}")
    uncommitted = [r["unit"] for r in rows if r["done"] and r["committed"] is False]
    if uncommitted:
        lines.append("commit: git add " + " ".join(str(record_path(plan.experiment, u).relative_to(REPO_ROOT))
                                                   for u in uncommitted))
    over = [r["unit"] for r in rows if r["over"]]
    lines.append(f"units over {MAX_UNIT_MIN} min: {', '.join(over)}" if over else
                 f"every unit's time is within {MAX_UNIT_MIN} min")
    p = pace
    lines += ["", "Estimates (a unit not yet run) from the config and stage times measured on the quiet 2-core machine "
              "(research.units.Pace): warm start = demonstrations x SFT epochs x "
              f"{p.sft_demo_epoch_s:.0f} s; an RL iteration = tasks x G rollout trees x {p.rollout_tree_s:.1f} s + "
              f"passes over the batch (trainer.epochs, however many minibatches) x {p.train_pass_s:.0f} s + "
              f"{p.iteration_other_s:.0f} s; an evaluation point = a vLLM "
              f"start ({p.vllm_start_s:.0f} s) + trees x {p.eval_tree_s:.1f} s (the depth-limited control's trees "
              f"too where the unit runs it); tree times x "
              f"{p.single_tree_factor} for a single agent; + {p.fixed_s:.0f} s. An arm unit evaluates its last "
              "checkpoint; when its rebuilt warm start differs from the warm-start unit's record it evaluates that "
              "warm start too (the last column). Measured: the record's wall time."]
    return "\n".join(lines)
