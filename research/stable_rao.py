"""The stable-RAO check: one warm start, one shared batch of RL trees, trained several ways, evaluated on the same
held-out tasks (docs/experiments/stable-rao.md).

Sharing the trees removes rollout sampling from the comparison: every arm rebuilds its training samples from the
same scored execution trees with its own credit assignment (Eq. 1 bonus and cap, the authors' filters), trains
from the same checkpoint with its own update budget, and is evaluated on the same tasks, so arms are compared
task by task (McNemar's exact test on the discordant tasks). The arms:

- ``old``: the setting of the collapsed ``textcraft-nested`` seeds: the ``useful`` bonus with cap 0.4, no
  filters, up to 12 AdamW steps of 3 micro-batches on the batch from a fresh optimizer state, no warm-up;
- ``default``: the authors' released setting, this project's default (no bonus on TextCraft, zero-variance groups
  and error turns filtered, one optimizer step over the whole batch, the first step warmed up);
- ``useful``: the ``useful`` bonus with cap 0.4 and the bounded update of ``default``.

Each arm is trained with every trainer seed given (``trainer.seed``: the micro-batch order; with one step over
the whole batch the order changes only the floating-point sum). Run it with ``python -m research.stable_rao``.
Docs: docs/experiments/stable-rao.md.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rao_core.config import load_config
from rao_core.envs import get_env
from rao_core.evaluation import EvalConfig, eval_tasks
from rao_core.samples import build_samples
from rao_core.task_sampling import task_identity
from rao_core.train.checkpoint import MANIFEST_NAME, data_hash
from rao_core.train.launch import run_training
from rao_core.tree import read_trees
from research.records import mcnemar_exact, save_figure
from infra.checkpoint_eval import EvalJob, serve_and_evaluate

#: arm -> (algo settings, trainer overrides): module docstring.
ARMS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "old": ({"bonus": "useful", "lam": 0.4, "filter_zero_variance_groups": False, "filter_errors": False},
            {"warmup_steps": 0, "grad_accum": 3, "max_steps": 12}),
    "default": ({"bonus": "useful", "lam": None, "filter_zero_variance_groups": True, "filter_errors": True},
                {"warmup_steps": 2, "grad_accum": None, "max_steps": None, "steps_per_batch": 1}),
    "useful": ({"bonus": "useful", "lam": 0.4, "filter_zero_variance_groups": True, "filter_errors": True},
               {"warmup_steps": 2, "grad_accum": None, "max_steps": None, "steps_per_batch": 1}),
}


def arm_samples(trees: Sequence[Any], arm: str, cfg: Any) -> Any:
    """The training samples of ``arm`` from the shared scored ``trees`` (Eqs. 1, 3, 4, 5 with the arm's bonus cap
    and filters; the config's estimator and depth weights). Returns a ``rao_core.samples.SampleBatch``."""
    algo = cfg.algo.model_copy(update=ARMS[arm][0])
    return build_samples(trees, algo.bonus_weight(cfg.tasks.env), estimator=algo.advantage,
                         depth_weighting=algo.depth_weights, bonus=algo.bonus,
                         filter_zero_variance_groups=algo.filter_zero_variance_groups,
                         filter_errors=algo.filter_errors)


def mcnemar(first: dict[str, float | None], second: dict[str, float | None]) -> dict[str, Any]:
    """McNemar's exact test of two per-task outcome maps (task id -> 1/0/None), paired by task id: the tasks
    only ``second`` solved (``up``) and only ``first`` solved (``down``), and a two-sided exact binomial test
    (p = 1/2) on the ``up + down`` discordant tasks. Tasks missing or unscored in either map are left out."""
    keys = [k for k in first if k in second and first[k] is not None and second[k] is not None]
    up, down, p = mcnemar_exact([(float(first[k] >= 1), float(second[k] >= 1)) for k in keys])  # type: ignore[operator]
    return {"paired_tasks": len(keys), "up": up, "down": down, "p_two_sided": float(f"{p:.4g}")}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _save(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def run_check(config: str, overrides: Sequence[str], warm_start: Path, trees_file: Path, out: Path,
              record_path: Path, seeds: Sequence[int], arms: Sequence[str], n: int, eval_seed: int,
              difficulty: str, command: str) -> dict[str, Any]:
    """Train every (arm, seed) from ``warm_start`` on the shared ``trees_file`` and evaluate the warm start and
    every trained checkpoint on the same ``n`` held-out ``difficulty`` tasks (seed ``eval_seed``), one
    checkpoint at a time; the record (``record_path``, JSON) is written after every point and resumed from (a
    point already in it, or a checkpoint already trained, is not redone); ``calls`` lists every call's command and
    commit (``command``/``commit``: the last one's).

    Raises ValueError for an unknown arm, FileNotFoundError for a missing input, and whatever training or
    serving raises (the record keeps what was done before).
    """
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise ValueError(f"unknown arm(s) {bad}; known: {', '.join(ARMS)}")
    for p in (warm_start, trees_file):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist")
    cfg = load_config(config, list(overrides))
    env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
    trees = read_trees(trees_file)
    record: dict[str, Any] = json.loads(record_path.read_text()) if record_path.exists() else {}
    record.setdefault("experiment", "stable-rao-check")
    record.setdefault("calls", []).append({"command": command, "commit": _git_commit(),
                                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    record.update(command=command, commit=_git_commit(), config=config, overrides=list(overrides),
                  warm_start=str(warm_start), trees_file=str(trees_file), n=n, eval_seed=eval_seed,
                  difficulty=difficulty, arms={a: {"algo": ARMS[a][0], "trainer": ARMS[a][1]} for a in arms},
                  trainer_base=json.loads(cfg.trainer.model_dump_json()))
    record.setdefault("training", {})
    record.setdefault("points", [])
    root_success = [t.root.success for t in trees if t.root.success is not None]
    record["shared_trees"] = {"trees": len(trees), "groups": len({t.group_id for t in trees}),
                              "root_success": round(sum(root_success) / max(len(root_success), 1), 4),
                              "nodes": sum(len(t.nodes) for t in trees)}
    _save(record_path, record)
    out.mkdir(parents=True, exist_ok=True)

    checkpoints: dict[str, Path] = {"warm_start": warm_start}
    for arm in arms:
        batch = arm_samples(trees, arm, cfg)
        for seed in seeds:
            label = f"{arm}-s{seed}"
            ckpt = out / label
            checkpoints[label] = ckpt
            if label in record["training"] and (ckpt / "config.json").is_file():
                continue
            tcfg = cfg.trainer.model_copy(update={**ARMS[arm][1], "seed": seed, "optimizer_state": "reset"})
            tcfg = type(tcfg).model_validate(tcfg.model_dump())  # re-check the arm's combination
            steps: list[dict[str, float]] = []
            t0 = time.monotonic()
            adopted = (ckpt / "config.json").is_file()  # trained elsewhere with this arm's setting (a campaign)
            if adopted:
                manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
                if manifest.get("data_hash") != data_hash(batch.samples):
                    raise ValueError(f"{ckpt} was trained on other samples than arm {arm}'s (data_hash differs)")
                n_steps = int(manifest.get("num_steps", 0))  # only the last step's metrics are in the manifest
                steps = [{}] * (n_steps - 1) + [manifest.get("final_metrics", {})] if n_steps else []
                print(f"{label}: adopting {ckpt} (same samples, {len(steps)} optimizer steps)", flush=True)
            else:
                print(f"{label}: {len(batch)} samples ({batch.stats.num_signal_samples} with signal), "
                      f"update {tcfg.update_budget()}", flush=True)
                run_training(batch, warm_start, ckpt, tcfg, iteration=1, on_step=steps.append,
                             on_status=lambda line, label=label: print(f"{label} train: {line}", flush=True))
            st = batch.stats
            record["training"][label] = {
                "arm": arm, "seed": seed, "optimizer_steps": len(steps), "update_budget": tcfg.update_budget(),
                "adopted": adopted, "train_s": round(time.monotonic() - t0, 1), "samples": len(batch),
                "signal_samples": st.num_signal_samples, "signal_groups": st.num_signal_groups,
                "dropped_uniform_groups": st.dropped_uniform_groups,
                "samples_per_depth": st.samples_per_depth,
                "mean_advantage_per_depth": st.mean_advantage_per_depth,
                "mean_advantage_solved_per_depth": st.mean_advantage_solved_per_depth,
                "lr_per_step": [s.get("train/lr") for s in steps],
                "grad_norm_per_step": [round(s.get("train/grad_norm", math.nan), 4) for s in steps],
                "clip_frac_per_step": [round(s.get("train/clip_frac", math.nan), 5) for s in steps],
            }
            _save(record_path, record)

    done = {p["checkpoint"] for p in record["points"]}
    ecfg = EvalConfig(difficulties=[difficulty], n_tasks=n, seed=eval_seed, modes=["recursive"],
                      stored_trees=0)
    tasks = eval_tasks(env, ecfg, **cfg.tasks.generator_options)
    record["distinct_problems"] = len({task_identity(t) for t in tasks})  # task ids name draws, not problems
    for label, ckpt in checkpoints.items():
        if label in done:
            continue
        job = EvalJob(label=label, config=ecfg, runtime=cfg.runtime, tasks=tasks)
        t0 = time.monotonic()
        (report,) = serve_and_evaluate(cfg, ckpt, [job], env=env, say=lambda s: print(s, flush=True))
        row = report.rows[0]
        record["points"].append({
            "checkpoint": label, "n": row.n, "successes": row.successes, "success": round(row.success, 4),
            "ci95": [round(row.ci_low, 4), round(row.ci_high, 4)], "child_success": row.child_success,
            "delegation_rate": row.delegation_rate, "end_reasons": row.end_reasons, "per_task": row.per_task,
            "per_depth": row.per_depth, "eval_s": round(time.monotonic() - t0, 1)})
        _save(record_path, record)
    record["comparisons"] = comparisons(record)
    _save(record_path, record)
    return record


def comparisons(record: dict[str, Any]) -> list[dict[str, Any]]:
    """McNemar's exact test (:func:`mcnemar`) of every trained checkpoint of ``record`` against the warm start,
    and of every other arm's checkpoint against the ``default`` arm's of the same trainer seed (of seed 0 when
    that seed's was not evaluated: with one optimizer step over the whole batch the seed orders micro-batches
    only). Rows: checkpoint, vs, paired_tasks, up, down, p_two_sided."""
    ref = {p["checkpoint"]: p for p in record.get("points", [])}
    base, out = ref.get("warm_start"), []
    for label, p in ref.items():
        if label == "warm_start":
            continue
        if base is not None:
            out.append({"checkpoint": label, "vs": "warm_start", **mcnemar(base["per_task"], p["per_task"])})
        arm, _, seed = label.rpartition("-s")
        other = ref.get(f"default-s{seed}") or ref.get("default-s0")
        if arm != "default" and other is not None:
            out.append({"checkpoint": label, "vs": other["checkpoint"], **mcnemar(other["per_task"], p["per_task"])})
    return out


def _adv(d: dict[str, float], depth: str) -> str:
    return f"{d[depth]:+.2f}" if depth in d else "-"


def check_markdown(record: dict[str, Any]) -> str:
    """The record's table, one row per evaluated checkpoint: its arm, trainer seed, optimizer steps, training
    samples (with signal), the mean advantage of solved nodes at depths 0 and 1 (Eq. 4 as the arm computes it),
    held-out successes / n with the Wilson 95% interval, and McNemar's exact test against the warm start and
    against the ``default`` arm of the same seed (tasks gained / lost, two-sided p)."""
    cmp = {(c["checkpoint"], c["vs"]): c for c in record.get("comparisons", [])}
    rows = ["| checkpoint | optimizer steps | samples (signal) | solved nodes' mean A, depth 0 / 1 | held-out "
            "success [95% CI] | vs warm start: gained / lost, p | vs default: gained / lost, p |",
            "|---|---|---|---|---|---|---|"]
    for p in record.get("points", []):
        label = p["checkpoint"]
        tr = record.get("training", {}).get(label)
        seed = label.rpartition("-s")[2]
        steps = str(tr["optimizer_steps"]) if tr else "-"
        samples = f"{tr['samples']} ({tr['signal_samples']})" if tr else "-"
        adv = tr["mean_advantage_solved_per_depth"] if tr else {}
        advs = f"{_adv(adv, '0')} / {_adv(adv, '1')}" if tr else "-"
        ci = p["ci95"]
        cells = []
        for vs in ("warm_start", "default"):
            c = cmp.get((label, vs)) or cmp.get((label, f"default-s{seed}")) or cmp.get((label, "default-s0"))
            which = "" if vs == "warm_start" or c is None else f" ({c['vs']})"
            cells.append(f"+{c['up']} / -{c['down']}{which}, p = {c['p_two_sided']:.2g}" if c else "-")
        rows.append(f"| {label} | {steps} | {samples} | {advs} | {p['successes']:g}/{p['n']} [{ci[0]:.2f}, "
                    f"{ci[1]:.2f}] | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


def check_png(record: dict[str, Any], path: Path) -> Path:
    """Held-out success of every evaluated checkpoint of ``record`` (bars, Wilson 95% interval as error bars) and
    the share of its trees that delegated (dots), the warm start first; saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = record.get("points", [])
    x = list(range(len(pts)))
    succ = [p["success"] for p in pts]
    err = [[p["success"] - p["ci95"][0] for p in pts], [p["ci95"][1] - p["success"] for p in pts]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(x, succ, yerr=err, capsize=4, color=["#888888" if p["checkpoint"] == "warm_start" else "#4c72b0"
                                                for p in pts], label="held-out success (95% CI)")
    ax.plot(x, [p.get("delegation_rate") for p in pts], "o", color="#dd8452", label="trees that delegated")
    ax.set_xticks(x, [p["checkpoint"] for p in pts])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(f"share of {pts[0]['n'] if pts else 0} tasks")
    ax.set_title(f"one RL iteration from one warm start ({record.get('difficulty', '')})")
    ax.legend(loc="center right", fontsize=8)
    return save_figure(fig, path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.stable_rao``: :func:`run_check` from the command line; exit 2 on bad input."""
    ap = argparse.ArgumentParser(prog="python -m research.stable_rao", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/experiment-textcraft-nested.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--warm-start", type=Path, required=True, help="the warm-start checkpoint folder")
    ap.add_argument("--trees", type=Path, required=True, help="the shared scored trees (scored.jsonl)")
    ap.add_argument("--out", type=Path, required=True, help="folder of the arms' checkpoints")
    ap.add_argument("--record", type=Path, default=Path("docs/results/stable-rao-check.json"))
    ap.add_argument("--arm", dest="arms", action="append", default=[], help=f"one of {', '.join(ARMS)} (all)")
    ap.add_argument("--seed", dest="seeds", action="append", type=int, default=[], help="trainer seeds (0, 1)")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--eval-seed", type=int, default=20261206)
    ap.add_argument("--difficulty", default="nest1")
    a = ap.parse_args(argv)
    try:
        run_check(a.config, a.overrides, a.warm_start, a.trees, a.out, a.record, a.seeds or [0, 1],
                  a.arms or list(ARMS), a.n, a.eval_seed, a.difficulty,
                  "python -m research.stable_rao " + " ".join(sys.argv[1:] if argv is None else argv))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
