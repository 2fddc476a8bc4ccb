"""Asynchronous RL's wall-clock (results go to docs/benchmarks/pipeline.md "Asynchronous RL").

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
per-iteration medians (target: async-split <= 0.70 of sync-split).

Each campaign's ``rao run`` output goes to ``$RAO_HOME/logs/<name>.log`` (printed; follow it with ``tail -f``).
Run it on an idle machine: about 15-30 min per campaign on 2 cores, 3 campaigns per repeat (a review estimated
~140 min in all for --repeats 2), more than a session beside other work. So the ratios are taken within a repeat
(its three campaigns run back to back on one machine: "compare ratios measured in one run") and ``--out`` keeps
the measurement across sittings: the record is written after every campaign, with its commit, date, host and
boot, and the same command resumes it (finished repeats are kept; the campaigns of an unfinished one are kept
only on the same boot of the same machine, else that repeat starts again, since its ratios would mix
machines). The documented ``--out`` is ``docs/results/bench-async.json``, committed after each sitting.

Usage: .venv/bin/python scripts/bench_async.py [--repeats 2] [--iterations 4] [--serving-cpus 1]
       [--trainer-cpus 0] [--out docs/results/bench-async.json] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import socket
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
    log = campaign_log(name)
    print(f"  its output (progress): tail -f {log}", flush=True)
    sampler = CoreSampler().start()
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    cores = sampler.stop()
    if proc.returncode != 0:
        last = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
        raise SystemExit(f"error: {name} exited {proc.returncode}: {last[0] if last else '(no output)'} "
                         f"(whole output: {log})")
    overrides = dict(s.split("=", 1) for s in sets)
    cfg = load_config(ROOT / "configs/cpu-smoke.yaml", {"name": name, "iterations": args.iterations,
                                                        **{k: json.loads(v) for k, v in overrides.items()}})
    summary = completed_campaign(cfg)
    if summary is None:
        raise SystemExit(f"error: {name} finished but its summary is not stored")
    window = rl_window(summary)
    rl_cores = sampler.busy_between(*window) if window else None
    return {**per_iteration_seconds(summary, args.iterations), "wall_s": wall, "cores": cores, "rl_cores": rl_cores}


def campaign_log(name: str) -> Path:
    """Where campaign ``name``'s ``rao run`` output goes while it runs (``$RAO_HOME/logs/<name>.log``): the
    benchmark's progress, 15-30 min per campaign, to follow with ``tail -f``. Creates the folder."""
    from rao_core.paths import rao_home

    path = rao_home() / "logs" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def machine() -> dict[str, str]:
    """This machine and boot: ``host`` (the host name) and ``boot`` (``/proc/sys/kernel/random/boot_id``, empty
    where it cannot be read). Two campaigns are compared within a repeat only when both match."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return {"host": socket.gethostname(), "boot": boot}


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a record's campaigns share: the iterations and the core split (a record of other settings is refused)."""
    return {"iterations": args.iterations, "serving_cpus": args.serving_cpus, "trainer_cpus": args.trainer_cpus}


def load_record(out: str, args: argparse.Namespace) -> dict[str, Any]:
    """The record an earlier sitting wrote to ``out`` (a new one without ``out`` or when the file is missing):
    ``{"settings", "repeats": [{"repeat", "host", "boot", "runs": {mode: result}}]}``. Exits with one ``error:``
    line when ``out`` is not such a record or holds other settings."""
    new = {"settings": settings(args), "repeats": []}
    if not out or not Path(out).exists():
        return new
    try:
        old = json.loads(Path(out).read_text())
        old["repeats"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: --out {out}: not a record of this script ({e!r}); name another file")
    if old.get("settings") != settings(args):
        raise SystemExit(f"error: --out {out} holds campaigns of other settings ({old.get('settings')}); "
                         "name another file")
    return old


def order(r: int) -> tuple[str, ...]:
    """The modes of repeat ``r`` in the order they run: rotated, so that no mode always runs first on a cold machine."""
    return MODES[r % 3:] + MODES[:r % 3]


def pending(record: dict[str, Any], repeats: int, here: dict[str, str]) -> list[tuple[int, str]]:
    """The (repeat, mode) campaigns still to run for ``repeats`` repeats, in order. Updates ``record`` in place:
    a repeat is added when missing, and an unfinished repeat begun on another machine or boot than ``here``
    loses its campaigns (its ratios must come from one machine), printed."""
    todo = []
    reps = {int(rep["repeat"]): rep for rep in record["repeats"]}
    for r in range(repeats):
        rep = reps.get(r)
        if rep is None:
            rep = {"repeat": r, **here, "runs": {}}
            record["repeats"].append(rep)
        elif len(rep["runs"]) < len(MODES) and (rep.get("host"), rep.get("boot")) != (here["host"], here["boot"]):
            if rep["runs"]:
                print(f"repeat {r}: its {len(rep['runs'])} campaign(s) ran on another machine or boot "
                      f"({rep.get('host')}); the repeat starts again here", flush=True)
            rep.update({**here, "runs": {}})
        todo += [(r, m) for m in order(r) if m not in rep["runs"]]
    record["repeats"].sort(key=lambda rep: int(rep["repeat"]))
    return todo


def summarise(record: dict[str, Any]) -> dict[str, Any]:
    """Per mode, min / median / max over its campaigns of the per-iteration median (seconds); per finished repeat,
    the ratios async-split / sync and async-split / sync-split of its own campaigns, and their min / median / max
    over the finished repeats (target: async-split / sync-split <= 0.70). Empty parts where nothing ran."""
    def mmm(xs: list[float]) -> dict[str, float]:
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)} if xs else {}

    per_mode = {m: mmm([rep["runs"][m]["median_s"] for rep in record["repeats"] if m in rep["runs"]])
                for m in MODES}
    ratios = [{"repeat": rep["repeat"],
               "async_over_sync": rep["runs"]["async-split"]["median_s"] / rep["runs"]["sync"]["median_s"],
               "async_over_sync_split": rep["runs"]["async-split"]["median_s"] / rep["runs"]["sync-split"]["median_s"]}
              for rep in record["repeats"] if all(m in rep["runs"] for m in MODES)]
    return {"per_mode_s": per_mode, "ratios": ratios,
            "async_over_sync": mmm([x["async_over_sync"] for x in ratios]),
            "async_over_sync_split": mmm([x["async_over_sync_split"] for x in ratios])}


def write_record(out: str, record: dict[str, Any]) -> None:
    """``record`` to ``out`` through ``rao_core.jsonl.atomic_path`` (an interrupted write leaves the last record)."""
    from rao_core.jsonl import atomic_path

    with atomic_path(out) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--serving-cpus", type=lambda s: [int(c) for c in s.split(",")], default=[1])
    ap.add_argument("--trainer-cpus", type=lambda s: [int(c) for c in s.split(",")], default=[0])
    ap.add_argument("--out", default="", help="Write the campaigns and the summary as JSON here, and resume from it.")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args()
    from research.designs import git_output

    stamp = time.strftime("%m%d%H%M")
    record, here = load_record(args.out, args), machine()
    todo = pending(record, args.repeats, here)
    if len(todo) < 3 * args.repeats:
        print(f"resuming {args.out}: {3 * args.repeats - len(todo)} campaign(s) already measured", flush=True)
    for r, mode in todo:
        out = run_campaign(f"bench-async-{stamp}-{mode}-r{r}", mode, args)
        if not out:  # --dry-run
            continue
        print(f"  {mode} r{r}: per-iteration median {out['median_s']:.0f} s, iterations {out['total_s']:.0f} s,"
              f" rao run {out['wall_s']:.0f} s, core busy: whole run {out['cores']}, RL iterations "
              f"{out['rl_cores']}", flush=True)
        rep = next(rep for rep in record["repeats"] if rep["repeat"] == r)
        rep["runs"][mode] = {**out, "commit": git_output("-C", str(ROOT), "rev-parse", "--short", "HEAD"),
                             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if args.out:  # after every campaign, so that an interrupted measurement resumes here
            write_record(args.out, {**record, "summary": summarise(record)})
    if args.dry_run:
        return
    summary = summarise(record)
    for mode, s in summary["per_mode_s"].items():
        n = sum(mode in rep["runs"] for rep in record["repeats"])
        if s:
            print(f"{mode:12s} per-iteration s (median of iterations 2-{args.iterations}), over {n} runs: "
                  f"min {s['min']:.0f} / median {s['median']:.0f} / max {s['max']:.0f}")
    for key, label, note in (("async_over_sync", "async-split / sync      ", ""),
                             ("async_over_sync_split", "async-split / sync-split", "  (target <= 0.70)")):
        s = summary[key]
        if s:
            print(f"ratio {label} within a repeat, over {len(summary['ratios'])} repeats: min {s['min']:.2f} / "
                  f"median {s['median']:.2f} / max {s['max']:.2f}{note}")
    if args.out:
        write_record(args.out, {**record, "summary": summary})


if __name__ == "__main__":
    main()
