"""Asynchronous RL's wall-clock (issue 40, item 5; results go to docs/benchmarks.md "Asynchronous RL").

Runs the smoke campaign (``configs/cpu-smoke.yaml``) for ``--iterations`` (4) RL iterations through ``rao run``
(the README's path), in three modes, in one run on one machine, repeated ``--repeats`` times in a rotating order:

- ``sync``: the synchronous loop, today's placement (vLLM and the trainer may use every core);
- ``sync-split``: the synchronous loop with the core split (``serving.cpus`` / ``trainer.cpus``);
- ``async-split``: ``algo.max_staleness: 1`` with the core split: the next iteration's generation and this one's
  evaluation beside this one's training (``rao_core.async_rl``).

Each campaign gets a new name, so nothing is resumed. Per campaign, from its stored summary (read back with
``rao_cli.pipeline_cmd.completed_campaign``, as ``rao run`` does): the per-iteration wall-clock, the median of
iterations 2..K (synchronous: the ``iteration k`` rows of its timeline; asynchronous: the ``step k`` rows,
k = 2..K-1, the steps that hold one training, one evaluation and one generation each: step K has no
generation, step K + 1 only an evaluation), and the sum of every iteration/step row; from ``/proc/stat``
sampled each second while ``rao run`` runs, each core's busy share over the whole run and over its RL
iterations only (:func:`rl_window`: without the warm start, the first vLLM start and the base evaluation,
which dilute the overlap). Printed: per
mode min / median / max over repeats, and the ratios async-split / sync and async-split / sync-split of the
per-iteration medians (issue 40's target: async-split <= 0.70 of sync-split).

Run it on an idle machine: about 15-30 min per campaign on 2 cores (a review estimated ~140 min in all for
--repeats 2), 3 x repeats campaigns.

Usage: .venv/bin/python scripts/bench_async.py [--repeats 2] [--iterations 4] [--serving-cpus 1]
       [--trainer-cpus 0] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODES = ("sync", "sync-split", "async-split")


def mode_overrides(mode: str, serving_cpus: list[int], trainer_cpus: list[int]) -> list[str]:
    """The ``--set`` values of ``mode`` (module docstring)."""
    split = [f"serving.cpus={json.dumps(serving_cpus)}", f"trainer.cpus={json.dumps(trainer_cpus)}"]
    return {"sync": [], "sync-split": split, "async-split": split + ["algo.max_staleness=1"]}[mode]


def per_iteration_seconds(summary: dict[str, Any], iterations: int) -> dict[str, float]:
    """From a campaign summary's timeline: ``median_s``, the median wall seconds of iterations 2..``iterations``
    (K) or of the overlapped steps 2..K-1 (each one training, one evaluation and one generation, as an iteration
    is; step K lacks the generation), and ``total_s``, the sum of every iteration/step row (retention rows
    included).

    Raises ValueError when the timeline has neither kind of row."""
    rows = summary["timeline"]["rows"]
    steps = {int(r["stage"].split()[1]): r["s"] for r in rows if r["stage"].startswith("step ")}
    its = {int(r["stage"].split()[1]): r["s"] for r in rows if r["stage"].startswith("iteration ")}
    per = steps or its
    if not per:
        raise ValueError("the summary's timeline has no 'iteration k' or 'step k' row")
    body = [per[k] for k in range(2, iterations + (0 if steps else 1)) if k in per]
    total = sum(r["s"] for r in rows if r["stage"].startswith(("step ", "iteration ", "retention after")))
    return {"median_s": statistics.median(body) if body else float("nan"), "total_s": total}


def rl_window(summary: dict[str, Any]) -> tuple[float, float] | None:
    """(start, end) in epoch seconds of a campaign's RL iterations: from the first ``iteration k`` / ``step k``
    row's start to the last such row's end (the timeline's rows are consecutive intervals from its ``start``);
    None without such rows. The warm start, the first vLLM start and the base evaluation lie before it."""
    t, spans = float(summary["timeline"]["start"]), []
    for r in summary["timeline"]["rows"]:
        if r["stage"].startswith(("iteration ", "step ")):
            spans.append((t, t + float(r["s"])))
        t += float(r["s"])
    return (spans[0][0], spans[-1][1]) if spans else None


class CoreSampler:
    """Each core's busy share (1 - idle - iowait over all jiffies) from ``/proc/stat`` read every ``every_s``
    seconds between :meth:`start` and :meth:`stop`: over the whole span (:meth:`stop`) and over a window of it
    (:meth:`busy_between`, e.g. the RL iterations only)."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s, self._stop = every_s, threading.Event()
        self.samples: list[tuple[float, dict[str, list[int]]]] = []  # (epoch seconds, reading)
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def read() -> dict[str, list[int]]:
        out = {}
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *vals = line.split()
                out[name] = [int(v) for v in vals]
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append((time.time(), self.read()))

    def start(self) -> "CoreSampler":
        self.samples.append((time.time(), self.read()))
        self._thread.start()
        return self

    @staticmethod
    def busy(first: dict[str, list[int]], last: dict[str, list[int]]) -> dict[str, float]:
        out = {}
        for cpu, a in first.items():
            d = [y - x for x, y in zip(a, last[cpu])]
            total = sum(d) or 1
            out[cpu] = round(1 - (d[3] + d[4]) / total, 3)  # idle, iowait
        return out

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), self.read()))
        return self.busy(self.samples[0][1], self.samples[-1][1])

    def busy_between(self, t0: float, t1: float) -> dict[str, float] | None:
        """Busy share per core between the samples nearest to ``t0`` and ``t1`` (epoch seconds); None when
        fewer than two samples fall in the window."""
        inside = [r for t, r in self.samples if t0 - self.every_s <= t <= t1 + self.every_s]
        return self.busy(inside[0], inside[-1]) if len(inside) >= 2 else None


def run_campaign(name: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One ``rao run`` of the smoke config in ``mode``; its per-iteration seconds, wall and core use."""
    from rao_cli.pipeline_cmd import completed_campaign
    from rao_core.config import load_config

    sets = mode_overrides(mode, args.serving_cpus, args.trainer_cpus)
    cmd = [sys.executable, "-m", "rao_cli.main", "run", "--config", "configs/cpu-smoke.yaml", "--name", name,
           "--iterations", str(args.iterations), *[f"--set={s}" for s in sets]]
    print("$ " + " ".join(cmd[1:]), flush=True)
    if args.dry_run:
        return {}
    sampler = CoreSampler().start()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    cores = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"error: {name} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    overrides = dict(s.split("=", 1) for s in sets)
    cfg = load_config(ROOT / "configs/cpu-smoke.yaml", {"name": name, "iterations": args.iterations,
                                                        **{k: json.loads(v) for k, v in overrides.items()}})
    summary = completed_campaign(cfg)
    if summary is None:
        raise SystemExit(f"error: {name} finished but its summary is not stored")
    window = rl_window(summary)
    rl_cores = sampler.busy_between(*window) if window else None
    return {**per_iteration_seconds(summary, args.iterations), "wall_s": wall, "cores": cores, "rl_cores": rl_cores}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--serving-cpus", type=lambda s: [int(c) for c in s.split(",")], default=[1])
    ap.add_argument("--trainer-cpus", type=lambda s: [int(c) for c in s.split(",")], default=[0])
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args()
    stamp = time.strftime("%m%d%H%M")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        order = MODES[r % 3:] + MODES[:r % 3]  # rotated: no mode always runs first on a cold machine
        for mode in order:
            out = run_campaign(f"bench-async-{stamp}-{mode}-r{r}", mode, args)
            if out:
                results[mode].append(out)
                print(f"  {mode} r{r}: per-iteration median {out['median_s']:.0f} s, iterations {out['total_s']:.0f} s,"
                      f" rao run {out['wall_s']:.0f} s, core busy: whole run {out['cores']}, RL iterations "
                      f"{out['rl_cores']}", flush=True)
    if args.dry_run:
        return
    med = {}
    for mode, runs in results.items():
        xs = [o["median_s"] for o in runs]
        med[mode] = statistics.median(xs)
        print(f"{mode:12s} per-iteration s (median of iterations 2-{args.iterations}), over {len(xs)} runs: "
              f"min {min(xs):.0f} / median {med[mode]:.0f} / max {max(xs):.0f}")
    print(f"ratio async-split / sync       = {med['async-split'] / med['sync']:.2f}")
    print(f"ratio async-split / sync-split = {med['async-split'] / med['sync-split']:.2f}  (target <= 0.70)")


if __name__ == "__main__":
    main()
