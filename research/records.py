"""The experiment's records: the ``docs/results/<experiment>.json`` record, the learning-curve plot, the
``docs/results.md`` section and their MLflow copies (the Prefect task :func:`write_results`, which
``research/experiment.py`` calls), and the comparisons and tables read from records.

The claimed comparison is the recursive arm's last iteration vs its warm start (a one-sided pooled
two-proportion z-test, ``rao_core.evaluation.two_proportion_test``). A record keeps, per point, the evaluation
row's audit fields (:data:`POINT_KEYS`) and its stored trees (:func:`write_tree_sample`), per RL iteration the
logged training statistics (:func:`iteration_stats`), and the arms, seeds, commits and preregistered endpoint;
runs deeper than one level (:func:`deep_config`) add per-depth tables and plots (:func:`depth_markdown`,
:func:`depth_png`, :func:`depth_seeds_markdown`). Docs: docs/experiments.md.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from rao_core.evaluation import two_proportion_test, wilson_interval
from rao_core.jsonl import atomic_path, one_line_error
from rao_core.paths import REPO_ROOT
from rao_core.tree import ExecutionTree, tree_json_line
from research.designs import ARM_MODES, ARM_PAIRS
from tasks import tracking

#: Fields of an evaluation row (``rao_core.evaluation.EvalRow.table_row``) copied into a record's point when
#: present. ``tokens_per_success`` appears only in rows of campaigns evaluated before audit fields existed (new rows have
#: ``tokens_per_tree`` and ``tokens_total``: tokens per solved task restate the success rate).
POINT_KEYS = ("unscored", "child_success", "child_nodes", "parallel_share", "tree_wall_s", "tree_wall_s_median",
              "tokens_per_tree", "tokens_total", "tokens_per_success", "end_reasons", "children_per_tree",
              "depth_hist", "per_depth", "per_task", "misses", "distinct_problems")
#: Largest stored-trees file (bytes, gzipped): trees at the end of a sample are dropped until it fits.
TREE_FILE_MAX_BYTES = 200_000


def point_key(row: dict[str, Any]) -> tuple[str, int, str, str]:
    """(arm, iteration, difficulty, mode) of an experiment row or record point."""
    return row["arm"], int(row["iteration"]), row["difficulty"], row["mode"]


def tree_file_name(arm: str, iteration: int, difficulty: str, mode: str) -> str:
    """``<arm>-it<iteration>-<difficulty>-<mode>.jsonl.gz``: the stored trees of one point."""
    return f"{arm}-it{iteration}-{difficulty}-{mode}.jsonl.gz"


def iteration_stats(metrics: dict[str, Any]) -> dict[str, Any]:
    """The rollout and training statistics of one RL iteration, from the metrics it logged to MLflow
    (``tasks.tracking.log_iteration``; the campaign summary keeps them per iteration): ``rollout_root_success``
    (``success/root``: mean success s of the rollout roots), ``rollout_depth1_success`` (``success/depth_1``;
    None without a depth-1 node), ``rollout_success_per_depth`` (``{d: success/depth_<d>}`` for every depth
    logged, in depth order), ``rollout_trees``, ``rollout_tokens`` (completion tokens of all rollout
    nodes), ``rollout_delegation_rate``, ``rollout_end_reasons`` ({reason: share of nodes}), ``samples`` and
    ``signal_samples`` (training samples, and those with a non-zero coefficient), ``optimizer_steps`` (the
    iteration's update budget as taken: its trainer's last ``train/step``, 0 when it made no update; equal across
    the arms of a design by ``trainer.steps_per_batch``), ``samples_per_depth``
    (``{d: {samples, signal_samples, mean_abs_advantage, mean_advantage, mean_advantage_solved,
    assistant_tokens}}``, from ``samples/depth_<d>/*``; the two signed means only in records that log them),
    ``staleness`` (``{lag: samples}``, from ``staleness/lag_<d>_samples``: how many training samples came from a
    checkpoint that many versions older than the trained one; {} for a run before asynchronous RL) and ``train``
    (the trainer's ``train/*`` values of the iteration, with the off-policy correction's
    ``behaviour_weight_mean``, ``behaviour_weight_capped_frac`` and ``stale_token_frac`` when it ran: the last
    optimizer step's, and as ``iter_*`` their per-token means over all the iteration's steps,
    ``rao_core.async_rl.iteration_ratio_stats``). A metric not logged is None."""
    per_depth: dict[str, dict[str, float]] = {}
    success = {k.removeprefix("success/depth_"): v for k, v in metrics.items()
               if k.startswith("success/depth_") and k.removeprefix("success/depth_").isdigit()}
    for k, v in metrics.items():
        if k.startswith("samples/depth_") and k.count("/") == 2:
            d, name = k.removeprefix("samples/depth_").split("/")
            per_depth.setdefault(d, {})[name] = v
    return {"rollout_root_success": metrics.get("success/root"),
            "rollout_depth1_success": metrics.get("success/depth_1"),
            "rollout_success_per_depth": dict(sorted(success.items(), key=lambda kv: int(kv[0]))),
            "rollout_trees": metrics.get("samples/num_trees"),
            "rollout_tokens": metrics.get("tokens/completion_total"),
            "rollout_delegation_rate": metrics.get("tree/delegation_rate"),
            "rollout_end_reasons": {k.removeprefix("end/"): v for k, v in sorted(metrics.items())
                                    if k.startswith("end/")},
            "samples": metrics.get("samples/num_samples"), "signal_samples": metrics.get("samples/num_signal_samples"),
            "optimizer_steps": int(metrics.get("train/step") or 0),
            "samples_per_depth": dict(sorted(per_depth.items(), key=lambda kv: int(kv[0]))),
            "staleness": dict(sorted(((k.removeprefix("staleness/lag_").removesuffix("_samples"), v)
                                      for k, v in metrics.items()
                                      if k.startswith("staleness/lag_") and k.endswith("_samples")),
                                     key=lambda kv: int(kv[0]))),
            "train": {k.removeprefix("train/"): v for k, v in sorted(metrics.items()) if k.startswith("train/")}}


def write_tree_sample(path: Path, trees: Sequence[Any], max_bytes: int = TREE_FILE_MAX_BYTES) -> int:
    """Write ``trees`` (``ExecutionTree`` objects or their JSON dicts, e.g. compact ones from
    ``rao_core.evaluation.tree_sample``) as gzipped JSON lines at ``path``, atomically and byte for byte the
    same for the same trees (no time stamp in the gzip header). Trees at the end are dropped until the file
    is at most ``max_bytes``; nothing is written when none fits or none is given. Returns the trees written."""
    lines = [tree_json_line(t if isinstance(t, ExecutionTree) else ExecutionTree.model_validate(t)) for t in trees]
    while lines:
        data = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
        if len(data) <= max_bytes:
            with atomic_path(path) as tmp:
                Path(tmp).write_bytes(data)
            return len(lines)
        lines.pop()
    return 0


def read_tree_sample(path: Path) -> list[Any]:
    """The trees of a stored-trees file (:func:`write_tree_sample`) as ``ExecutionTree`` objects; ValueError
    naming the file and line of a bad record, FileNotFoundError for a missing file."""
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(ExecutionTree.model_validate_json(line))
                except ValueError as e:
                    raise ValueError(f"{path}:{i}: not a valid execution tree record: {one_line_error(e)}") from None
    return out


def experiment_record(experiment: str, rows: list[dict[str, Any]], meta: dict[str, Any],
                      checkpoints: dict[tuple[str, int], str | None], config: dict[str, Any],
                      training: list[dict[str, Any]] | None = None,
                      tree_files: dict[tuple[str, int, str, str], tuple[str, int]] | None = None) -> dict[str, Any]:
    """The ``docs/results/<experiment>.json`` record: points (with :data:`POINT_KEYS` and, from
    ``tree_files`` ``{point_key: (path, trees)}``, ``trees`` and ``trees_stored``), the per-iteration
    ``training`` statistics (:func:`iteration_stats` rows with their ``arm`` and ``iteration``), the run's
    ``arm``/``arms``, ``seed``, ``eval_seed``, commits, ``endpoint`` and ``single_max_steps`` (the single
    arm's node step limit) from ``meta`` (None when ``meta``
    lacks them), and the test of the recursive arm's last iteration vs its warm start on the first
    evaluated difficulty (recursive mode)."""
    def rel(path: str | None) -> str | None:
        if not path:
            return None
        p = Path(path).resolve()
        return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p)

    tree_files = tree_files or {}

    def stored(r: dict[str, Any]) -> dict[str, Any]:
        f = tree_files.get(point_key(r))
        return {"trees": f[0], "trees_stored": f[1]} if f else {}

    points = [{"arm": r["arm"], "iteration": r["iteration"], "difficulty": r["difficulty"], "mode": r["mode"],
               "n": r["n"], "successes": r["successes"], "success": r["success"], "ci95": r.get("ci95"),
               "mean_depth": r.get("mean_depth"), "delegation_rate": r.get("delegation_rate"),
               **{k: r[k] for k in POINT_KEYS if k in r},
               "checkpoint": rel(checkpoints.get((r["arm"], r["iteration"]))), **stored(r)} for r in rows]
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
    arms = meta.get("arms") or list(dict.fromkeys(p["arm"] for p in points))
    return {"experiment": experiment, "command": meta["command"], "config": meta["config"],
            "arm": arms[0] if len(arms) == 1 else None, "arms": arms, "seed": meta["seed"],
            "eval_seed": meta.get("eval_seed"), "dev_seed": meta.get("dev_seed"), "commit": meta["commit"],
            "config_commit": meta.get("config_commit"), "config_dirty": meta.get("config_dirty"),
            "endpoint": meta.get("endpoint"), "task_sets": meta.get("task_sets"), "date": meta["date"],
            "wall_s": round(meta["wall_s"], 1), "single_max_steps": meta.get("single_max_steps"),
            "config_values": config, "points": points,
            "training": list(training or []), "warm_start": meta.get("warm_start"), "test": test,
            "arm_tests": arm_tests(points)}


def _last_point(points: list[dict[str, Any]], arm: str, difficulty: str) -> dict[str, Any] | None:
    ps = [p for p in points if p["arm"] == arm and p["mode"] == ARM_MODES.get(arm, arm) and p["difficulty"] == difficulty]
    return max(ps, key=lambda p: p["iteration"]) if ps else None


def arm_tests(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pair of :data:`ARM_PAIRS` that both ran (recursive vs single, recursive vs outcome, outcome vs
    single; each arm in its own evaluation mode, :data:`ARM_MODES`) at each arm's last iteration, per
    difficulty: one-sided pooled two-proportion z-test of H1: first arm > second (one seed: evaluation noise
    only; :func:`seed_comparison` is the test over seeds). Rows of the recursive-vs-single pair keep their
    old keys (``recursive``, ``single``); every row has ``arm``, ``against``, ``arm_point`` and
    ``against_point``. Empty without two arms."""
    out = []
    for diff in dict.fromkeys(p["difficulty"] for p in points):
        for a, b in ARM_PAIRS:
            pa, pb = _last_point(points, a, diff), _last_point(points, b, diff)
            if pa is None or pb is None:
                continue
            t = two_proportion_test(pb["successes"], pb["n"], pa["successes"], pa["n"])
            out.append({"difficulty": diff, "arm": a, "against": b, a: [pa["successes"], pa["n"]],
                        f"{a}_iteration": pa["iteration"], b: [pb["successes"], pb["n"]],
                        f"{b}_iteration": pb["iteration"], "arm_point": [pa["successes"], pa["n"]],
                        "against_point": [pb["successes"], pb["n"]], "difference": pa["success"] - pb["success"],
                        "test": f"pooled two-proportion z-test, one-sided ({a} > {b})", **t})
    return out


def paired_sign_test(tables: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The over-tasks test of :func:`seed_comparison`: ``tables`` holds one ``(arm's, against's)`` pair of
    per-task outcome maps (task id -> outcome in [0, 1] or None) per seed. For each task present, with an
    outcome, in every map, D_t = mean over seeds of (arm - against); a one-sided exact sign test (binomial,
    p = 1/2; H1: arm > against) on the tasks with D_t != 0. Returns ``tasks_paired``, ``tasks_arm_better``,
    ``tasks_against_better`` and ``p`` (1.0 when no task differs). Pooling seeds this way does not pretend to
    add tasks: the same task in every seed is one pair."""
    from scipy import stats

    common = set.intersection(*(set(a) & set(b) for a, b in tables)) if tables else set()
    diffs = {}
    for t in sorted(common):
        vals = [(a[t], b[t]) for a, b in tables]
        if any(x is None or y is None for x, y in vals):
            continue
        diffs[t] = sum(x - y for x, y in vals) / len(vals)
    pos, neg = sum(1 for d in diffs.values() if d > 0), sum(1 for d in diffs.values() if d < 0)
    p = float(stats.binomtest(pos, pos + neg, 0.5, alternative="greater").pvalue) if pos + neg else 1.0
    return {"tasks_paired": len(diffs), "tasks_arm_better": pos, "tasks_against_better": neg, "p": p}


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down correction (Holm 1979) of ``pvalues`` at family-wise level ``alpha``: sorted
    ascending, the k-th smallest (k = 0, 1, ...) is rejected while p_(k) < alpha / (m - k); at the first that is
    not, it and every larger one are kept. Returns, in the input's order, whether each is rejected: its adjusted
    p-value (:func:`rao_core.regression.holm_adjusted`, the nightly's) below ``alpha``.
    With two tests: the smaller p < alpha / 2 and then the larger < alpha."""
    from rao_core.regression import holm_adjusted

    return [p < alpha for p in holm_adjusted(pvalues)]


def seed_comparison(records: list[dict[str, Any]], arm: str, against: str, difficulty: str,
                    alpha: float = 0.05, min_difference: float | None = None) -> dict[str, Any] | None:
    """A comparison over seeds that accounts for them (docs/results.md; /work spec experiments.md): ``arm``'s
    last point vs ``against`` (another arm's last point, or ``"warm_start"``: the same arm's iteration 0) on
    ``difficulty``, from the per-task outcomes of every seed's record.

    Two tests, both one-sided (H1: arm > against):

    - over tasks (the preregistered one): for each task evaluated in every seed, D_t = mean over seeds of
      (arm's outcome - against's outcome); an exact sign test (binomial, p = 1/2) on the tasks with D_t != 0.
      The same tasks in every seed are paired, so pooling seeds does not pretend to add tasks;
    - over seeds: the per-seed differences of success rate d_s, a one-sample t-test (df = seeds - 1), with
      their mean and range; with three seeds it has little power and is reported, not required.

    ``supported`` (the preregistered rule): the task-level p < ``alpha`` and every d_s > 0, and, with
    ``min_difference`` (``eval.endpoint.min_difference``), the pooled difference (successes summed over seeds,
    ``pooled_difference``) at least that (``all_seeds_positive`` and ``min_difference_met`` say the last two).

    Returns None when no record has both points with per-task outcomes. Units: rates in [0, 1].
    """
    from scipy import stats

    per_seed, tables = [], []
    for rec in sorted(records, key=lambda r: r["seed"]):
        pts = rec.get("points", [])
        pa = _last_point(pts, arm, difficulty)
        if against == "warm_start":
            ps = [p for p in pts if p["arm"] == arm and p["mode"] == ARM_MODES.get(arm, arm)
                  and p["difficulty"] == difficulty and p["iteration"] == 0]
            pb = ps[0] if ps else None
        else:
            pb = _last_point(pts, against, difficulty)
        if not pa or not pb or not pa.get("per_task") or not pb.get("per_task"):
            continue
        per_seed.append({"seed": rec["seed"], "arm": [pa["successes"], pa["n"]], "against": [pb["successes"], pb["n"]],
                         "arm_iteration": pa["iteration"], "against_iteration": pb["iteration"],
                         "difference": pa["success"] - pb["success"]})
        tables.append((pa["per_task"], pb["per_task"]))
    if not per_seed:
        return None
    sign = paired_sign_test(tables)
    paired, pos, neg, p_tasks = sign["tasks_paired"], sign["tasks_arm_better"], sign["tasks_against_better"], sign["p"]
    ds = [s["difference"] for s in per_seed]
    p_seeds = (float(stats.ttest_1samp(ds, 0.0, alternative="greater").pvalue)
               if len(ds) > 1 and len(set(ds)) > 1 else float("nan"))
    pooled = {k: [sum(s[k][0] for s in per_seed), sum(s[k][1] for s in per_seed)] for k in ("arm", "against")}
    ci = {k: list(wilson_interval(min(v[0], v[1]), v[1])) for k, v in pooled.items()}
    pooled_diff = pooled["arm"][0] / pooled["arm"][1] - pooled["against"][0] / pooled["against"][1]
    big_enough = min_difference is None or pooled_diff >= min_difference - 1e-12
    return {"arm": arm, "against": against, "difficulty": difficulty, "seeds": [s["seed"] for s in per_seed],
            "per_seed": per_seed, "pooled": pooled, "pooled_ci95": ci,
            "mean_difference": sum(ds) / len(ds), "difference_range": [min(ds), max(ds)],
            "tasks_paired": paired, "tasks_arm_better": pos, "tasks_against_better": neg,
            "p_tasks_sign_test": p_tasks, "p_seeds_t_test": p_seeds, "alpha": alpha,
            "pooled_difference": pooled_diff, "min_difference": min_difference,
            "all_seeds_positive": all(d > 0 for d in ds), "min_difference_met": big_enough,
            "supported": bool(p_tasks < alpha and all(d > 0 for d in ds) and big_enough),
            "test": "one-sided exact sign test over tasks on the seed-averaged per-task difference (preregistered); "
                    "one-sided t-test over the per-seed differences (reported)"}


def _rerun_key(p: dict[str, Any]) -> tuple:
    """A point's identity across records: arm, the checkpoint's iteration (``iteration``, or a study point's
    ``checkpoint_iteration``), mode and difficulty."""
    return p["arm"], p.get("iteration", p.get("checkpoint_iteration")), p["mode"], p["difficulty"]


def mcnemar_exact(pairs: Sequence[tuple[float, float]]) -> tuple[int, int, float]:
    """McNemar's exact test of paired binary outcomes ``(first, second)`` per task: ``(up, down, p)`` with ``up``
    the tasks only the second solved, ``down`` those only the first solved, and ``p`` the two-sided exact sign
    test (binomial, p = 1/2) on the ``up + down`` discordant tasks (1.0 when there is none). Units: tasks."""
    from scipy import stats

    up, down = sum(1 for x, y in pairs if y > x), sum(1 for x, y in pairs if y < x)
    return up, down, float(stats.binomtest(up, up + down, 0.5).pvalue) if up + down else 1.0


def rerun_comparison(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two evaluations of one design on the same held-out tasks compared point by point: a seed retrained, the same
    seed on another machine, or one checkpoint evaluated twice (an experiment record against a checkpoint study's,
    whose points are matched by ``checkpoint_iteration``). For every (arm, iteration, mode, difficulty) in both
    records with per-task outcomes, paired by task id: the successes of each, the tasks only the second solved
    (``second_better``) and only the first (``first_better``), and a two-sided exact sign test (binomial, p = 1/2)
    on those discordant tasks, McNemar's exact test: under H0 the two are draws of one process.

    Returns ``{"rows": [...] (in the first record's order), "unmatched": [point keys of either record without a
    partner]}``. Raises ValueError when the records have different ``eval_seed`` (other held-out tasks), when an
    outcome is not 0 or 1 (graded partial credit: the test needs binary outcomes), or when no point pairs with
    another. Units: counts of tasks."""
    if first.get("eval_seed") != second.get("eval_seed"):
        raise ValueError(f"the two records did not evaluate the same tasks (eval_seed: {first.get('eval_seed')!r} vs "
                         f"{second.get('eval_seed')!r}); a rerun comparison pairs the same held-out tasks")
    mine = [p for p in first.get("points", []) if p.get("per_task")]
    theirs = {_rerun_key(p): p for p in second.get("points", []) if p.get("per_task")}
    rows, paired = [], set()
    for a in mine:
        key = _rerun_key(a)
        b = theirs.get(key)
        if b is None:
            continue
        paired.add(key)
        pairs = [(a["per_task"][t], b["per_task"][t]) for t in sorted(set(a["per_task"]) & set(b["per_task"]))]
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
        if any(v not in (0, 1) for pair in pairs for v in pair):
            raise ValueError(f"point {key}: per-task outcomes other than 0 and 1 (graded partial credit); "
                             "McNemar's test needs binary outcomes")
        up, down, p = mcnemar_exact(pairs)
        n = len(pairs)
        s1, s2 = sum(x for x, _ in pairs), sum(y for _, y in pairs)
        arm, it, mode, diff = key
        rows.append({"arm": arm, "iteration": it, "mode": mode, "difficulty": diff,
                     "n": n, "first": s1, "second": s2, "first_ci95": list(wilson_interval(s1, n)),
                     "second_ci95": list(wilson_interval(s2, n)), "second_better": up, "first_better": down,
                     "p_two_sided": p,
                     "test": "two-sided exact sign test on the discordant tasks (McNemar exact)"})
    if not rows:
        raise ValueError("no point of the first record has per-task outcomes matching a point of the second "
                         "(same arm, iteration, mode and difficulty)")
    unmatched = [k for k in dict.fromkeys([*map(_rerun_key, mine), *theirs]) if k not in paired]
    return {"rows": rows, "unmatched": unmatched}


def rerun_markdown(first: dict[str, Any], second: dict[str, Any], names: tuple[str, str]) -> str:
    """A markdown table of :func:`rerun_comparison` (``names``: the two records' labels, e.g. their files), with
    each record's seed, commit and date above it and the points left unpaired below it."""
    out = rerun_comparison(first, second)
    lines = [f"Run 1: `{names[0]}` (seed {first.get('seed')}, commit `{first.get('commit')}`, {first.get('date')}); "
             f"run 2: `{names[1]}` (seed {second.get('seed')}, commit `{second.get('commit')}`, {second.get('date')}); "
             f"held-out tasks paired by id (eval.seed {first.get('eval_seed')}).", "",
             "| arm | iteration | mode | difficulty | n | run 1 | 95% CI | run 2 | 95% CI | only run 2 solved | "
             "only run 1 solved | p (two-sided, exact sign test on them) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        c1, c2 = (f"[{lo:.2f}, {hi:.2f}]" for lo, hi in (r["first_ci95"], r["second_ci95"]))
        lines.append(f"| {r['arm']} | {r['iteration']} | {r['mode']} | {r['difficulty']} | {r['n']} | "
                     f"{r['first']:g}/{r['n']} | {c1} | {r['second']:g}/{r['n']} | {c2} | {r['second_better']} | "
                     f"{r['first_better']} | {r['p_two_sided']:.3f} |")
    if out["unmatched"]:
        lines += ["", "Not paired (in one record only): " + "; ".join(" ".join(map(str, k)) for k in out["unmatched"])
                  + "."]
    return "\n".join(lines) + "\n"


def comparisons_markdown(experiment: str, records: list[dict[str, Any]], difficulty: str | None = None) -> str:
    """The ``## Seeds: <experiment>`` section for experiments with per-task outcomes: per evaluated difficulty
    (``difficulty``: that one only), every arm's last iteration vs its warm start and every pair of
    :data:`ARM_PAIRS`, by :func:`seed_comparison`, one row each; the preregistered endpoint (``eval.endpoint``
    of the records: its arm, against and difficulty) is marked and judged with its ``min_difference``."""
    diffs = [difficulty] if difficulty else list(dict.fromkeys(p["difficulty"] for r in records
                                                               for p in r.get("points", [])))
    arms = list(dict.fromkeys(p["arm"] for r in records for p in r.get("points", [])))
    ep = next((r.get("endpoint") for r in records if r.get("endpoint")), None) or {}
    lines = [f"## Seeds: {experiment}"]

    def frac(x: list, ci: list) -> str:
        return f"{x[0]:g}/{x[1]} = {x[0] / x[1]:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if x[1] else ""

    pairs = [(a, "warm_start") for a in arms] + [(a, b) for a, b in ARM_PAIRS if a in arms and b in arms]
    for diff in diffs:
        lines += ["", f"Difficulty {diff}; each row pairs the same held-out tasks across seeds (per-task outcomes).",
                  "", "| comparison | seeds | per-seed (arm vs against) | mean difference [range] | pooled arm | "
                  "pooled against | tasks better / worse | p (sign test, tasks) | p (t-test, seeds) | supported |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for a, b in pairs:
            pre = (ep.get("arm"), ep.get("against")) == (a, b) and ep.get("difficulty", diff) == diff
            c = seed_comparison(records, a, b, diff, min_difference=ep.get("min_difference") if pre else None)
            if c is None:
                continue
            mark = " (preregistered)" if pre else ""
            seeds = "; ".join(f"{s['seed']}: {s['arm'][0]:g}/{s['arm'][1]} vs {s['against'][0]:g}/{s['against'][1]}"
                              for s in c["per_seed"])
            lo, hi = c["difference_range"]
            need = f" (pooled difference >= {c['min_difference']:g}: {c['pooled_difference']:+.2f})" \
                if c["min_difference"] is not None else ""
            lines.append(f"| {a} vs {b}{mark} | {len(c['seeds'])} | {seeds} | {c['mean_difference']:+.2f} [{lo:+.2f}, "
                         f"{hi:+.2f}] | {frac(c['pooled']['arm'], c['pooled_ci95']['arm'])} | "
                         f"{frac(c['pooled']['against'], c['pooled_ci95']['against'])} | {c['tasks_arm_better']} / "
                         f"{c['tasks_against_better']} | {c['p_tasks_sign_test']:.4f} | {c['p_seeds_t_test']:.3f} | "
                         f"{'yes' if c['supported'] else 'no'}{need} |")
    return "\n".join(lines) + "\n"


def preregistered_endpoints(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The primary endpoints the records' config preregistered: ``eval.endpoint`` then each of
    ``eval.co_primary`` (endpoint dicts: ``arm``, ``against``, ``difficulty``, ...), from the first record that
    has an endpoint; empty when none has."""
    for r in records:
        if r.get("endpoint"):
            co = ((r.get("config_values") or {}).get("eval") or {}).get("co_primary") or []
            return [r["endpoint"], *co]
    return []


def primary_verdict(records: list[dict[str, Any]], endpoints: Sequence[dict[str, Any]],
                    alpha: float = 0.05) -> dict[str, Any] | None:
    """The preregistered verdict over seeds: each endpoint of ``endpoints`` (``arm`` vs ``against`` on
    ``difficulty`` at the arms' last points) by :func:`seed_comparison`; its task-level p values corrected
    together by :func:`holm` at ``alpha``. An endpoint **holds** when Holm rejects its null, every seed's
    difference is > 0 and, when it sets ``min_difference``, the pooled difference reaches it. The claim is
    ``supported`` when every endpoint holds, ``mixed`` when some do, ``not supported`` when none does, and
    ``incomplete`` when some endpoint has no comparison yet (a seed or an arm not run). Returns None without
    endpoints. Units: rates in [0, 1]; p values one-sided."""
    if not endpoints:
        return None
    rows = []
    for e in endpoints:
        c = seed_comparison(records, e["arm"], e["against"], e["difficulty"], alpha=alpha,
                            min_difference=e.get("min_difference"))
        rows.append({"arm": e["arm"], "against": e["against"], "difficulty": e["difficulty"], "comparison": c})
    if any(r["comparison"] is None for r in rows):
        verdict = "incomplete"
    else:
        rejected = holm([r["comparison"]["p_tasks_sign_test"] for r in rows], alpha)
        for r, rej in zip(rows, rejected):  # seed_comparison's rule with Holm's threshold in place of alpha
            c = r["comparison"]
            r.update(holm_rejected=rej, all_seeds_positive=c["all_seeds_positive"],
                     holds=bool(rej and c["all_seeds_positive"] and c["min_difference_met"]))
        held = sum(r["holds"] for r in rows)
        verdict = "supported" if held == len(rows) else "mixed" if held else "not supported"
    return {"verdict": verdict, "alpha": alpha, "correction": "holm", "primaries": rows,
            "rule": "each primary: one-sided exact sign test over problems on the seed-averaged per-problem "
                    f"difference, Holm-corrected over the {len(rows)} primaries at alpha {alpha:g}, and every "
                    "seed's difference > 0; all hold: supported; some: mixed; none: not supported"}


def verdict_markdown(v: dict[str, Any]) -> str:
    """The ``### Preregistered verdict`` part of a seeds section: one row per primary endpoint of
    :func:`primary_verdict` (pooled successes, per-seed differences, p, Holm, holds) and the verdict."""
    def yes_no(x: bool | None) -> str:  # None: not judged while another primary has no comparison
        return "-" if x is None else "yes" if x else "no"

    lines = ["### Preregistered verdict", "", f"Rule: {v['rule']}.", "",
             "| primary | difficulty | pooled arm | pooled against | per-seed differences | p (sign test) | "
             "Holm rejects | holds |", "|---|---|---|---|---|---|---|---|"]
    for r in v["primaries"]:
        c = r["comparison"]
        if c is None:
            lines.append(f"| {r['arm']} vs {r['against']} | {r['difficulty']} | not run | | | | | |")
            continue
        a, b = c["pooled"]["arm"], c["pooled"]["against"]
        per = ", ".join(f"{s['difference']:+.2f}" for s in c["per_seed"])
        lines.append(f"| {r['arm']} vs {r['against']} | {r['difficulty']} | {a[0]:g}/{a[1]} | {b[0]:g}/{b[1]} | "
                     f"{per} | {c['p_tasks_sign_test']:.4f} | {yes_no(r.get('holm_rejected'))} | "
                     f"{yes_no(r.get('holds'))} |")
    lines += ["", f"**Verdict: {v['verdict']}.**"]
    return "\n".join(lines) + "\n"


def learning_curve_png(rows: list[dict[str, Any]], path: Path) -> Path:
    """Success vs iteration, one line per (arm, eval mode, difficulty), with Wilson 95% bars; when some
    evaluated tree delegated, a second panel with the depth-1 nodes' success (squares) and the share of
    trees that delegated (triangles, dotted) per (arm, difficulty)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depth1 = [r for r in rows if r.get("child_success") is not None]
    if depth1:  # a second panel: success of the depth-1 nodes (sub-agents) by iteration
        fig, (ax, ax1) = plt.subplots(1, 2, figsize=(11, 4))
        d1: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for r in depth1:
            d1.setdefault((r["arm"], r["mode"], r["difficulty"]), []).append(r)
        for (arm, mode, diff), rs in sorted(d1.items()):
            rs = sorted(rs, key=lambda r: r["iteration"])
            line, = ax1.plot([r["iteration"] for r in rs], [r["child_success"] for r in rs], marker="s",
                             linestyle="-" if arm == "recursive" else "--", label=f"{arm} / {diff}: depth-1 success")
            if all(r.get("delegation_rate") is not None for r in rs):
                ax1.plot([r["iteration"] for r in rs], [r["delegation_rate"] for r in rs], marker="^",
                         linestyle=":", color=line.get_color(), label=f"{arm} / {diff}: delegation rate")
        ax1.set_xlabel("iteration (0 = warm start)")
        ax1.set_ylabel("depth-1 node success / share of trees delegating")
        ax1.set_ylim(-0.02, 1.02)
        ax1.grid(alpha=0.3)
        ax1.legend(fontsize=7)
    else:
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

    for a in fig.axes:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration (0 = warm start)")
    ax.set_ylabel("validation success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
    """Lay out matplotlib figure ``fig``, write it to ``path`` (its folder made) at ``dpi`` and close it; returns
    ``path``. Every plot of the research harness ends here."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def deep_config(config: dict[str, Any] | None) -> bool:
    """Whether a run's config (``CampaignConfig.model_dump``, a record's ``config_values``) lets trees grow
    deeper than one level (``runtime.max_depth`` >= 2 with delegation on): its results get the per-depth
    tables and the depth plot (:func:`depth_markdown`, :func:`depth_png`, :func:`depth_seeds_markdown`)."""
    rt = (config or {}).get("runtime") or {}
    return int(rt.get("max_depth") or 0) >= 2 and rt.get("delegation", True) is not False


def depth_reach(depth_hist: dict[str, int], depth: int) -> tuple[int, int]:
    """(trees of depth >= ``depth``, all trees) of a point's ``depth_hist`` ({tree depth: trees})."""
    return (sum(c for d, c in depth_hist.items() if int(d) >= depth), sum(depth_hist.values()))


def _frac(k: float, n: int) -> str:
    """``k/n = rate [lo, hi]`` with the Wilson 95% interval; empty for n = 0."""
    if not n:
        return ""
    lo, hi = wilson_interval(min(k, n), n)
    return f"{k:g}/{n} = {k / n:.2f} [{lo:.2f}, {hi:.2f}]"


def _max_tree_depth(points: list[dict[str, Any]]) -> int:
    return max((int(d) for p in points for d in (p.get("depth_hist") or {})), default=0)


def depth_markdown(rows: list[dict[str, Any]]) -> str:
    """Two tables of an experiment's points (rows or record points with ``per_depth`` and ``depth_hist``,
    ``rao_core.evaluation.depth_stats``): per depth of every point, its nodes, their success (mean verifier
    value of the scored ones), delegation rate, children per node and end reasons; per point, the depth
    histogram of the evaluated trees and the share that reached each depth >= 1 (Wilson 95%). Empty when no
    row has per-depth statistics (rows recorded before per-depth statistics existed)."""
    rows = [r for r in rows if r.get("per_depth")]
    if not rows:
        return ""

    def cell(v: Any) -> str:
        return "" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["### Per depth", "",
             "| arm | iteration | eval mode | difficulty | depth | nodes | success | delegation rate | "
             "children per node | end reasons |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for d, st in sorted(r["per_depth"].items(), key=lambda kv: int(kv[0])):
            ends = ", ".join(f"{k} {v}" for k, v in st.get("end_reasons", {}).items())
            lines.append(f"| {r['arm']} | {r['iteration']} | {r['mode']} | {r['difficulty']} | {d} | {st['nodes']} | "
                         f"{cell(st.get('success'))} | {cell(st.get('delegation_rate'))} | "
                         f"{cell(st.get('children_per_node'))} | {ends} |")
    deepest = max(1, _max_tree_depth(rows))
    lines += ["", "### Depth of the evaluated trees", "",
              "| arm | iteration | eval mode | difficulty | trees by depth | "
              + " | ".join(f"depth >= {d}" for d in range(1, deepest + 1)) + " |",
              "|---|---|---|---|---|" + "---|" * deepest]
    for r in rows:
        hist = r.get("depth_hist") or {}
        reach = " | ".join(_frac(*depth_reach(hist, d)) for d in range(1, deepest + 1))
        lines.append(f"| {r['arm']} | {r['iteration']} | {r['mode']} | {r['difficulty']} | "
                     f"{', '.join(f'{d}: {c}' for d, c in hist.items())} | {reach} |")
    return "\n".join(lines) + "\n"


def depth_seeds_markdown(records: list[dict[str, Any]]) -> str:
    """Per seed and pooled over seeds, for each arm (in its evaluation mode, :data:`ARM_MODES`) and evaluated
    difficulty, the warm start and the last iteration: root success and the share of trees that reached each
    depth >= 1 (both with Wilson 95% intervals; pooled = counts summed over seeds), and the success of the nodes
    at each depth >= 1 (mean verifier value, with their number). Empty without per-depth statistics."""
    pts = [p for r in records for p in r.get("points", []) if p.get("per_depth")]
    if not pts:
        return ""
    deepest = max(1, _max_tree_depth(pts))
    ds = range(1, deepest + 1)
    lines = ["### Per depth over seeds", "",
             "| arm | difficulty | seed | iteration | success | " + " | ".join(f"trees at depth >= {d}" for d in ds)
             + " | " + " | ".join(f"depth-{d} node success (nodes)" for d in ds) + " |",
             "|---|---|---|---|---|" + "---|" * (2 * deepest)]
    arms = list(dict.fromkeys(p["arm"] for p in pts))
    for arm in arms:
        for diff in dict.fromkeys(p["difficulty"] for p in pts):
            for which in ("warm start", "last"):
                tot = {"s": [0.0, 0], "reach": {d: [0, 0] for d in ds}, "nodes": {d: [0.0, 0] for d in ds}}
                seeds = 0
                for rec in sorted(records, key=lambda r: r["seed"]):
                    ps = [p for p in rec.get("points", []) if p["arm"] == arm and p["difficulty"] == diff
                          and p["mode"] == ARM_MODES.get(arm, arm) and p.get("per_depth")]
                    if not ps:
                        continue
                    p = (min if which == "warm start" else max)(ps, key=lambda q: q["iteration"])
                    seeds += 1
                    hist, per = p.get("depth_hist") or {}, p["per_depth"]
                    tot["s"][0] += p["successes"]
                    tot["s"][1] += p["n"] - p.get("unscored", 0)
                    reach, node = [], []
                    for d in ds:
                        k, n = depth_reach(hist, d)
                        tot["reach"][d][0] += k
                        tot["reach"][d][1] += n
                        reach.append(_frac(k, n))
                        st = per.get(str(d)) or {}
                        if st.get("success") is not None:
                            tot["nodes"][d][0] += st["success"] * st["scored"]
                            tot["nodes"][d][1] += st["scored"]
                        node.append("" if st.get("success") is None else f"{st['success']:.2f} ({st['nodes']})")
                    lines.append(f"| {arm} | {diff} | {rec['seed']} | {p['iteration']} | "
                                 f"{_frac(p['successes'], p['n'] - p.get('unscored', 0))} | " + " | ".join(reach)
                                 + " | " + " | ".join(node) + " |")
                if seeds > 1:
                    reach = [_frac(*tot["reach"][d]) for d in ds]
                    node = [f"{tot['nodes'][d][0] / tot['nodes'][d][1]:.2f} ({tot['nodes'][d][1]} scored)"
                            if tot["nodes"][d][1] else "" for d in ds]
                    lines.append(f"| {arm} | {diff} | pooled ({seeds} seeds) | {which} | {_frac(*tot['s'])} | "
                                 + " | ".join(reach) + " | " + " | ".join(node) + " |")
    return "\n".join(lines) + "\n"


def depth_png(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """The depth plot of an experiment whose trees may grow deeper than one level: left, the success of the
    nodes at each depth by iteration, one line per (arm, difficulty, depth) (depth 0 = the roots: the
    difficulty's success); right, the depth histogram of the evaluated trees (share of trees per depth) of
    each (arm, difficulty) at its first and last iteration. None (nothing written) when no row has per-depth
    statistics."""
    rows = [r for r in rows if r.get("per_depth")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax, axh) = plt.subplots(1, 2, figsize=(11, 4))
    series: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["arm"], r["mode"], r["difficulty"]), []).append(r)
    styles = ["-", "--", ":", "-."]
    for k, ((arm, mode, diff), rs) in enumerate(sorted(series.items())):
        rs = sorted(rs, key=lambda r: r["iteration"])
        for d in sorted({d for r in rs for d in r["per_depth"]}, key=int):
            pts = [(r["iteration"], r["per_depth"][d]["success"]) for r in rs
                   if d in r["per_depth"] and r["per_depth"][d].get("success") is not None]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="os^vD"[int(d) % 5],
                        linestyle=styles[k % len(styles)], color=f"C{int(d)}", label=f"{arm} / {diff}: depth {d}")
    ax.set_xlabel("iteration (0 = warm start)")
    ax.set_ylabel("node success at each depth")
    ax.set_ylim(-0.02, 1.02)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    bars = []
    for (arm, mode, diff), rs in sorted(series.items()):
        its = sorted({r["iteration"] for r in rs})
        for it in dict.fromkeys([its[0], its[-1]]):
            r = next(x for x in rs if x["iteration"] == it)
            hist = r.get("depth_hist") or {}
            total = sum(hist.values()) or 1
            bars.append((f"{arm} / {diff} / it {it}", {int(d): c / total for d, c in hist.items()}))
    depths = sorted({d for _, h in bars for d in h}) or [0]
    width = 0.8 / max(1, len(bars))
    for j, (label, h) in enumerate(bars):
        axh.bar([d + (j - (len(bars) - 1) / 2) * width for d in depths], [h.get(d, 0.0) for d in depths],
                width=width, label=label)
    axh.set_xticks(depths)
    axh.set_xlabel("tree depth (0 = the root alone)")
    axh.set_ylabel("share of evaluated trees")
    axh.set_ylim(0, 1.02)
    axh.grid(alpha=0.3, axis="y")
    axh.legend(fontsize=7)
    return save_figure(fig, path)


def _section_title(experiment: str) -> str:
    if experiment == "textcraft-cpu":
        return "## Learning curve: recursive vs single agent (TextCraft-Synth, CPU)"
    return f"## Learning curve: {experiment}"


def results_markdown(rows: list[dict[str, Any]], meta: dict[str, Any], experiment: str = "textcraft-cpu",
                     img: str = "learning_curve.png", test: dict[str, Any] | None = None,
                     arm_tests_: list[dict[str, Any]] | None = None, depth_img: str | None = None) -> str:
    """The results section of docs/results.md for ``experiment`` (``arm_tests_``: :func:`arm_tests`); with
    ``depth_img`` (trees deeper than one level: :func:`deep_config`) also that plot (:func:`depth_png`) and the
    per-depth tables (:func:`depth_markdown`)."""
    arm_tests_ = arm_tests_ or []
    lines = [
        _section_title(experiment), "",
        f"Command: `{meta['command']}`  ", f"Config: `{meta['config']}` (seed {meta['seed']}), commit `{meta['commit']}`, "
        f"run on {meta['date']}, total wall time {meta['wall_s'] / 60:.1f} min.  ",
        f"Validation: {meta['n_tasks']} held-out tasks per difficulty (targets never seen in training"
        + (f"; eval.seed {meta['eval_seed']}" if meta.get("eval_seed") is not None else "")
        + "); success with Wilson 95% intervals.", "", f"![learning curve](img/{img})", "",
    ]
    if meta.get("endpoint"):
        e = meta["endpoint"]
        lines[-4:-4] = [f"Preregistered endpoint: arm {e['arm']}, {e['difficulty']}, {e['mode']} mode, iteration "
                        f"{e['iteration']} against {e['against']}, test {e['test']}, n = {e['n']}; other comparisons "
                        "are exploratory.  "]
    # the delegation columns appear when some evaluated tree has children (older records: the old table)
    wide = any(r.get("child_success") is not None for r in rows)
    if wide:
        lines += ["| arm | iteration | eval mode | difficulty | n | success | 95% CI | mean depth | delegation rate | "
                  "depth-1 success | parallel share | tree wall (s) | tokens per tree | iteration wall (s) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["| arm | iteration | eval mode | difficulty | n | success | 95% CI | mean depth | delegation rate | "
                  "iteration wall (s) |", "|---|---|---|---|---|---|---|---|---|---|"]

    def cell(v: Any) -> str:
        return "" if v is None else str(v)

    for r in rows:
        mid = (f" {cell(r.get('child_success'))} | {cell(r.get('parallel_share'))} | {cell(r.get('tree_wall_s'))} | "
               f"{cell(r.get('tokens_per_tree'))} |" if wide else "")
        lines.append(f"| {r['arm']} | {r['iteration']} | {r['mode']} | {r['difficulty']} | {r['n']} | {r['success']:.2f} | "
                     f"{r['ci95']} | {r['mean_depth']} | {r.get('delegation_rate', '')} |{mid} "
                     f"{r.get('iteration_wall_s', '')} |")
    if test:
        lines += ["", f"Test ({test['test']}): recursive arm, {test['difficulty']}, iteration {test['final_iteration']} "
                  f"({test['final'][0]:g}/{test['final'][1]}) vs iteration {test['baseline_iteration']} "
                  f"({test['baseline'][0]:g}/{test['baseline'][1]}): difference {test['difference']:+.3f}, "
                  f"z = {test['z']:.2f}, p = {test['p_value']:.4f} (two-sided {test['p_value_two_sided']:.4f}). "
                  f"Record: `docs/results/{experiment}.json`."]
    for a in arm_tests_:
        x, y = a.get("arm", "recursive"), a.get("against", "single")
        lines += ["", f"Arms ({a['test']}), {a['difficulty']}: {x} iteration {a[f'{x}_iteration']} "
                  f"({a[x][0]:g}/{a[x][1]}) vs {y} iteration {a[f'{y}_iteration']} "
                  f"({a[y][0]:g}/{a[y][1]}): difference {a['difference']:+.3f}, z = {a['z']:.2f}, "
                  f"p = {a['p_value']:.4f}."]
    if depth_img:
        lines += ["", f"![node success by depth and the depth of the evaluated trees](img/{depth_img})", "",
                  depth_markdown(rows).rstrip("\n")]
    return "\n".join(lines) + "\n"


def replace_section(doc: Path, title: str, md: str) -> None:
    """Replace the ``title`` section of markdown file ``doc`` (from the title to the next ``## `` section) by
    ``md``, or append it; other sections are kept; the file is replaced atomically."""
    old = doc.read_text() if doc.exists() else "# Results\n"
    head, _, rest = old.partition(title)
    nxt = rest.find("\n## ")  # keep any later sections (other experiments)
    tail = rest[nxt:] if (rest and nxt >= 0) else ""
    with atomic_path(doc) as tmp:
        Path(tmp).write_text(head.rstrip() + "\n\n" + md + tail)


def seeds_markdown(experiment: str, records: list[dict[str, Any]]) -> str:
    """Side-by-side and pooled results of several seeds of one experiment (``records``: their
    ``docs/results/*.json`` records): per seed, the recursive arm's warm start vs last iteration and the
    arms at the last iteration on the first difficulty (computed from the points for records older than
    ``arm_tests``); pooled: successes summed over seeds, with the same one-sided two-proportion z-tests on the
    sums (seeds treated as one larger sample); recursive vs single over the seeds that ran both arms only."""
    lines = [f"## Seeds: {experiment}", "",
             "| seed | record | recursive: warm start | recursive: last | p (last > warm start) | single: last | "
             "p (recursive > single) |", "|---|---|---|---|---|---|---|"]
    tot = {"base": [0.0, 0], "final": [0.0, 0], "single": [0.0, 0], "paired": [0.0, 0]}  # paired: seeds with both arms

    def frac(x: list) -> str:
        lo, hi = wilson_interval(min(x[0], x[1]), x[1])
        return f"{x[0]:g}/{x[1]} = {x[0] / x[1]:.2f} [{lo:.2f}, {hi:.2f}]" if x[1] else ""

    for rec in records:
        t = rec.get("test") or {}
        tests = rec.get("arm_tests") or arm_tests(rec.get("points", []))  # records older than arm_tests
        arm = next((a for a in tests if a["difficulty"] == t.get("difficulty")
                    and (a.get("arm"), a.get("against")) in (("recursive", "single"), (None, None))), None)
        if t:
            for k, v in (("base", t["baseline"]), ("final", t["final"])):
                tot[k][0] += v[0]
                tot[k][1] += v[1]
        if arm:
            for k, v in (("single", arm["single"]), ("paired", arm["recursive"])):
                tot[k][0] += v[0]
                tot[k][1] += v[1]
        lines.append(f"| {rec['seed']} | `docs/results/{rec['experiment']}.json` | {frac(t['baseline']) if t else ''} | "
                     f"{frac(t['final']) if t else ''} | {t.get('p_value', float('nan')):.4f} | "
                     f"{frac(arm['single']) if arm else ''} | {arm['p_value'] if arm else float('nan'):.4f} |")
    if len(records) > 1 and tot["base"][1] and tot["final"][1]:
        p1 = two_proportion_test(*tot["base"], *tot["final"])["p_value"]
        p2 = (two_proportion_test(*tot["single"], *tot["paired"])["p_value"] if tot["single"][1] else float("nan"))
        lines.append(f"| pooled | {len(records)} seeds | {frac(tot['base'])} | {frac(tot['final'])} | {p1:.4f} | "
                     f"{frac(tot['single']) if tot['single'][1] else ''} | {p2:.4f} |")
    return "\n".join(lines) + "\n"


def seed_records(experiment: str, root: Path | None = None) -> list[dict[str, Any]]:
    """The stored records of every seed of ``experiment``, ordered by seed: ``docs/results/<experiment>.json``
    (the config's seed) and ``docs/results/<experiment>-seed<S>.json`` under ``root`` (the repository by
    default). Raises FileNotFoundError naming the folder when there is none, ValueError naming a file that
    is not JSON."""
    folder = (root or REPO_ROOT) / "docs/results"
    paths = [folder / f"{experiment}.json", *sorted(folder.glob(f"{experiment}-seed*.json"))]
    records = []
    for p in paths:
        if p.exists() and (p.stem == experiment or p.stem.removeprefix(f"{experiment}-seed").isdigit()):
            try:
                records.append(json.loads(p.read_text()))
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: not a JSON record: {e}") from None
    if not records:
        raise FileNotFoundError(f"no record of {experiment} under {folder} (run `rao experiment {experiment}` first)")
    return sorted(records, key=lambda r: r["seed"])


def write_tree_files(root: Path, experiment: str, trees: dict[tuple[str, int, str, str], list[Any]],
                     max_bytes: int = TREE_FILE_MAX_BYTES) -> dict[tuple[str, int, str, str], tuple[str, int]]:
    """Write each point's stored trees (``trees``: ``{point_key: trees}``) to
    ``<root>/docs/results/trees/<experiment>/`` (:func:`tree_file_name`, :func:`write_tree_sample`), after
    removing the folder's earlier ``*.jsonl.gz`` (a re-run of the experiment replaces them all). Returns
    ``{point_key: (path relative to root, trees written)}`` for the files written."""
    folder = root / "docs/results/trees" / experiment
    for old in folder.glob("*.jsonl.gz") if folder.is_dir() else []:
        old.unlink()
    out = {}
    for key, sample in trees.items():
        path = folder / tree_file_name(*key)
        k = write_tree_sample(path, sample, max_bytes)
        if k:
            out[key] = (str(path.relative_to(root)), k)
    return out


@task(name="write-experiment-results", cache_policy=NONE)
def write_results(experiment: str, rows: list[dict[str, Any]], meta: dict[str, Any],
                  checkpoints: dict[tuple[str, int], str | None], config: dict[str, Any], run_id: str,
                  write_docs: bool = True, out_root: Path | None = None, training: list[dict[str, Any]] | None = None,
                  trees: dict[tuple[str, int, str, str], list[Any]] | None = None) -> dict[str, Any]:
    """Write the experiment's record, plot, markdown section and stored trees; log record and plot to MLflow
    run ``run_id``.

    ``out_root``: where ``docs/`` goes (the repository with ``write_docs``, else a folder named after the
    campaign). ``docs/results.md`` is rewritten only from this experiment's section title to the next
    ``## `` section, so other experiments' sections are kept; each file is replaced atomically.
    ``training``: per-iteration statistics (:func:`iteration_stats` rows); ``trees``: the stored trees of each
    point (:func:`write_tree_files`). Returns ``{"record", "markdown", "plot", "depth_plot"}``
    (``depth_plot``: :func:`depth_png`, for a run whose trees may grow deeper than one level,
    :func:`deep_config`; else None).
    """
    root = out_root or REPO_ROOT
    img_name = "learning_curve.png" if experiment == "textcraft-cpu" else f"{experiment}.png"
    img = learning_curve_png(rows, root / "docs/img" / img_name)
    depth_img = depth_png(rows, root / "docs/img" / f"{experiment}-depth.png") if deep_config(config) else None
    files = write_tree_files(root, experiment, trees or {})
    record = experiment_record(experiment, rows, meta, checkpoints, config, training, files)
    rec_path = root / "docs/results" / f"{experiment}.json"
    rec_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(rec_path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2) + "\n")
    md = results_markdown(rows, meta, experiment=experiment, img=img_name, test=record["test"],
                          arm_tests_=record["arm_tests"], depth_img=depth_img.name if depth_img else None)
    if write_docs:
        replace_section(root / "docs/results.md", _section_title(experiment), md)
    import mlflow

    tracking.log_json(run_id, {"rows": rows, "meta": meta}, "experiment/results.json")
    mlflow.MlflowClient().log_artifact(run_id, str(img), "experiment")
    if depth_img:
        mlflow.MlflowClient().log_artifact(run_id, str(depth_img), "experiment")
    return {"record": record, "markdown": md, "plot": str(img), "depth_plot": str(depth_img) if depth_img else None}
