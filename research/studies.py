"""Checkpoint studies (generalisation by K, wall-clock one tree at a time, the depth-limited control). Each
study runs all its jobs of a checkpoint against one server (``infra.checkpoint_eval.serve_and_evaluate``, the
path ``rao eval`` takes too), so every checkpoint is served once.

- depth-limited control (:func:`plan_depth_control`): a ``textcraft-nested`` record's checkpoints on its own
  ``nest2`` tasks at ``runtime.max_depth: 1``, paired by task with the record's full-depth trees;
- generalisation (:func:`plan_generalisation`): an ablation's last checkpoints on ``tier1x<K>``, K = 2..5. Project
  choice: trees at once and the tree limit scale with K (:func:`trees_at_once`, :func:`tree_limit`);
- wall-clock (:func:`plan_wallclock`): ``gather`` / ``sequential`` / ``single`` per K. Departures from the paper
  (GPUs, up to 2.5x faster from parallel children): the policy decides whether it gathers, one CPU server decodes
  every sequence, requests are unseeded (a task's trees are not paired across settings).

Records ``docs/results/<study>.json`` are written after each evaluation; an interrupted study resumes from its
record (:func:`run_study`). Docs: docs/experiments/checkpoint-studies.md, docs/experiments/textcraft-nested.md.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.checkpoint_eval import EvalJob, serve_and_evaluate, serving_config
from rao_core.envs.base import Task
from rao_core.evaluation import MISS_CAUSES, EvalConfig, EvalReport, EvalRow
from rao_core.runtime import RuntimeConfig
from rao_core.task_sets import check_task_sets
from research.designs import ARM_MODES, arm_overrides, git_output
from research.records import depth_reach, paired_sign_test, replace_section, save_figure, write_tree_sample

GENERALISATION = "textcraft-generalisation"
WALLCLOCK = "textcraft-wallclock"
DEFAULT_RECORD = "docs/results/textcraft-ablation.json"
GENERALISATION_KS = (2, 3, 4, 5)
WALLCLOCK_KS = (2, 3, 4, 6)
WALLCLOCK_SETTINGS = ("gather", "sequential", "single")
#: The wall-clock study's tree limit, seconds: a tree alone on the server is timed, never cut (the RL runs'
#: 300 s were sized for 16 trees at once).
WALLCLOCK_TREE_TIMEOUT_S = 1800.0
#: Trees kept per wall-clock point (the study is about time; the generalisation keeps the config's).
WALLCLOCK_STORED_TREES = 4
DEPTH_CONTROL = "textcraft-nested-control"
DEFAULT_NESTED_RECORD = "docs/results/textcraft-nested.json"
DEPTH_CONTROL_TITLE = f"## Depth-limited control: `{DEPTH_CONTROL}"  # + "`" or "-seed<S>`"
GENERALISATION_TITLE = f"## Generalisation: `{GENERALISATION}"  # + "`" or "-seed<S>`"
WALLCLOCK_TITLE = "## Wall-clock, one tree at a time"  # + ": `<record name>`"
MISS_LABELS = {"child_two_targets": "child given 2+ targets", "child_failed": "children failed",
               "window": "root's window", "limit": "limit", "error": "error", "finished_wrong": "root finished wrong",
               "other": "other"}


# -- records (pure) ---------------------------------------------------------------------------------------
def study_point(row: EvalRow, trees: Sequence[Any] = (), **labels: Any) -> dict[str, Any]:
    """One record point from an evaluation row: ``labels`` (e.g. arm, k, setting, checkpoint) then the row's
    ``table_row`` fields without its stored trees, with ``ci95`` as ``[low, high]`` (4 decimals), the tree
    wall median and mean to 0.01 s, and, from ``trees`` (the row's execution trees), ``per_task_wall_s`` and
    ``per_task_tokens`` ({task id: seconds / completion tokens}) so medians and paired ratios can be recomputed."""
    row_d = {k: v for k, v in row.table_row().items() if k != "trees"}
    row_d.update(ci95=[round(row.ci_low, 4), round(row.ci_high, 4)], tree_wall_s=round(row.mean_tree_wall_s, 2),
                 tree_wall_s_median=round(row.median_tree_wall_s, 2))
    extra = {}
    if trees:
        extra = {"per_task_wall_s": {t.task_id: round(t.wall_s, 2) for t in trees},
                 "per_task_tokens": {t.task_id: sum(x.num_completion_tokens for x in t.nodes) for t in trees}}
    return {**labels, **row_d, **extra}


def study_name(base: str, source: dict[str, Any]) -> str:
    """``base`` with the source record's seed suffix: ``textcraft-generalisation`` for
    ``textcraft-ablation``, ``textcraft-generalisation-seed1`` for ``textcraft-ablation-seed1``."""
    exp = str(source.get("experiment") or "")
    tail = exp.rpartition("-seed")[2] if "-seed" in exp else ""
    return f"{base}-seed{tail}" if tail.isdigit() else base


def control_name(source: dict[str, Any]) -> str:
    """Name of the depth-limited control of an experiment record: ``<experiment>-control`` with the record's seed
    suffix (``textcraft-nested-control`` for ``textcraft-nested``, ``textcraft-deeper-control-seed2`` for
    ``textcraft-deeper-seed2``); :data:`DEPTH_CONTROL` when the record names no experiment."""
    exp = str(source.get("experiment") or "")
    base = exp.rpartition("-seed")[0] if exp.rpartition("-seed")[2].isdigit() else exp
    return study_name(f"{base}-control" if base else DEPTH_CONTROL, source)


def last_checkpoints(record: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """``{arm: (checkpoint folder, iteration)}`` of each arm's last evaluated iteration in an experiment
    record (points in the arm's own mode, ``research.designs.ARM_MODES``; points without a checkpoint are
    skipped)."""
    out: dict[str, tuple[str, int]] = {}
    for p in record.get("points", []):
        arm = p.get("arm")
        if not p.get("checkpoint") or p.get("mode") != ARM_MODES.get(arm, arm):
            continue
        if arm not in out or int(p["iteration"]) > out[arm][1]:
            out[arm] = (p["checkpoint"], int(p["iteration"]))
    return out


def trees_at_once(k: int, base_trees: int, base_k: int = 2) -> int:
    """Trees grown at once for ``tier1x<k>`` so that about as many nodes (a root and its k children) run at once
    as ``base_trees`` trees of ``tier1x<base_k>``: ``max(1, base_trees * (1 + base_k) // (1 + k))`` (16 at K = 2
    gives 12, 9, 8 at K = 3, 4, 5)."""
    return max(1, base_trees * (1 + base_k) // (1 + k))


def tree_limit(k: int, base_limit_s: float | None, base_k: int = 2) -> float | None:
    """The tree wall-clock limit for ``tier1x<k>``: ``base_limit_s * (1 + k) / (1 + base_k)``, the nodes of a
    K-target tree over those of the trained shape's (300 s at K = 2 gives 400, 500, 600 s at K = 3, 4, 5;
    None stays None). A policy that runs its children one after another needs about K child-times, and the
    K = 2 limit already cut some of those trees: a fixed limit would count slowness as a miss of
    generalisation."""
    return None if base_limit_s is None else base_limit_s * (1 + k) / (1 + base_k)


def wallclock_ratios(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per K (increasing): the median tree wall of each setting and the ratios ``sequential_over_gather`` and
    ``single_over_gather`` (None when a setting is missing or gather's median is 0). A ratio above 1: gather
    was faster."""
    by_k: dict[int, dict[str, float]] = {}
    for p in points:
        by_k.setdefault(int(p["k"]), {})[p["setting"]] = float(p["tree_wall_s_median"])
    out = []
    for k in sorted(by_k):
        m = by_k[k]
        g = m.get("gather")

        def over(s: str) -> float | None:
            return round(m[s] / g, 3) if g and s in m else None

        out.append({"k": k, **{s: m.get(s) for s in WALLCLOCK_SETTINGS},
                    "sequential_over_gather": over("sequential"), "single_over_gather": over("single")})
    return out


def wallclock_pairs(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per K (increasing) and setting other than gather (sequential, then single): the tasks both it and gather
    evaluated (``per_task_wall_s``, task id -> seconds; the settings evaluate the same tasks), paired: ``pairs``,
    the median, min and max over tasks of the per-task ratio ``wall(setting) / wall(gather)``, ``gather_faster``
    (tasks whose gather tree took less time) and ``p``, the two-sided Wilcoxon signed-rank test on the per-task
    differences (scipy; None under 2 pairs or when every difference is 0). Each task's two trees are sampled
    independently (unseeded requests), so the ratio's spread is the trees' as well as the settings'. A setting
    without ``per_task_wall_s`` or with no task in common gives no row."""
    from scipy import stats

    walls = {(int(p["k"]), p["setting"]): p.get("per_task_wall_s") or {} for p in points}
    out = []
    for k in sorted({k for k, _ in walls}):
        g = walls.get((k, "gather"), {})
        for s in WALLCLOCK_SETTINGS[1:]:
            other = walls.get((k, s), {})
            tasks = sorted(t for t in g.keys() & other.keys() if g[t] > 0)
            if not tasks:
                continue
            ratios = sorted(other[t] / g[t] for t in tasks)
            diffs = [other[t] - g[t] for t in tasks]
            p = round(float(stats.wilcoxon(diffs).pvalue), 6) if len(diffs) >= 2 and any(diffs) else None
            out.append({"k": k, "setting": s, "pairs": len(tasks), "ratio_median": round(statistics.median(ratios), 3),
                        "ratio_min": round(ratios[0], 3), "ratio_max": round(ratios[-1], 3),
                        "gather_faster": sum(g[t] < other[t] for t in tasks), "p": p})
    return out


def _mean_children(hist: dict[str, int]) -> float | None:
    trees = sum(hist.values())
    return sum(int(k) * v for k, v in hist.items()) / trees if trees else None


def _cell(v: Any, fmt: str = "{}") -> str:
    return "" if v is None else fmt.format(v)


def _ci(p: dict[str, Any]) -> str:
    """``p["ci95"]`` as ``[lo, hi]`` with two decimals: a pair (the studies' points) or the text an experiment
    record's point already holds (``"[0.52, 0.71]"``, shown as it is)."""
    if isinstance(p["ci95"], str):
        return p["ci95"]
    lo, hi = p["ci95"]
    return f"[{lo:.2f}, {hi:.2f}]"


def generalisation_table(points: Sequence[dict[str, Any]]) -> str:
    """The generalisation table, one row per (arm, K) in the record's order: n (scored), success, Wilson 95%
    interval, delegation rate, depth-1 success, tokens per tree, median tree wall, tasks missed, and the
    missed tasks by cause (:data:`rao_core.evaluation.MISS_CAUSES`; ``other`` only when some point has it)."""
    causes = [c for c in MISS_CAUSES if c != "other" or any(p.get("misses", {}).get("other") for p in points)]
    head = ["arm", "K", "n", "success", "95% CI", "delegation rate", "depth-1 success", "tokens per tree",
            "tree wall median (s)", "missed", *(MISS_LABELS[c] for c in causes)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        misses = p.get("misses") or {}
        scored = p["n"] - p.get("unscored", 0)
        cells = [p["arm"], str(p["k"]), str(scored), f"{p['success']:.2f}", _ci(p),
                 _cell(p.get("delegation_rate"), "{:.2f}"), _cell(p.get("child_success"), "{:.2f}"),
                 _cell(p.get("tokens_per_tree"), "{:.0f}"), _cell(p.get("tree_wall_s_median"), "{:.1f}"),
                 str(sum(misses.values())), *(str(misses.get(c, 0)) for c in causes)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def wallclock_table(points: Sequence[dict[str, Any]]) -> str:
    """The wall-clock table, one row per (K, setting), by K then setting (:data:`WALLCLOCK_SETTINGS` order): n,
    success with its Wilson 95% interval, median and mean tree wall, completion tokens per tree, mean children
    of the root, parallel share, context window; then one row per K with the ratios of
    :func:`wallclock_ratios`, and (where the points hold per-task times) one row per K and setting compared with
    gather task by task (:func:`wallclock_pairs`)."""
    head = ["K", "setting", "n", "success", "95% CI", "tree wall median (s)", "tree wall mean (s)",
            "tokens per tree", "children per tree", "parallel share", "window"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {s: i for i, s in enumerate(WALLCLOCK_SETTINGS)}
    for p in sorted(points, key=lambda p: (int(p["k"]), order.get(p["setting"], len(order)))):
        scored = p["n"] - p.get("unscored", 0)
        lines.append("| " + " | ".join([
            str(p["k"]), p["setting"], str(scored), f"{p['success']:.2f}", _ci(p), f"{p['tree_wall_s_median']:.1f}",
            _cell(p.get("tree_wall_s"), "{:.1f}"), _cell(p.get("tokens_per_tree"), "{:.0f}"),
            _cell(_mean_children(p.get("children_per_tree") or {}), "{:.2f}"),
            _cell(p.get("parallel_share"), "{:.2f}"), _cell(p.get("context_window"))]) + " |")
    lines += ["", "| K | median tree wall: gather / sequential / single (s) | sequential / gather | single / gather |",
              "|---|---|---|---|"]
    for r in wallclock_ratios(points):
        walls = " / ".join(_cell(r[s], "{:.1f}") or "-" for s in WALLCLOCK_SETTINGS)
        lines.append(f"| {r['k']} | {walls} | {_cell(r['sequential_over_gather'], '{:.2f}x') or '-'} | "
                     f"{_cell(r['single_over_gather'], '{:.2f}x') or '-'} |")
    pairs = wallclock_pairs(points)
    if pairs:
        lines += ["", "| K | setting vs gather, task by task | tasks paired | wall / gather's: median [min, max] | "
                  "gather faster on | Wilcoxon p (two-sided) |", "|---|---|---|---|---|---|"]
        for r in pairs:
            lines.append(f"| {r['k']} | {r['setting']} | {r['pairs']} | {r['ratio_median']:.2f}x "
                         f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] | {r['gather_faster']} of {r['pairs']} | "
                         f"{_cell(r['p'], '{:.2g}') or '-'} |")
    return "\n".join(lines) + "\n"


def _per(meta: dict[str, Any], per_k: str = "per K") -> str:
    """What a study's n counts: ``"<difficulty> tasks"`` for one difficulty (the control), else ``per_k``."""
    return f"{meta['difficulty']} tasks" if meta.get("difficulty") else per_k


def _header(record: dict[str, Any]) -> list[str]:
    ckpts = ", ".join(f"{a} `{c}`" for a, c in record["checkpoints"].items())
    state = "" if record.get("complete", True) else " **Incomplete: the run stopped before its last point.**"
    return [f"Command: `{record['command']}`  ",
            f"Commit `{record['commit']}`, run on {record['date']}, wall time {record['wall_s'] / 60:.1f} min; "
            f"record `docs/results/{record['experiment']}.json`.{state}  ",
            f"Checkpoints: {ckpts} (from `{record['source_record']}`, training seed {record.get('seed')}).  ",
            f"Evaluation tasks: {record['n_tasks']} {_per(record)}, eval.seed {record['eval_seed']}, split {record['split']}; "
            f"checked disjoint from the training pool and demonstrations: "
            + ", ".join(f"{k}: {v}" for k, v in (record.get("task_sets") or {}).items()) + "."]


def generalisation_markdown(record: dict[str, Any], img: str | None = None) -> str:
    """The ``docs/results.md`` section of a generalisation record: title, command, checkpoints, tasks, the
    plot ``img`` (a path relative to docs/) and :func:`generalisation_table`."""
    title = GENERALISATION_TITLE.replace(f"`{GENERALISATION}", f"`{record['experiment']}") + "`"
    lines = [title, "", *_header(record),
             "Each arm in its own mode (recursive arms with delegation, the single agent without) and runtime as "
             "trained, except the recursive arms' tree limit, which grows with the tree's nodes (x (1 + K) / 3); "
             "K = 2 is the trained shape (the ablation's own evaluation tasks), K >= 3 never trained on. "
             "Each missed task has one cause, first that holds: a child given two or more targets that failed, a child that "
             "failed by itself, the root's window, a step or time limit, an infrastructure error, the root "
             "finished wrong (`rao_core.evaluation.miss_cause`). Success with Wilson 95% intervals.", ""]
    sources = record.get("sources") or {}
    if len({(v or {}).get("command") for v in sources.values()}) > 1:
        lines += ["Arms measured by separate runs: " + "; ".join(
            f"{a}: `{v.get('command')}` (commit `{v.get('commit')}`, {v.get('date')}, from `{v.get('source_record')}`)"
            for a, v in sources.items() if v) + ".", ""]
    if img:
        lines += [f"![success vs K per arm, and the missed tasks by cause]({img})", ""]
    lines.append(generalisation_table(record["points"]).rstrip("\n"))
    return "\n".join(lines) + "\n"


def wallclock_markdown(record: dict[str, Any]) -> str:
    """The ``docs/benchmarks.md`` section of a wall-clock record: title, command, checkpoints, tasks, the
    settings and :func:`wallclock_table`."""
    title = f"{WALLCLOCK_TITLE}: `{record.get('experiment') or WALLCLOCK}`"  # whole, so no seed's is a prefix
    lines = [title, "", *_header(record),
             f"One tree at a time (`runtime.max_concurrent_trees: 1`), tree limit {record['tree_timeout_s']:g} s; "
             "gather: children launched as the policy writes them (asyncio.gather where it gathers; parallel share = "
             "share of children that overlapped a sibling); sequential: the same checkpoint with "
             "`runtime.sequential_children: true`; single: the single agent, delegation off, at the window shown. "
             "Requests are unseeded: the settings' trees of a task differ by sampling. A ratio above 1: gather "
             "was faster (the paper: up to 2.5x less wall-clock from parallel children).", "",
             wallclock_table(record["points"]).rstrip("\n")]
    return "\n".join(lines) + "\n"


def generalisation_png(points: Sequence[dict[str, Any]], path: Path) -> Path:
    """Left: success vs K per arm with Wilson 95% bars. Right: the share of tasks missed by each cause per
    (arm, K), stacked (one bar per arm within each K)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(dict.fromkeys(p["arm"] for p in points))
    ks = sorted({int(p["k"]) for p in points})
    fig, (ax, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in arms:
        ps = sorted((p for p in points if p["arm"] == arm), key=lambda p: int(p["k"]))
        ys = [p["success"] for p in ps]
        err = [[y - p["ci95"][0] for y, p in zip(ys, ps)], [p["ci95"][1] - y for y, p in zip(ys, ps)]]
        ax.errorbar([int(p["k"]) for p in ps], ys, yerr=err, marker="o", capsize=3,
                    linestyle="--" if arm == "single" else "-", label=f"{arm} ({ps[0]['mode']} mode)")
    ax.set_xticks(ks)
    ax.set_xlabel("K (targets per task; trained on K = 2)")
    ax.set_ylabel("held-out success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    width = 0.8 / max(1, len(arms))
    colours = plt.get_cmap("tab10")
    for i, arm in enumerate(arms):
        for p in (p for p in points if p["arm"] == arm):
            x, bottom, scored = int(p["k"]) - 0.4 + width * (i + 0.5), 0.0, max(1, p["n"] - p.get("unscored", 0))
            for j, cause in enumerate(MISS_CAUSES):
                share = (p.get("misses") or {}).get(cause, 0) / scored
                if share:
                    ax1.bar(x, share, width * 0.9, bottom=bottom, color=colours(j),
                            label=MISS_LABELS[cause] if cause not in ax1.get_legend_handles_labels()[1] else None)
                    bottom += share
            ax1.text(x, bottom + 0.01, arm[:3], ha="center", fontsize=6)
    handles, labels = ax1.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    ax1.legend(seen.values(), seen.keys(), fontsize=7)
    ax1.set_xticks(ks)
    ax1.set_xlabel("K")
    ax1.set_ylabel("share of tasks missed, by cause")
    ax1.set_ylim(0, 1.05)
    ax1.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)


# -- planning: every input checked before any server starts --------------------------------------------------
class StudyRun(BaseModel):
    """One checkpoint of a study and its jobs: served once (:func:`serve_and_evaluate`)."""
    model_config = ConfigDict(arbitrary_types_allowed=True)

    checkpoint: str
    config: Any  # rao_core.config.CampaignConfig: serving settings and placement of this checkpoint's server
    jobs: list[EvalJob]
    labels: list[dict[str, Any]]  # per job: the point's labels (arm / setting, k, mode, ...)


class StudyPlan(BaseModel):
    """A study ready to run: its record's name and metadata, and its checkpoints with their jobs."""
    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    study: str  # GENERALISATION | WALLCLOCK | DEPTH_CONTROL
    meta: dict[str, Any]
    runs: list[StudyRun]


def read_record(path: str | Path, root: Path | None = None,
                experiment: str = "textcraft-ablation") -> tuple[dict[str, Any], str]:
    """The experiment record at ``path`` (a relative path: under ``root``, the repository by default, else from
    the working folder) and its path as written in a study's record. FileNotFoundError / ValueError naming the file when it is
    missing (with the ``rao experiment <experiment>`` that writes it), not JSON, or has no points or no config."""
    from rao_core.paths import REPO_ROOT

    root = root or REPO_ROOT
    p = Path(path) if Path(path).is_absolute() or not (root / path).is_file() else root / path
    if not p.is_file():
        where = str(p) if Path(path).is_absolute() else f"{path} (neither under {root} nor in the working folder)"
        raise FileNotFoundError(f"record not found: {where}; run `rao experiment {experiment}` first, or name "
                                "one with --record")
    try:
        rec = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not a JSON record: {e}") from None
    if not isinstance(rec, dict) or not rec.get("points") or not (rec.get("config_values") or rec.get("config")):
        raise ValueError(f"{p}: not an experiment record (no points or no config)")
    return rec, str(p.relative_to(root)) if p.is_relative_to(root) else str(p)


def _checkpoint(path: str, what: str, root: Path) -> str:
    """``path`` (relative to ``root`` or absolute) when it holds a checkpoint, else FileNotFoundError; for a
    campaign's folder (``.../campaigns/NAME/checkpoints/iter-K``, which retention removes once S3 holds it) the
    line names the command that fetches it back."""
    p = Path(path) if Path(path).is_absolute() else root / path
    if not (p / "config.json").is_file():
        from rao_core.config import NAME_PATTERN
        from rao_core.paths import rao_home

        name = NAME_PATTERN.strip("^$")  # a campaign name, the rule the config enforces
        m = re.search(rf"^(.*)/campaigns/({name})/checkpoints/iter-(\d+)$", p.as_posix())
        hint = ""
        if m:  # fetch writes under $RAO_HOME/campaigns: name the record's home when it is another
            home = "" if Path(m[1]).resolve() == rao_home() else f"RAO_HOME={m[1]} "
            hint = (f"; a campaign's checkpoint removed locally comes back from S3 with `{home}rao campaigns fetch "
                    f"{m[2]} --iteration {m[3]} --weights-only`")
        raise FileNotFoundError(f"checkpoint folder of {what} not found: {p} has no config.json{hint}")
    return str(p)


def arm_config(record: dict[str, Any], arm: str, overrides: Sequence[str] = ()) -> Any:
    """The campaign config arm ``arm`` of ``record`` ran with: the record's ``config_values`` (else its config
    file at its ``seed``) with ``research.designs.arm_overrides`` (the single arm's node step limit: the
    record's ``single_max_steps``, else the experiment's default), no endpoint, then ``overrides``.
    Raises ValueError for an unknown arm, ``rao_core.config.ConfigError`` for a bad override."""
    from rao_core.config import load_config

    values, source = record.get("config_values"), record.get("config") or "<record>"
    seed = [] if values else [f"seed={record['seed']}"] if record.get("seed") is not None else []
    base = load_config(None if values else source, seed, data=values, check_paths=False)
    rt = base.runtime
    steps = record.get("single_max_steps") or rt.max_steps_per_node * (1 + rt.max_children_per_node)
    extra = arm_overrides(arm, [], base.model.registered_model, None, steps) + ["eval.endpoint=null"]
    return load_config(None if values else source, [*seed, *extra, *overrides], data=values, check_paths=False)


def runtime_summary(rt: RuntimeConfig) -> dict[str, Any]:
    """The runtime fields a study's reader needs (window, limits, sampling, concurrency) as a dict."""
    return {f: getattr(rt, f) for f in ("context_window", "max_new_tokens", "max_steps_per_node", "max_children_per_node",
                                        "max_depth", "delegation", "sequential_children", "tree_timeout_s",
                                        "temperature", "max_concurrent_trees", "repl_pool_size")}


def _eval_config(cfg: Any, difficulties: list[str], n: int, mode: str, stored: int | None = None) -> EvalConfig:
    e = cfg.eval
    return EvalConfig(difficulties=difficulties, n_tasks=n, seed=e.seed, split=e.split, modes=[mode], graded=e.graded,
                      stored_trees=e.stored_trees if stored is None else stored)


def _check_tasks(cfg: Any, difficulties: list[str], n: int) -> dict[str, int]:
    """``check_task_sets`` of ``cfg`` with the study's evaluation set (``difficulties``, ``n`` each)."""
    ev = cfg.eval.model_copy(update={"difficulties": difficulties, "n_tasks": n})
    return check_task_sets(cfg.model_copy(update={"eval": ev}))


def _choices(given: Sequence[str], known: Sequence[str], option: str, what: str) -> None:
    """Raise ValueError (one line naming ``option``) when ``given`` is empty, repeats a value or has one not in
    ``known``."""
    if not given:
        raise ValueError(f"{option}: give at least one {what}")
    if len(set(given)) != len(given):
        raise ValueError(f"{option}: {what} repeated in {list(given)}")
    if unknown := [g for g in given if g not in known]:
        raise ValueError(f"unknown {what} {unknown[0]!r} (expected one of {', '.join(known)})")


def _at_least_one(n: int) -> None:
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")


def _difficulties(ks: Sequence[int], option: str = "--k") -> list[str]:
    from rao_core.envs.textcraft.tasks import MULTI_TARGET

    if not ks:
        raise ValueError(f"{option}: give at least one K")
    if len(set(ks)) != len(ks):
        raise ValueError(f"{option}: K repeated in {list(ks)}")
    bad = [k for k in ks if f"tier1x{k}" not in MULTI_TARGET]
    if bad:
        raise ValueError(f"{option}: no TextCraft-Synth shape tier1x<K> for K = {bad} (K from "
                         f"{min(MULTI_TARGET.values())} to {max(MULTI_TARGET.values())})")
    return [f"tier1x{k}" for k in ks]


def _meta(study: str, name: str, record: dict[str, Any], source: str, command: str, n: int, ks: Sequence[int],
          checkpoints: dict[str, str], task_sets: dict[str, int], cfg: Any, **extra: Any) -> dict[str, Any]:

    return {"experiment": name, "study": study, "command": command, "commit": git_output("rev-parse", "--short", "HEAD")
            or "unknown", "date": time.strftime("%Y-%m-%d"), "source_record": source,
            "source_experiment": record.get("experiment"), "seed": record.get("seed", cfg.seed),
            "eval_seed": cfg.eval.seed, "split": cfg.eval.split, "n_tasks": n, "ks": list(ks),
            "checkpoints": checkpoints, "task_sets": task_sets, **extra}


def plan_generalisation(*, record: str = DEFAULT_RECORD, arms: Sequence[str] = ("recursive", "single"),
                        n: int = 100, ks: Sequence[int] = GENERALISATION_KS, models: dict[str, str] | None = None,
                        overrides: Sequence[str] = (), command: str = "", root: Path | None = None) -> StudyPlan:
    """The generalisation study (docs/experiments/checkpoint-studies.md), every input checked: the record, the
    arms (known, and with a checkpoint: the record's last iteration, or ``models[arm]``), each checkpoint folder,
    the Ks, the configs and ``overrides``, and the evaluation tasks against the training sets. Raises ValueError,
    FileNotFoundError or ``rao_core.config.ConfigError`` with one line naming what is wrong."""
    from rao_core.paths import REPO_ROOT

    root = root or REPO_ROOT
    models = dict(models or {})
    _choices(arms, list(ARM_MODES), "--arm", "arm")
    if models:
        _choices(list(models), list(ARM_MODES), "--model", "arm")
    if unused := [a for a in models if a not in arms]:
        raise ValueError(f"--model {unused[0]}=...: arm {unused[0]!r} is not evaluated (add --arm {unused[0]})")
    _at_least_one(n)
    diffs = _difficulties(ks)
    rec, source = read_record(record, root)
    last = last_checkpoints(rec)
    runs, ckpts, iters, runtimes, task_sets, cfg = [], {}, {}, {}, {}, None
    for arm in arms:
        if arm not in models and arm not in last:
            raise ValueError(f"{source} has no checkpoint of arm {arm!r}; pass --model {arm}=PATH")
        path = _checkpoint(models.get(arm) or last[arm][0], f"arm {arm}", root)
        ckpts[arm], iters[arm] = path, None if arm in models else last[arm][1]
        cfg = arm_config(rec, arm, overrides)
        mode = ARM_MODES[arm]
        task_sets = _check_tasks(cfg, diffs, n)
        base_trees = cfg.runtime.max_concurrent_trees or n
        jobs, labels = [], []
        for k, d in zip(ks, diffs):
            at_once = base_trees if mode == "single" else trees_at_once(k, base_trees)  # a single agent: 1 node
            limit = cfg.runtime.tree_timeout_s if mode == "single" else tree_limit(k, cfg.runtime.tree_timeout_s)
            rt = cfg.runtime.model_copy(update={"max_concurrent_trees": at_once, "tree_timeout_s": limit})
            jobs.append(EvalJob(label=f"arm {arm}, {n} {d} tasks, mode {mode}", config=_eval_config(cfg, [d], n, mode),
                                runtime=rt))
            labels.append({"arm": arm, "k": k, "checkpoint": path, "checkpoint_iteration": iters[arm],
                           "trees_at_once": rt.max_concurrent_trees, "tree_timeout_s": rt.tree_timeout_s})
        runtimes[arm] = runtime_summary(cfg.runtime)
        runs.append(StudyRun(checkpoint=path, config=cfg, jobs=jobs, labels=labels))
    name = study_name(GENERALISATION, rec)
    meta = _meta(GENERALISATION, name, rec, source, command, n, ks, ckpts, task_sets, cfg, arms=list(arms),
                 modes={a: ARM_MODES[a] for a in arms}, checkpoint_iterations=iters, runtime=runtimes)
    meta["sources"] = {a: {"command": command, "source_record": source, "source_experiment": rec.get("experiment"),
                           "commit": meta["commit"], "date": meta["date"]} for a in arms}
    return StudyPlan(name=name, study=GENERALISATION, meta=meta, runs=runs)


def wallclock_repl_pool(ks: Sequence[int]) -> int:
    """Pre-started REPLs for the wall-clock study: ``max(ks) + 1``, a root and all its children at the largest K,
    so that a root that gathers K children finds each one's REPL started, as one that launches them one after
    another does (the pool refills between its children). The runtime's default of 2 would make a K = 6 root
    that gathers start 4 REPLs cold, a bias against gathering. Raises ValueError on an empty ``ks``."""
    if not ks:
        raise ValueError("--k: no K given")
    return max(ks) + 1


def plan_wallclock(*, record: str = DEFAULT_RECORD, model: str | None = None, single_model: str | None = None,
                   n: int = 30, ks: Sequence[int] = WALLCLOCK_KS, single_window: int = 4096,
                   settings: Sequence[str] = WALLCLOCK_SETTINGS, overrides: Sequence[str] = (), command: str = "",
                   root: Path | None = None) -> StudyPlan:
    """The wall-clock study (docs/experiments/checkpoint-studies.md), every input checked before any server
    starts: the record (configs, eval seed and, unless ``model`` / ``single_model`` are given, the recursive and
    single arms' last checkpoints), the checkpoint folders, the Ks, the settings, the single agent's window and the
    evaluation tasks against the training sets. Runs the recursive checkpoint's settings interleaved per K
    (gather then sequential), then the single agent's; a checkpoint used by several settings is served once.
    Raises ValueError, FileNotFoundError or ``rao_core.config.ConfigError`` with one line."""
    from rao_core.paths import REPO_ROOT

    root = root or REPO_ROOT
    _choices(settings, WALLCLOCK_SETTINGS, "--setting", "setting")
    _at_least_one(n)
    diffs = _difficulties(ks)
    rec, source = read_record(record, root)
    last = last_checkpoints(rec)
    recursive = [s for s in settings if s != "single"]
    want = {"recursive": model} if recursive else {}
    want.update({"single": single_model} if "single" in settings else {})
    ckpts = {}
    for arm, given in want.items():
        if not given and arm not in last:
            raise ValueError(f"{source} has no checkpoint of arm {arm!r}; pass --{'single-' if arm == 'single' else ''}"
                             "model PATH")
        ckpts[arm] = _checkpoint(given or last[arm][0], f"the {arm} agent", root)
    timing = ["runtime.max_concurrent_trees=1", f"runtime.tree_timeout_s={WALLCLOCK_TREE_TIMEOUT_S}",
              f"eval.stored_trees={WALLCLOCK_STORED_TREES}", f"runtime.repl_pool_size={wallclock_repl_pool(ks)}"]
    groups: dict[str, StudyRun] = {}
    cfgs = {}
    if recursive:
        cfgs["recursive"] = arm_config(rec, "recursive", [*timing, *overrides])
    if "single" in settings:
        fit = max(single_window, arm_config(rec, "single").serving.max_model_len)  # the server takes the window
        cfgs["single"] = arm_config(rec, "single", [*timing, f"serving.max_model_len={fit}",
                                                    f"runtime.context_window={single_window}", *overrides])
    order = [(k, d, s) for k, d in zip(ks, diffs) for s in recursive] + [(k, d, "single") for k, d in zip(ks, diffs)
                                                                           if "single" in settings]
    for k, d, s in order:
        arm = "single" if s == "single" else "recursive"
        cfg, path = cfgs[arm], ckpts[arm]
        rt = cfg.runtime.model_copy(update={"sequential_children": s == "sequential"})
        run = groups.setdefault(path, StudyRun(checkpoint=path, config=cfg, jobs=[], labels=[]))
        run.jobs.append(EvalJob(label=f"{s}, {n} {d} tasks, one tree at a time",
                                config=_eval_config(cfg, [d], n, arm), runtime=rt))
        run.labels.append({"setting": s, "k": k, "checkpoint": path, "context_window": rt.context_window,
                           "sequential_children": rt.sequential_children})
    first = next(iter(cfgs.values()))
    task_sets = _check_tasks(first, diffs, n)
    name = study_name(WALLCLOCK, rec)  # a seed's record gets its own study record and section
    meta = _meta(WALLCLOCK, name, rec, source, command, n, ks, ckpts, task_sets, first, settings=list(settings),
                 single_window=single_window if "single" in settings else None,
                 tree_timeout_s=first.runtime.tree_timeout_s,
                 runtime={a: runtime_summary(c.runtime) for a, c in cfgs.items()})
    return StudyPlan(name=name, study=WALLCLOCK, meta=meta, runs=list(groups.values()))


def plan_depth_control(*, record: str = DEFAULT_NESTED_RECORD, iterations: Sequence[int] = (),
                       difficulty: str = "nest2", n: int | None = None, overrides: Sequence[str] = (),
                       command: str = "", root: Path | None = None) -> StudyPlan:
    """The depth-limited control (docs/experiments/textcraft-nested.md): the recursive arm's checkpoints of a
    nested-shape record (``textcraft-nested``, ``textcraft-deeper``; the study is named by :func:`control_name`)
    at ``iterations`` (default: the warm start and the last), each evaluated on the record's own ``difficulty``
    tasks (the same eval seed and the first ``n``, default the record's n, so every task pairs with the record's
    tree of it) with ``runtime.max_depth: 1``: delegation at the root only, the rest
    of the runtime as trained. The record's points at full depth are copied into the plan's ``reference`` so the
    control's record compares by itself (:func:`depth_control_table`). Raises ValueError, FileNotFoundError or
    ``rao_core.config.ConfigError`` with one line naming what is wrong."""
    from rao_core.paths import REPO_ROOT

    root = root or REPO_ROOT
    if n is not None:
        _at_least_one(n)
    rec, source = read_record(record, root, experiment="textcraft-nested")
    mine = {int(p["iteration"]): p for p in rec["points"]
            if p.get("arm") == "recursive" and p.get("mode") == "recursive" and p.get("difficulty") == difficulty}
    if not mine:
        raise ValueError(f"{source} has no point of the recursive arm on {difficulty!r} (evaluated: "
                         f"{sorted({p.get('difficulty') for p in rec['points']})}); pass --difficulty")
    its = list(iterations) or sorted({min(mine), max(mine)})
    if len(set(its)) != len(its):
        raise ValueError(f"--iteration: iteration repeated in {its}")
    if missing := [i for i in its if i not in mine]:
        raise ValueError(f"{source} has no {difficulty} point at iteration {missing[0]} (it has {sorted(mine)})")
    ref_n = min(int(mine[i]["n"]) for i in its)
    n = ref_n if n is None else n
    if n > ref_n:
        raise ValueError(f"--n {n}: the record evaluated {ref_n} {difficulty} tasks; the control pairs with them, "
                         f"so at most {ref_n}")
    cfg = arm_config(rec, "recursive", ["runtime.max_depth=1", *overrides])
    if not cfg.runtime.delegation or cfg.runtime.max_depth != 1:
        raise ValueError(f"--set: the control needs delegation on and runtime.max_depth 1, got delegation "
                         f"{cfg.runtime.delegation}, max_depth {cfg.runtime.max_depth}")
    from rao_core.envs import get_env
    from rao_core.evaluation import eval_tasks

    # the record's own tasks: the first n of its draw of ref_n. A draw of n alone is not always their prefix: once
    # the held-out problems run out (nest2: 24), generate_textcraft_tasks' rule for repeats depends on n, so the
    # same task ids would name other problems and the pairing by task id would pair different tasks
    env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
    tasks = eval_tasks(env, _eval_config(cfg, [difficulty], ref_n, "recursive"), **cfg.tasks.generator_options)[:n]
    runs, ckpts = [], {}
    for i in its:
        if not mine[i].get("checkpoint"):
            raise ValueError(f"{source}: the iteration-{i} point has no checkpoint")
        path = _checkpoint(mine[i]["checkpoint"], f"iteration {i}", root)
        ckpts[f"iteration {i}"] = path
        job = EvalJob(label=f"iteration {i}, {n} {difficulty} tasks, max_depth 1",
                      config=_eval_config(cfg, [difficulty], n, "recursive"), runtime=cfg.runtime, tasks=list(tasks))
        runs.append(StudyRun(checkpoint=path, config=cfg, jobs=[job],
                             labels=[{"arm": "recursive", "iteration": i, "max_depth": 1, "checkpoint": path}]))
    keep = ("n", "successes", "success", "ci95", "per_task", "depth_hist", "mean_depth", "delegation_rate")
    reference = {str(i): {k: mine[i].get(k) for k in keep} for i in its}
    name = control_name(rec)
    meta = _meta(DEPTH_CONTROL, name, rec, source, command, n, [], ckpts, _check_tasks(cfg, [difficulty], ref_n), cfg,
                 difficulty=difficulty, iterations=its, max_depth_trained=arm_config(rec, "recursive").runtime.max_depth,
                 runtime=runtime_summary(cfg.runtime), reference=reference)
    return StudyPlan(name=name, study=DEPTH_CONTROL, meta=meta, runs=runs)


DEPTH_CONTROL_HEAD = ("full depth (the experiment) | max_depth 1 (control) | difference | tasks only full depth "
                      "solved / only the control solved | p (sign test, one-sided) | experiment's trees reaching depth 2")


def depth_control_rows(record: dict[str, Any]) -> list[str]:
    """One markdown row body per point of a control record, by iteration (``| iteration | ... |``, the columns
    of :data:`DEPTH_CONTROL_HEAD` after the iteration): the experiment's success at full depth and the control's
    at ``max_depth`` 1 (successes/n [Wilson 95%]), the difference, the tasks each solved alone (paired by task id
    over the tasks both have), the one-sided exact sign test that depth helps (p), and the share of the
    experiment's trees that reached depth 2."""
    from scipy import stats

    rows = []
    for p in sorted(record["points"], key=lambda q: q["iteration"]):
        ref = (record.get("reference") or {}).get(str(p["iteration"])) or {}
        a, b = ref.get("per_task") or {}, p.get("per_task") or {}
        common = [t for t in a if t in b and a[t] is not None and b[t] is not None]
        full, ctrl = sum(a[t] > b[t] for t in common), sum(a[t] < b[t] for t in common)
        pval = float(stats.binomtest(full, full + ctrl, 0.5, alternative="greater").pvalue) if full + ctrl else None
        reach = depth_reach(ref.get("depth_hist") or {}, 2)
        diff = (ref["success"] - p["success"]) if ref.get("success") is not None else None
        rows.append(f"| {p['iteration']} | {_cell(ref.get('successes'), '{:g}')}/{_cell(ref.get('n'))} "
                    f"{_ci(ref) if ref.get('ci95') else ''} | {p['successes']:g}/{p['n']} {_ci(p)} | "
                    f"{_cell(diff, '{:+.2f}') or '-'} | {full} / {ctrl} of {len(common)} | "
                    f"{_cell(pval, '{:.4f}') or '-'} | {reach[0]}/{reach[1]} |")
    return rows


def depth_control_table(record: dict[str, Any]) -> str:
    """Markdown table of a control record: :func:`depth_control_rows` under their header."""
    lines = [f"| iteration | {DEPTH_CONTROL_HEAD} |", "|---|---|---|---|---|---|---|", *depth_control_rows(record)]
    return "\n".join(lines) + "\n"


def control_records(records: Sequence[dict[str, Any]], root: Path | None = None
                    ) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each experiment record (one per seed, in seed order) with its depth-limited control record
    ``docs/results/<experiment>-control[-seed<S>].json`` under ``root`` (the repository by default;
    :func:`control_name`), or None where that file is missing or unreadable."""
    from rao_core.paths import REPO_ROOT

    folder = (root or REPO_ROOT) / "docs/results"
    out = []
    for rec in sorted(records, key=lambda r: r.get("seed", 0)):
        try:
            out.append((rec, json.loads((folder / f"{control_name(rec)}.json").read_text())))
        except (OSError, ValueError):
            out.append((rec, None))
    return out


def depth_control_seeds_markdown(records: Sequence[dict[str, Any]], root: Path | None = None, *,
                                 controls: list[tuple[dict[str, Any], dict[str, Any] | None]] | None = None) -> str:
    """The ``### Depth-limited control per seed`` part of a nested experiment's seeds section: for each
    experiment record (one per seed), its control record ``docs/results/<experiment>-control[-seed<S>].json``
    under ``root`` (the repository by default; :func:`control_name`), one row per controlled iteration
    (:func:`depth_control_rows`), or a row saying the seed has none (e.g. its checkpoints were lost before the
    control ran), then the seeds pooled (:func:`depth_control_pooled`). Empty when no seed has one.
    ``controls``: :func:`control_records` of ``records`` already read (None: read here)."""
    controls = control_records(records, root) if controls is None else controls
    rows = []
    for rec, ctrl in controls:
        if ctrl is None:
            rows.append(f"| {rec.get('seed')} | - | no control record (`docs/results/{control_name(rec)}.json`) "
                        "| | | | | |")
        else:
            rows += [f"| {rec.get('seed')} {row}" for row in depth_control_rows(ctrl)]
    if all(ctrl is None for _, ctrl in controls):
        return ""
    return "\n".join(["### Depth-limited control per seed", "",
                      "The same checkpoint on the same nest2 tasks at `runtime.max_depth: 1` (the root may delegate, "
                      "its children may not): what depth buys, per seed (`rao experiment depth-control`).",
                      "", f"| seed | iteration | {DEPTH_CONTROL_HEAD} |", "|---|---|---|---|---|---|---|---|",
                      *rows, *_pooled_control_line(depth_control_pooled(records, controls=controls))]) + "\n"


def _pooled_control_line(pooled: dict[str, Any] | None) -> list[str]:
    """The sentence under the per-seed control table that pools its seeds (:func:`depth_control_pooled`)."""
    if pooled is None or len(pooled["seeds"]) < 2:
        return []
    f, c = pooled["full"], pooled["control"]
    p = "p < 0.0001" if pooled["p"] < 1e-4 else f"p = {pooled['p']:.4f}"
    return ["", f"Pooled over seeds {', '.join(map(str, pooled['seeds']))} (last controlled iteration): full depth "
            f"{f[0]:g}/{f[1]}, max_depth 1 {c[0]:g}/{c[1]}; tasks full depth solved more / fewer "
            f"{pooled['tasks_arm_better']} / {pooled['tasks_against_better']} of {pooled['tasks_paired']}, "
            f"{p} (one-sided sign test): depth {'is' if pooled['depth_shown'] else 'is not'} shown "
            "to be what solved them."]


def depth_control_pooled(records: Sequence[dict[str, Any]], root: Path | None = None, *,
                         controls: list[tuple[dict[str, Any], dict[str, Any] | None]] | None = None
                         ) -> dict[str, Any] | None:
    """The depth-limited control pooled over seeds: for each experiment record (one per seed) whose control
    record exists (:func:`control_name`), that control's last controlled iteration, full depth (the
    experiment's trees) vs ``max_depth`` 1 on the same tasks; the tasks paired across seeds and tested by
    ``research.records.paired_sign_test`` (one-sided, H1: full depth solves more). Returns ``seeds``,
    ``per_seed`` (iteration, full and control successes/n), ``full`` and ``control`` pooled successes/n, the
    test's fields and ``depth_shown`` (p < 0.05), or None when no seed has a control record. ``controls``:
    :func:`control_records` of ``records`` already read (None: read here)."""
    per_seed, tables = [], []
    for rec, ctrl in control_records(records, root) if controls is None else controls:
        if ctrl is None:
            continue
        p = max(ctrl.get("points") or [], key=lambda q: q["iteration"], default=None)
        ref = ((ctrl.get("reference") or {}).get(str(p["iteration"])) or {}) if p else {}
        if not p or not ref.get("per_task") or not p.get("per_task"):
            continue
        per_seed.append({"seed": rec.get("seed"), "iteration": p["iteration"], "full": [ref["successes"], ref["n"]],
                         "control": [p["successes"], p["n"]]})
        tables.append((ref["per_task"], p["per_task"]))
    if not per_seed:
        return None
    test = paired_sign_test(tables)
    pooled = {k: [sum(s[k][0] for s in per_seed), sum(s[k][1] for s in per_seed)] for k in ("full", "control")}
    return {"seeds": [s["seed"] for s in per_seed], "per_seed": per_seed, **pooled, **test,
            "depth_shown": test["p"] < 0.05,
            "test": "one-sided exact sign test over tasks on the seed-averaged per-task difference (full depth > "
                    "max_depth 1), alpha 0.05"}


def depth_control_markdown(record: dict[str, Any]) -> str:
    """The ``docs/results.md`` section of a control record: title, command, checkpoints, tasks, the rule and
    :func:`depth_control_table`."""
    title = DEPTH_CONTROL_TITLE.replace(f"`{DEPTH_CONTROL}", f"`{record['experiment']}") + "`"
    lines = [title, "", *_header(record),
             f"The recursive arm's checkpoints on the record's own {record['difficulty']} tasks with "
             f"`runtime.max_depth: 1` (the root may delegate, its children may not; trained and evaluated in the "
             f"experiment with max_depth {record.get('max_depth_trained')}); every other runtime setting as trained. "
             "Each task pairs with the experiment's tree of it (the same eval seed, the first n tasks); the sign "
             "test asks whether full depth solves more of them. Requests are unseeded: paired trees differ by "
             "sampling as well as by depth.", "", depth_control_table(record).rstrip("\n")]
    return "\n".join(lines) + "\n"


def plan_text(plan: StudyPlan, root: Path | None = None) -> str:
    """What ``plan`` will do, one line each (``--dry-run``): the record it writes, the task sets checked, the
    arms it keeps from that record (generalisation, :func:`other_arms`; ``root``: the repository by default),
    then per checkpoint (served once) its evaluations with their mode, tasks and the runtime that differs between
    them (window, step limit, trees at once, sequential children, tree limit)."""
    from rao_core.paths import REPO_ROOT

    m = plan.meta
    rec_path = (root or REPO_ROOT) / "docs/results" / f"{plan.name}.json"
    lines = [f"{plan.study}: record docs/results/{plan.name}.json from {m['source_record']} (training seed "
             f"{m.get('seed')}), {m['n_tasks']} {_per(m, 'tasks per K')}, eval.seed {m['eval_seed']}, split {m['split']}",
             "task sets checked disjoint: " + ", ".join(f"{k}: {v}" for k, v in m["task_sets"].items())]
    kept, merged = other_arms(rec_path, plan)
    if kept:
        lines.append(f"kept from that record (measured by an earlier run): arm(s) "
                     + ", ".join(f"{a} ({sum(p['arm'] == a for p in kept)} points)" for a in merged["arms"]
                                 if a not in m["arms"]))
    for run in plan.runs:
        lines.append(f"serve {run.checkpoint} once (max_model_len {serving_config(run.config, run.jobs).serving.max_model_len}):")
        for job in run.jobs:
            rt = job.runtime
            lines.append(f"  {job.label}: window {rt.context_window}, {rt.max_steps_per_node} steps per node, "
                         f"{rt.max_concurrent_trees or 'all'} trees at once, sequential children "
                         f"{'on' if rt.sequential_children else 'off'}, tree limit {rt.tree_timeout_s:g} s")
    return "\n".join(lines)


# -- running -------------------------------------------------------------------------------------------------
#: Root end reasons that are the infrastructure's, not the policy's (as ``tasks.stages.infra_failure``, without
#: ``tree_timeout``: the tree's wall-clock limit is a limit the studies measure, a miss cause of its own).
STUDY_INFRA_ENDS = ("policy_error", "sandbox_error", "token_prefix_break")
#: Record fields that are not the plan's: a partial record is resumed when every other field of the plan matches.
RUN_FIELDS = ("commit", "date", "wall_s", "complete", "points", "resumed_points")


def infra_failures(trees: Sequence[Any]) -> dict[str, int]:
    """Trees per infrastructure failure (:data:`STUDY_INFRA_ENDS`, or ``crashed`` for a rollout that raised),
    most frequent first; empty when none."""
    from collections import Counter

    def why(t: Any) -> str | None:
        try:
            end = t.root.end_reason.value
        except KeyError:  # a crashed rollout without its root
            end = None
        return end if end in STUDY_INFRA_ENDS else "crashed" if t.error else None

    return dict(Counter(r for r in map(why, trees) if r).most_common())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    from rao_core.jsonl import atomic_path

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=2) + "\n")


def _point_key(p: dict[str, Any]) -> str:
    it = f"-it{p['iteration']}" if "iteration" in p else ""
    return f"{p.get('arm') or p.get('setting')}{it}-{p['difficulty']}-{p['mode']}"


#: Fields of a generalisation record that must be equal for arms measured by separate runs to share it: the
#: evaluation itself (tasks, Ks, seeds). The rest is per arm (:data:`PER_ARM_FIELDS`) or the last run's.
SHARED_FIELDS = ("study", "experiment", "seed", "eval_seed", "split", "n_tasks", "ks")
#: Fields of a generalisation record keyed by arm, merged when a run adds arms to a record (:func:`other_arms`).
PER_ARM_FIELDS = ("checkpoints", "checkpoint_iterations", "modes", "runtime", "sources")


def _same_plan(old: dict[str, Any], plan: StudyPlan) -> bool:
    """Whether ``old`` (a record) was written by ``plan``: every field of ``plan.meta`` but the run's own
    (:data:`RUN_FIELDS`) equal; for a generalisation record, the shared fields and the plan's arms' per-arm
    fields (their provenance without commit and date), whatever other arms the record holds."""
    mine = json.loads(json.dumps(plan.meta))
    if plan.study != GENERALISATION:
        return all(old.get(k) == v for k, v in mine.items() if k not in RUN_FIELDS)

    def drop_run(v: Any) -> Any:
        return {k: x for k, x in v.items() if k not in RUN_FIELDS} if isinstance(v, dict) else v

    return (all(old.get(k) == mine.get(k) for k in SHARED_FIELDS)
            and all(drop_run((old.get(f) or {}).get(a)) == drop_run(mine[f][a])
                    for f in PER_ARM_FIELDS for a in mine["arms"]))


def resumable_points(rec_path: Path, plan: StudyPlan) -> tuple[list[dict[str, Any]], float]:
    """The points (and wall seconds) of an INCOMPLETE record at ``rec_path`` written by the same plan
    (:func:`_same_plan`), those that match one of the plan's jobs by all its labels; ``([], 0.0)`` otherwise
    (no record, a complete one, another plan, or not JSON)."""
    try:
        old = json.loads(rec_path.read_text())
    except (OSError, ValueError):
        return [], 0.0
    if not isinstance(old, dict) or old.get("complete") is not False or not _same_plan(old, plan):
        return [], 0.0
    labels = [lab for run in plan.runs for lab in run.labels]
    points = [p for lab in labels for p in old.get("points", []) if all(p.get(k) == v for k, v in lab.items())]
    return points, float(old.get("wall_s") or 0.0)


def other_arms(rec_path: Path, plan: StudyPlan) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Generalisation only: the points at ``rec_path`` of the arms ``plan`` does not evaluate, and the plan's
    meta with those arms added (``arms``: theirs first; :data:`PER_ARM_FIELDS` merged), so that arms measured in
    separate runs (e.g. each retrained and evaluated in its own session, when a machine's checkpoints do not
    outlive it) share one record and one table. An arm is kept only when the record has the same evaluation
    (:data:`SHARED_FIELDS`) and a point at every K of it; a record written before per-arm provenance takes its
    top-level command, record, commit and date as its arms'. ``([], plan.meta)`` when nothing is kept (no
    record, not JSON, another evaluation, another study)."""
    mine = json.loads(json.dumps(plan.meta))
    try:
        old = json.loads(rec_path.read_text())
    except (OSError, ValueError):
        return [], plan.meta
    if (plan.study != GENERALISATION or not isinstance(old, dict)
            or any(old.get(k) != mine.get(k) for k in SHARED_FIELDS)):
        return [], plan.meta
    keep = [a for a in old.get("arms") or [] if a not in mine["arms"]
            and {int(p["k"]) for p in old.get("points", []) if p.get("arm") == a} >= set(mine["ks"])]
    if not keep:
        return [], plan.meta
    old.setdefault("sources", {a: {k: old.get(k) for k in ("command", "source_record", "source_experiment",
                                                          "commit", "date")} for a in keep})
    meta = {**plan.meta, "arms": keep + list(mine["arms"])}
    for f in PER_ARM_FIELDS:
        meta[f] = {**{a: (old.get(f) or {}).get(a) for a in keep}, **plan.meta[f]}
    return [p for p in old.get("points", []) if p.get("arm") in keep], meta


def run_study(plan: StudyPlan, *, write_docs: bool = True, root: Path | None = None,
              policy_for: Callable[[str], Any] | None = None, base_url: str | None = None,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``plan``: each checkpoint served once (:func:`serve_and_evaluate`; ``policy_for(checkpoint)``: a
    policy instead of a server, for tests; ``base_url``: a running server for every checkpoint), one point
    per job (:func:`study_point`). After each job its stored trees (``docs/results/trees/<name>/``) and the
    record so far are written to ``<root>/docs/results/<name>.json`` with ``"complete": false``; at the end
    the complete record (stored trees of no point removed) and, with ``write_docs``, the markdown section
    (generalisation: ``docs/results.md`` and the plot ``docs/img/<name>.png``; wall-clock:
    ``docs/benchmarks.md``).

    Resuming: when ``docs/results/<name>.json`` is an incomplete record of the same plan
    (:func:`resumable_points`), its points are kept and only the jobs without one run (a checkpoint with none
    left is not served). Generalisation: the points of arms this plan does not evaluate are kept from the record
    (:func:`other_arms`), so arms can be measured in separate runs. A job whose trees ended by infrastructure failures (:func:`infra_failures`) more than
    ``runtime.max_infra_failure_share`` of the time (a dead server: its zeros are no measurement) raises
    ``infra.process.ServiceError`` before its point is recorded, so the same command resumes there. Returns
    ``{"record", "markdown", "record_path"}``."""
    from infra.process import ServiceError
    from rao_core.envs import get_env
    from rao_core.paths import REPO_ROOT

    root = root or REPO_ROOT
    rec_path = root / "docs/results" / f"{plan.name}.json"
    folder = root / "docs/results/trees" / plan.name
    t0 = time.monotonic()
    points, wall0 = resumable_points(rec_path, plan)
    resumed = len(points)
    if resumed:
        say(f"resuming {rec_path.name}: {resumed} evaluations already done (an incomplete record of this plan)")
    kept, meta = other_arms(rec_path, plan)
    if kept:
        say(f"{rec_path.name}: keeping the points of arm(s) {', '.join(a for a in meta['arms'] if a not in plan.meta['arms'])}"
            f" measured by an earlier run ({len(kept)} points); this run adds {', '.join(plan.meta['arms'])}")
        points = kept + points

    def record(complete: bool) -> dict[str, Any]:
        return {**meta, "wall_s": round(wall0 + time.monotonic() - t0, 1), "complete": complete,
                **({"resumed_points": resumed} if resumed else {}), "points": list(points)}

    def done(lab: dict[str, Any]) -> bool:
        return any(all(p.get(k) == v for k, v in lab.items()) for p in points)

    for run in plan.runs:
        todo = [(job, lab) for job, lab in zip(run.jobs, run.labels) if not done(lab)]
        if not todo:
            continue
        cfg = run.config
        env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
        labels = iter(lab for _, lab in todo)

        def keep(job: EvalJob, report: EvalReport, labels=labels) -> None:
            lab = next(labels)
            bad = infra_failures(report.trees)
            limit = job.runtime.max_infra_failure_share
            if report.trees and sum(bad.values()) > limit * len(report.trees):
                detail = ", ".join(f"{k} {v}" for k, v in bad.items())
                raise ServiceError(
                    f"{job.label}: {sum(bad.values())} of {len(report.trees)} trees ended by infrastructure failures "
                    f"({detail}; limit {limit:.0%}, runtime.max_infra_failure_share): no point recorded; the "
                    f"{len(points)} points before it are in {rec_path} (complete: false), and the same command "
                    "resumes from them")
            for row in report.rows:
                trees = [t for t in report.trees if t.meta.get("difficulty") == row.difficulty]
                point = study_point(row, trees, **lab, trees_file=None)
                f = folder / f"{_point_key(point)}.jsonl.gz"
                if row.sample and write_tree_sample(f, row.sample):
                    point["trees_file"] = str(f.relative_to(root))
                points.append(point)
            _write_json(rec_path, record(False))

        serve_and_evaluate(cfg, Path(run.checkpoint), [job for job, _ in todo], env=env, base_url=base_url, say=say,
                           on_report=keep, policy=policy_for(run.checkpoint) if policy_for else None)
    kept = {root / p["trees_file"] for p in points if p.get("trees_file")}
    for old in folder.glob("*.jsonl.gz") if folder.is_dir() else []:
        if old not in kept:  # another run's trees
            old.unlink()
    rec = record(True)
    _write_json(rec_path, rec)
    if plan.study == DEPTH_CONTROL:
        md = depth_control_markdown(rec)
        if write_docs:
            replace_section(root / "docs/results.md", md.splitlines()[0], md)
    elif plan.study == GENERALISATION:
        img = generalisation_png(points, root / "docs/img" / f"{plan.name}.png")
        md = generalisation_markdown(rec, img=f"img/{img.name}")
        if write_docs:
            replace_section(root / "docs/results.md", md.splitlines()[0], md)
    else:
        md = wallclock_markdown(rec)
        if write_docs:
            replace_section(root / "docs/benchmarks.md", md.splitlines()[0], md)
    return {"record": rec, "markdown": md, "record_path": str(rec_path)}
