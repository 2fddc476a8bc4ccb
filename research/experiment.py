"""The ``rao-experiment`` flow: the learning-curve experiment of ``docs/results.md``, and its seeds section.

Runs one campaign per arm (``research.designs.arm_overrides``) from one config with the same budget and the
same context window, all starting from ONE warm-start checkpoint (the first arm builds it; an arm with its own
warm start is the one exception), each evaluated after the warm start and after every iteration on the same
held-out validation tasks, checked before any campaign starts to share no task with the training pool or
the demonstrations (``rao_core.task_sets.check_task_sets``). The record, plot and docs section are written by
the task ``research.records.write_results``; :func:`write_seeds_section` pools the records of several seeds.
Docs: docs/experiments.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from pydantic import BaseModel, Field, field_validator

from flows.campaign import CampaignParams, rao_campaign
from rao_core.config import NAME_PATTERN
from rao_core.paths import REPO_ROOT
from rao_core.task_sets import check_task_sets
from rao_core.train.checkpoint import is_checkpoint
from research.designs import arm_overrides, git_output
from research.records import (comparisons_markdown, deep_config, depth_seeds_markdown, iteration_stats,
                              preregistered_endpoints, primary_verdict, replace_section, seeds_markdown,
                              verdict_markdown, write_results)
from research.studies import control_records, depth_control_pooled, depth_control_seeds_markdown
from tasks.serve import STOP_SERVER_HOOKS


class ExperimentParams(BaseModel):
    """Parameters of the experiment (a Prefect UI form)."""

    experiment: str = Field("textcraft-cpu", pattern=NAME_PATTERN,
                            description="Experiment name: docs/results/<experiment>.json, docs/img/<experiment>.png.")
    config: str = Field("configs/experiment-textcraft-cpu.yaml", description="Campaign config of both arms.")
    # a plain text field (a `str | None` one needs its "None" toggle clicked in the form); empty = None
    name: str = Field("", pattern=r"^([a-z0-9][a-z0-9-]*)?$",  # empty or NAME_PATTERN
                      description="Name of this run, for a variant of an experiment (e.g. `textcraft-tier1-async` "
                      "with `algo.max_staleness=1`): its record `docs/results/<name>[-seed<S>].json`, its docs "
                      "sections and plot, and its campaigns `<name>[-seed<S>]-<arm>`, so it overwrites neither "
                      "the experiment's record nor its campaigns. Empty: the experiment's record and the "
                      "config's campaign name.")
    iterations: int | None = Field(None, ge=0, description="RL iterations per arm.")
    arms: list[Literal["recursive", "outcome", "single"]] = Field(
        default_factory=lambda: ["recursive", "single"],
        description="Arms to run, in order (arm_overrides): recursive (RAO), outcome (the outcome-only ablation) "
        "and single (the single agent). The first builds the warm start the others share (single: unless "
        "single_warm_start is 'own').")
    single_warm_start: Literal["shared", "own"] = Field(
        "shared", description="shared: the single arm starts from the first arm's warm start; own: it builds its "
        "own from single-agent demonstrations (warm_start.options.single_agent_fraction = 1), as many as the "
        "recursive arm's, with the same SFT settings.")
    write_docs: bool = Field(True, description="Write docs/results.md and docs/img/learning_curve.png.")
    overrides: list[str] = Field(default_factory=list, description="KEY=VALUE overrides for both arms.")
    seed: int | None = Field(None, description="Seed of the whole run (task pool and sampling: `seed`; the "
                             "demonstrations; the RL and SFT trainers: `trainer.seed`, `warm_start.trainer.seed`). "
                             "None = the config's. Another seed than the config's runs as campaigns "
                             "`<prefix>-seed<S>-<arm>` with the record `docs/results/<experiment>-seed<S>.json`; "
                             "the held-out evaluation tasks (`eval.seed`) stay the same for every seed.")
    single_checkpoint: str = Field("", description="The single arm's warm-start checkpoint (a folder, an "
                                   "s3:// checkpoint folder or a registered model URI), e.g. one chosen on a "
                                   "training-split probe and shared by every seed; empty: single_warm_start decides.")
    single_max_steps: int | None = Field(None, ge=1, description="Steps of the single-agent arm's node; None = "
                                         "runtime.max_steps_per_node x (1 + runtime.max_children_per_node), "
                                         "no fewer than a whole recursive tree may take.")

    @field_validator("name", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return "" if v is None else v

    def seeded_name(self, base_seed: int) -> str:
        """The record's name: ``name`` (or, empty, ``experiment``), with ``-seed<S>`` for a seed other than
        ``base_seed``."""
        base = self.name or self.experiment
        return base if self.seed is None or self.seed == base_seed else f"{base}-seed{self.seed}"

    def seed_overrides(self) -> list[str]:
        """``KEY=VALUE`` overrides that set every seed of a campaign to ``seed`` (none when it is None)."""
        if self.seed is None:
            return []
        return [f"seed={self.seed}", f"trainer.seed={self.seed}", f"warm_start.trainer.seed={self.seed}"]


def _rows(arm: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The evaluation rows of one arm's campaign ``summary`` (iteration 0 = the warm start), with ``arm``,
    ``iteration`` and, after an RL iteration, its wall time (``iteration_wall_s``: the sum of its stages' times;
    under asynchronous RL the stages of two iterations overlap, so this is the iteration's work, more than the
    elapsed time: the campaign's ``step k`` timeline rows have that); the stored trees are left out
    (:func:`_trees`)."""
    out = []
    for row in summary.get("base_eval", []):
        out.append({"arm": arm, "iteration": 0, **{k: v for k, v in row.items() if k != "trees"}})
    for it in summary["iterations"]:
        wall = sum(v for k, v in it["times"].items())
        for row in it["eval_rows"]:
            out.append({"arm": arm, "iteration": it["iteration"], "iteration_wall_s": round(wall, 1),
                        **{k: v for k, v in row.items() if k != "trees"}})
    return out


def _trees(arm: str, summary: dict[str, Any]) -> dict[tuple[str, int, str, str], list[Any]]:
    """The stored evaluation trees of one arm's campaign ``summary``, ``{(arm, iteration, difficulty, mode):
    trees}`` (rows without trees are left out)."""
    evals = [(0, summary.get("base_eval", []))] + [(it["iteration"], it["eval_rows"]) for it in summary["iterations"]]
    return {(arm, i, r["difficulty"], r["mode"]): r["trees"] for i, rows in evals for r in rows if r.get("trees")}


def _training(arm: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per RL iteration of one arm's campaign ``summary``: ``arm``, ``iteration`` and
    ``research.records.iteration_stats`` of the metrics the iteration logged."""
    return [{"arm": arm, "iteration": it["iteration"], **iteration_stats(it.get("metrics") or {})}
            for it in summary["iterations"]]


def shared_warm_start(warm_start: dict[str, Any]) -> str | None:
    """The next arm's warm start from the first arm's campaign summary ``warm_start`` section: its iteration-0
    folder while that folder is a checkpoint on this machine, else its S3 copy (``checkpoint_uri``: the
    campaign was run on another machine, which kept the folder), else the folder's path as recorded."""
    local, uri = warm_start.get("checkpoint_local"), warm_start.get("checkpoint_uri")
    return local if local and is_checkpoint(local) else uri or local


def experiment_run_name() -> str:
    """Prefect flow-run name of an experiment: ``<name prefix or experiment>``, e.g. ``textcraft-tier1`` (the
    arms' campaign runs are ``<prefix>-recursive`` and ``<prefix>-single``); was a random name."""
    from prefect.runtime import flow_run

    p = flow_run.parameters.get("params") or {}
    p = p if isinstance(p, ExperimentParams) else ExperimentParams.model_validate(p)
    return p.name or p.experiment


@flow(name="rao-experiment", log_prints=True, flow_run_name=experiment_run_name, **STOP_SERVER_HOOKS)
def rao_experiment(params: ExperimentParams = ExperimentParams()) -> dict[str, Any]:
    """Run both arms and write the learning-curve table and plot."""
    log = get_run_logger()
    t0 = time.monotonic()
    # the commit the run STARTED from (files may change on disk while a long run goes on)
    commit = git_output("rev-parse", "--short", "HEAD")
    # the config's own commit (the endpoint is preregistered when it was committed before the run) and
    # whether the file had uncommitted changes when the run started (None: not in a git repository)
    config_commit = git_output("log", "-1", "--format=%h", "--", params.config) or None
    status = git_output("status", "--porcelain", "--", params.config)
    config_dirty = None if status is None else bool(status)
    overrides = params.seed_overrides() + list(params.overrides)
    cfg0 = CampaignParams(config=params.config, iterations=params.iterations, overrides=params.overrides).resolve()
    base = CampaignParams(config=params.config, iterations=params.iterations, overrides=overrides).resolve()
    experiment = params.seeded_name(cfg0.seed)
    task_sets = check_task_sets(base)  # ValueError naming the overlap: no campaign starts
    # campaigns <name or the config's name>[-seed<S>]-<arm>: a named run or another seed never resumes another's
    prefix = (params.name or base.name) + ("" if experiment == (params.name or params.experiment)
                                           else f"-seed{base.seed}")
    single_steps = params.single_max_steps or base.runtime.whole_tree_steps
    rows: list[dict[str, Any]] = []
    training: list[dict[str, Any]] = []
    trees: dict[tuple[str, int, str, str], list[Any]] = {}
    summaries = {}
    checkpoints: dict[tuple[str, int], str | None] = {}
    shared_ckpt: str | None = None
    for arm in params.arms:
        own = arm == "single" and params.single_warm_start == "own"
        extra = arm_overrides(arm, overrides, base.model.registered_model, None if own else shared_ckpt, single_steps)
        extra += ["warm_start.options.single_agent_fraction=1.0"] if own else []
        if arm == "single" and params.single_checkpoint:  # one single-agent warm start shared by every seed
            extra += ["warm_start.mode=checkpoint", f"warm_start.checkpoint={params.single_checkpoint}"]
        summaries[arm] = rao_campaign(CampaignParams(config=params.config, name=f"{prefix}-{arm}",
                                                     iterations=params.iterations, overrides=extra))
        log.info(f"arm {arm}: campaign {prefix}-{arm} finished")
        rows += _rows(arm, summaries[arm])
        training += _training(arm, summaries[arm])
        trees.update(_trees(arm, summaries[arm]))
        checkpoints[(arm, 0)] = summaries[arm].get("warm_start", {}).get("checkpoint_local")
        for it in summaries[arm]["iterations"]:
            checkpoints[(arm, it["iteration"])] = it.get("checkpoint_local")
        if not own:
            shared_ckpt = shared_ckpt or shared_warm_start(summaries[arm].get("warm_start") or {})
    wall = time.monotonic() - t0
    sets = "".join(f" --set {o}" for o in params.overrides)
    iters = f" --iterations {params.iterations}" if params.iterations is not None else ""
    seed = f" --seed {params.seed}" if params.seed is not None else ""
    arms = "".join(f" --arm {a}" for a in params.arms) if params.arms != ["recursive", "single"] else ""
    arms += " --single-warm-start own" if params.single_warm_start == "own" and "single" in params.arms else ""
    arms += f" --name {params.name}" if params.name else ""
    arms += f" --single-checkpoint {params.single_checkpoint}" if params.single_checkpoint else ""
    meta = {"command": f"rao experiment {params.experiment} --config {params.config}{iters}{seed}{arms}{sets}",
            "config": params.config,
            "seed": base.seed, "commit": commit or "unknown", "date": time.strftime("%Y-%m-%d"), "wall_s": wall,
            "n_tasks": base.eval.n_tasks, "single_max_steps": single_steps if "single" in params.arms else None,
            "arms": list(params.arms), "eval_seed": base.eval.seed,
            "dev_seed": base.eval.dev.seed if base.eval.dev else None, "config_commit": config_commit,
            "config_dirty": config_dirty,
            "endpoint": base.eval.endpoint.model_dump(mode="json") if base.eval.endpoint else None,
            "task_sets": task_sets,
            "warm_start": {a: {k: v for k, v in (summaries[a].get("warm_start") or {}).items()
                               if k in ("mode", "stats", "sft_steps", "demo_s", "sft_s")} for a in params.arms}}
    out = write_results(experiment, rows, meta, checkpoints, base.model_dump(mode="json"),
                        summaries[params.arms[0]]["mlflow_run_id"], write_docs=params.write_docs,
                        out_root=None if params.write_docs else Path(base.name), training=training, trees=trees)
    md = out["markdown"]
    return {"rows": rows, "meta": meta, "markdown": md, "record": out["record"], "summaries": json.loads(json.dumps(summaries, default=str))}


def write_seeds_section(experiment: str, records: list[dict[str, Any]], write_docs: bool = True,
                        root: Path | None = None,
                        controls: list[tuple[dict[str, Any], dict[str, Any] | None]] | None = None) -> str:
    """``comparisons_markdown`` of ``records`` (``seeds_markdown`` for records without per-task outcomes), and for
    deep trees the per-depth table and each seed's depth-limited control (:mod:`research.studies`), written as the
    ``## Seeds: <experiment>`` section of ``docs/results.md`` under ``root`` (the repository by default) when
    ``write_docs``; returns the markdown. With co-primary endpoints (``eval.co_primary``) also the preregistered
    verdict (``research.records.primary_verdict``), and its record ``docs/results/<experiment>-verdict.json``
    (with the depth-limited control pooled over seeds, ``research.studies.depth_control_pooled``). ``controls``:
    each record with its control record (``research.studies.control_records``; None: read from ``root``)."""
    with_tasks = any(p.get("per_task") for r in records for p in r.get("points", []))
    md = comparisons_markdown(experiment, records) if with_tasks else seeds_markdown(experiment, records)
    endpoints = preregistered_endpoints(records)
    verdict = primary_verdict(records, endpoints) if with_tasks and len(endpoints) > 1 else None
    if verdict:
        md += "\n" + verdict_markdown(verdict)
    # read once for the table and the verdict's record; given: e.g. an experiment run as units (research.units)
    controls = control_records(records, root) if controls is None else controls
    if any(deep_config(r.get("config_values")) for r in records):
        md += "\n" + depth_seeds_markdown(records)
        if ctrl := depth_control_seeds_markdown(records, controls=controls):
            md += "\n" + ctrl
    if write_docs:
        root = root or REPO_ROOT
        replace_section(root / "docs/results.md", f"## Seeds: {experiment}", md)
        if verdict:
            verdict |= {"experiment": experiment, "seeds": sorted(r.get("seed") for r in records),
                        "records": [f"docs/results/{r['experiment']}.json" for r in records],
                        "control": depth_control_pooled(records, controls=controls)}
            (root / "docs/results" / f"{experiment}-verdict.json").write_text(json.dumps(verdict, indent=1) + "\n")
    return md
