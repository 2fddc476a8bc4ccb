"""The experiment's results as Prefect tasks: the ``docs/results/<experiment>.json`` record, the
learning-curve plot, the ``docs/results.md`` section and their MLflow copies (``flows/experiment.py`` only
calls :func:`write_results`).

The claimed comparison is the recursive arm's last iteration vs its warm start (iteration 0) on the first
evaluated difficulty, recursive mode: a one-sided pooled two-proportion z-test
(``rao_core.evaluation.two_proportion_test``). Every point keeps the checkpoint folder it evaluated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from rao_core.evaluation import two_proportion_test


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


@task(name="write-experiment-results", cache_policy=NONE)
def write_results(experiment: str, rows: list[dict[str, Any]], meta: dict[str, Any],
                  checkpoints: dict[tuple[str, int], str | None], config: dict[str, Any], run_id: str,
                  write_docs: bool = True, out_root: Path | None = None) -> dict[str, Any]:
    """Write the experiment's record, plot and markdown section; log record and plot to MLflow run ``run_id``.

    ``out_root``: where ``docs/`` goes (the repository with ``write_docs``, else a folder named after the
    campaign). ``docs/results.md`` is rewritten only from this experiment's section title to the next
    ``## `` section, so other experiments' sections are kept; each file is replaced atomically.
    Returns ``{"record", "markdown", "plot"}``.
    """
    from rao_core.jsonl import atomic_path
    from rao_core.paths import REPO_ROOT

    root = out_root or REPO_ROOT
    img_name = "learning_curve.png" if experiment == "textcraft-cpu" else f"{experiment}.png"
    img = learning_curve_png(rows, root / "docs/img" / img_name)
    record = experiment_record(experiment, rows, meta, checkpoints, config)
    rec_path = root / "docs/results" / f"{experiment}.json"
    rec_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(rec_path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2) + "\n")
    md = results_markdown(rows, meta, experiment=experiment, img=img_name, test=record["test"])
    if write_docs:
        doc = root / "docs/results.md"
        old = doc.read_text() if doc.exists() else "# Results\n"
        head, _, rest = old.partition(_section_title(experiment))
        nxt = rest.find("\n## ")  # keep any later sections (other experiments)
        tail = rest[nxt:] if (rest and nxt >= 0) else ""
        with atomic_path(doc) as tmp:
            Path(tmp).write_text(head.rstrip() + "\n\n" + md + tail)
    import mlflow

    from tasks import tracking

    tracking.log_json(run_id, {"rows": rows, "meta": meta}, "experiment/results.json")
    mlflow.MlflowClient().log_artifact(run_id, str(img), "experiment")
    return {"record": record, "markdown": md, "plot": str(img)}
