"""The ``rao-experiment`` flow: the learning-curve experiment of ``docs/results.md``.

Runs two campaigns from one config with the same budget and the same context window: the recursive
agent (delegation on) and the single-agent baseline (``runtime.delegation = false``). Both start from
ONE warm-start checkpoint: the first arm builds it (SFT on a demonstration set that mixes recursive and
single-agent trees, ``warm_start.options.single_agent_fraction``), the second arm starts from that
checkpoint (``warm_start.mode = checkpoint``), so the arms differ only in whether delegation is
available during RL and evaluation. Each evaluates after the warm start and after every iteration on
the same held-out validation tasks. The flow then writes a table (success by difficulty vs iteration,
recursive vs single, Wilson 95% intervals, mean depth, delegation rate, wall time per iteration) and a
learning-curve plot to ``docs/results.md`` / ``docs/img/`` and to an MLflow run, and a machine-readable
record ``docs/results/<experiment>.json`` (every evaluated point with its checkpoint folder, and the
claimed comparison: the recursive arm's last iteration vs its warm start, one-sided two-proportion z-test,
:func:`two_proportion_test`).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from pydantic import BaseModel, Field

from flows.campaign import CampaignParams, rao_campaign


def two_proportion_test(s1: float, n1: int, s2: float, n2: int) -> dict[str, float]:
    """Pooled two-proportion z-test of H1: p2 > p1 (e.g. 1 = warm start, 2 = last iteration).

    Args: successes and trials of each sample (successes may be fractional for graded scores).
    Returns ``{"z", "p_value"}`` (one-sided, upper tail) and ``"p_value_two_sided"``; z = 0 and p = 1 (0.5
    one-sided) when the pooled variance is 0 (both rates 0 or both 1). Raises ValueError for n < 1.
    """
    if n1 < 1 or n2 < 1:
        raise ValueError(f"two_proportion_test needs n >= 1, got {n1} and {n2}")
    import math

    p1, p2 = s1 / n1, s2 / n2
    pool = (s1 + s2) / (n1 + n2)
    var = pool * (1 - pool) * (1 / n1 + 1 / n2)
    if var <= 0:
        return {"z": 0.0, "p_value": 0.5, "p_value_two_sided": 1.0}
    z = (p2 - p1) / math.sqrt(var)
    upper = 0.5 * math.erfc(z / math.sqrt(2))
    return {"z": z, "p_value": upper, "p_value_two_sided": min(1.0, 2 * min(upper, 1 - upper))}


def experiment_record(experiment: str, rows: list[dict[str, Any]], meta: dict[str, Any],
                      checkpoints: dict[tuple[str, int], str | None], config: dict[str, Any]) -> dict[str, Any]:
    """The ``docs/results/<experiment>.json`` record: points, and the test of the recursive arm's last
    iteration vs its warm start on the first evaluated difficulty (recursive mode)."""
    from rao_core.paths import REPO_ROOT

    def rel(path: str | None) -> str | None:
        if not path:
            return None
        p = Path(path).resolve()
        return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p)

    points = [{"arm": r["arm"], "iteration": r["iteration"], "difficulty": r["difficulty"], "mode": r["mode"],
               "n": r["n"], "successes": r["successes"], "success": r["success"], "ci95": r.get("ci95"),
               "mean_depth": r.get("mean_depth"), "delegation_rate": r.get("delegation_rate"),
               "checkpoint": rel(checkpoints.get((r["arm"], r["iteration"])))} for r in rows]
    test: dict[str, Any] = {}
    rec = [p for p in points if p["arm"] == "recursive" and p["mode"] == "recursive"]
    if rec:
        diff = rec[0]["difficulty"]
        rec = [p for p in rec if p["difficulty"] == diff]
        base = min(rec, key=lambda p: p["iteration"])
        last = max(rec, key=lambda p: p["iteration"])
        t = two_proportion_test(base["successes"], base["n"], last["successes"], last["n"])
        test = {"arm": "recursive", "difficulty": diff, "mode": "recursive", "baseline_iteration": base["iteration"],
                "final_iteration": last["iteration"], "baseline": [base["successes"], base["n"]],
                "final": [last["successes"], last["n"]], "difference": last["success"] - base["success"],
                "test": "pooled two-proportion z-test, one-sided (final > baseline)", **t}
    return {"experiment": experiment, "command": meta["command"], "config": meta["config"], "seed": meta["seed"],
            "commit": meta["commit"], "date": meta["date"], "wall_s": round(meta["wall_s"], 1),
            "config_values": config, "points": points, "test": test}


class ExperimentParams(BaseModel):
    """Parameters of the experiment (a Prefect UI form)."""

    experiment: str = Field("textcraft-cpu", pattern=r"^[a-z0-9][a-z0-9-]*$",
                            description="Experiment name: docs/results/<experiment>.json, docs/img/<experiment>.png.")
    config: str = Field("configs/experiment-textcraft-cpu.yaml", description="Campaign config of both arms.")
    name: str | None = Field(None, description="Prefix of the two campaign names (default: the config's name).")
    iterations: int | None = Field(None, ge=0, description="RL iterations per arm.")
    arms: list[Literal["recursive", "single"]] = Field(default_factory=lambda: ["recursive", "single"],
                                                       description="Arms to run; the first builds the warm start.")
    write_docs: bool = Field(True, description="Write docs/results.md and docs/img/learning_curve.png.")
    overrides: list[str] = Field(default_factory=list, description="KEY=VALUE overrides for both arms.")


def arm_overrides(arm: str, overrides: list[str], registered_model: str, shared_checkpoint: str | None
                  ) -> list[str]:
    """Config overrides (``KEY=VALUE``) of one arm, after the user's ``overrides``.

    ``single``: delegation off, single-mode evaluation, its own registered model (the arm's campaign name
    fills ``{campaign}``; a fixed name gets ``-single``), so its champion never moves the recursive agent's.
    ``recursive``: recursive-mode evaluation. With ``shared_checkpoint`` (the first arm's iteration-0
    folder) the arm starts from it instead of building its own warm start. Raises ValueError for another
    arm name.
    """
    extra = list(overrides)
    if arm == "single":
        extra += ["runtime.delegation=false", "eval.modes=[single]"]
        extra += [] if "{campaign}" in registered_model else [f"model.registered_model={registered_model}-single"]
    elif arm == "recursive":
        extra += ["eval.modes=[recursive]"]
    else:
        raise ValueError(f"unknown arm {arm!r} (expected 'recursive' or 'single')")
    if shared_checkpoint:
        extra += ["warm_start.mode=checkpoint", f"warm_start.checkpoint={shared_checkpoint}"]
    return extra


def _rows(arm: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for row in summary.get("base_eval", []):
        out.append({"arm": arm, "iteration": 0, **row})
    for it in summary["iterations"]:
        wall = sum(v for k, v in it["times"].items())
        for row in it["eval_rows"]:
            out.append({"arm": arm, "iteration": it["iteration"], "iteration_wall_s": round(wall, 1), **row})
    return out


def learning_curve_png(rows: list[dict[str, Any]], path: Path) -> Path:
    """Success vs iteration, one line per (arm, eval mode, difficulty), with Wilson 95% bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    series: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["arm"], r["mode"], r["difficulty"]), []).append(r)
    for (arm, mode, diff), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["iteration"])
        lo_hi = [tuple(float(x) for x in r["ci95"].strip("[]").split(",")) for r in rs]
        ys = [r["success"] for r in rs]
        err = [[y - lo for y, (lo, _) in zip(ys, lo_hi)], [hi - y for y, (_, hi) in zip(ys, lo_hi)]]
        ax.errorbar([r["iteration"] for r in rs], ys, yerr=err, marker="o", capsize=3,
                    linestyle="-" if arm == "recursive" else "--", label=f"{arm} agent / eval {mode} / {diff}")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration (0 = warm start)")
    ax.set_ylabel("validation success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _section_title(experiment: str) -> str:
    if experiment == "textcraft-cpu":
        return "## Learning curve: recursive vs single agent (TextCraft-Synth, CPU)"
    return f"## Learning curve: {experiment}"


def results_markdown(rows: list[dict[str, Any]], meta: dict[str, Any], experiment: str = "textcraft-cpu",
                     img: str = "learning_curve.png", test: dict[str, Any] | None = None) -> str:
    """The results section of docs/results.md for ``experiment``."""
    lines = [
        _section_title(experiment), "",
        f"Command: `{meta['command']}`  ", f"Config: `{meta['config']}` (seed {meta['seed']}), commit `{meta['commit']}`, "
        f"run on {meta['date']}, total wall time {meta['wall_s'] / 60:.1f} min.  ",
        f"Validation: {meta['n_tasks']} held-out tasks per difficulty (targets never seen in training); success with "
        "Wilson 95% intervals.", "", f"![learning curve](img/{img})", "",
        "| arm | iteration | eval mode | difficulty | n | success | 95% CI | mean depth | delegation rate | iteration wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['iteration']} | {r['mode']} | {r['difficulty']} | {r['n']} | {r['success']:.2f} | "
                     f"{r['ci95']} | {r['mean_depth']} | {r.get('delegation_rate', '')} | {r.get('iteration_wall_s', '')} |")
    if test:
        lines += ["", f"Test ({test['test']}): recursive arm, {test['difficulty']}, iteration {test['final_iteration']} "
                  f"({test['final'][0]:g}/{test['final'][1]}) vs iteration {test['baseline_iteration']} "
                  f"({test['baseline'][0]:g}/{test['baseline'][1]}): difference {test['difference']:+.3f}, "
                  f"z = {test['z']:.2f}, p = {test['p_value']:.4f} (two-sided {test['p_value_two_sided']:.4f}). "
                  f"Record: `docs/results/{experiment}.json`."]
    return "\n".join(lines) + "\n"


def experiment_run_name() -> str:
    """Prefect flow-run name of an experiment: ``<name prefix or experiment>``, e.g. ``textcraft-tier1`` (the
    arms' campaign runs are ``<prefix>-recursive`` and ``<prefix>-single``); was a random name."""
    from prefect.runtime import flow_run

    p = flow_run.parameters.get("params") or {}
    p = p if isinstance(p, ExperimentParams) else ExperimentParams.model_validate(p)
    return p.name or p.experiment


@flow(name="rao-experiment", log_prints=True, flow_run_name=experiment_run_name)
def rao_experiment(params: ExperimentParams = ExperimentParams()) -> dict[str, Any]:
    """Run both arms and write the learning-curve table and plot."""
    log = get_run_logger()
    t0 = time.monotonic()
    # the commit the run STARTED from (files may change on disk while a long run goes on)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    base = CampaignParams(config=params.config, iterations=params.iterations, overrides=params.overrides).resolve()
    prefix = params.name or base.name
    rows: list[dict[str, Any]] = []
    summaries = {}
    checkpoints: dict[tuple[str, int], str | None] = {}
    shared_ckpt: str | None = None
    for arm in params.arms:
        extra = arm_overrides(arm, params.overrides, base.model.registered_model, shared_ckpt)
        summaries[arm] = rao_campaign(CampaignParams(config=params.config, name=f"{prefix}-{arm}",
                                                     iterations=params.iterations, overrides=extra))
        rows += _rows(arm, summaries[arm])
        checkpoints[(arm, 0)] = summaries[arm].get("warm_start", {}).get("checkpoint_local")
        for it in summaries[arm]["iterations"]:
            checkpoints[(arm, it["iteration"])] = it.get("checkpoint_local")
        shared_ckpt = shared_ckpt or summaries[arm].get("warm_start", {}).get("checkpoint_local")
        log.info(f"arm {arm} done")
    wall = time.monotonic() - t0
    sets = "".join(f" --set {o}" for o in params.overrides)
    iters = f" --iterations {params.iterations}" if params.iterations is not None else ""
    meta = {"command": f"rao experiment {params.experiment} --config {params.config}{iters}{sets}",
            "config": params.config,
            "seed": base.seed, "commit": commit or "unknown", "date": time.strftime("%Y-%m-%d"), "wall_s": wall,
            "n_tasks": base.eval.n_tasks}
    from rao_core.paths import REPO_ROOT

    out_root = REPO_ROOT if params.write_docs else Path(base.name)
    img_name = "learning_curve.png" if params.experiment == "textcraft-cpu" else f"{params.experiment}.png"
    img = learning_curve_png(rows, out_root / "docs/img" / img_name)
    record = experiment_record(params.experiment, rows, meta, checkpoints, base.model_dump(mode="json"))
    from rao_core.jsonl import atomic_path

    rec_path = out_root / "docs/results" / f"{params.experiment}.json"
    rec_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(rec_path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2) + "\n")
    md = results_markdown(rows, meta, experiment=params.experiment, img=img_name, test=record["test"])
    if params.write_docs:
        doc = REPO_ROOT / "docs/results.md"
        old = doc.read_text() if doc.exists() else "# Results\n"
        marker = _section_title(params.experiment)
        head, _, rest = old.partition(marker)
        nxt = rest.find("\n## ")  # keep any later sections (other experiments)
        tail = rest[nxt:] if (rest and nxt >= 0) else ""
        doc.write_text(head.rstrip() + "\n\n" + md + tail)
    import mlflow

    from tasks import tracking

    run_id = summaries[params.arms[0]]["mlflow_run_id"]
    tracking.log_json(run_id, {"rows": rows, "meta": meta}, "experiment/results.json")
    mlflow.MlflowClient().log_artifact(run_id, str(img), "experiment")
    return {"rows": rows, "meta": meta, "markdown": md, "summaries": json.loads(json.dumps(summaries, default=str))}
