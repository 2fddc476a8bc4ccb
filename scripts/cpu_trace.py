"""Where the cores went during a long command: machine and command CPU once a second, plotted.

The check that `make run` keeps both cores busy.

``/usr/bin/time -v``'s "Percent of CPU this job got" counts a child's time only once some ancestor of it has
waited for it: a process whose parent died first (a vLLM engine core left behind when its API server is killed,
a daemon that detaches) is reaped by init and its CPU never reaches the figure. This script counts every process
it has seen in the command's tree, also after it is reparented, from ``/proc/PID/stat`` (utime + stime), and
the whole machine's busy time from ``/proc/stat`` (everything but idle and iowait). On an otherwise idle machine
the two agree to within the sampler's own share.

Printed at the end: wall time, average cores busy (machine) and used by the command's processes, both also as
"Percent of CPU" (100% = one core), the share of the wall time spent below 1.25 cores, and the CPU of the
processes that left the tree (by command line: what ``/usr/bin/time`` missed). Written: a CSV
(``t_s, machine_cores, tree_cores, processes``) and, with ``--plot``, a PNG of both series.

Usage:
    python scripts/cpu_trace.py --csv var/cpu.csv --plot var/cpu.png -- make run
    make run 2>&1 | ... is not needed: the command's output goes to this script's stdout unchanged.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """Seconds of CPU the whole machine has been busy since boot (all cores; not idle, not iowait)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return (sum(vals[:8]) - idle) / TICK


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (its own threads, not its children); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / TICK
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's list)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(c) for c in f.read().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


class TreeCpu:
    """CPU seconds of every process seen in a tree rooted at one pid, counting processes after they leave the
    tree (reparented) and keeping the last reading of those that exited."""

    def __init__(self, root: int):
        self.root = root
        self.last: dict[int, float] = {}  # pid -> last reading (seconds); kept after it exits
        self.alive: set[int] = set()
        self.names: dict[int, str] = {}  # pid -> its command line's start
        self.left: set[int] = set()  # pids seen outside the tree after being in it (reparented)

    def sample(self) -> float:
        """Total CPU seconds of every process seen so far (exited ones at their last reading)."""
        seen: set[int] = set()
        live: set[int] = set()  # read this time: still running
        for start, in_tree in (([self.root], True), (sorted(self.alive), False)):  # the tree, then its leavers
            todo = list(start)
            while todo:
                pid = todo.pop()
                if pid in seen:
                    continue
                seen.add(pid)
                v = proc_cpu_s(pid)
                if v is None:
                    continue
                self.last[pid] = max(v, self.last.get(pid, 0.0))
                live.add(pid)
                if not in_tree:
                    self.left.add(pid)
                if pid not in self.names:
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            argv = f.read().decode(errors="replace").split("\0")
                        argv[0] = os.path.basename(argv[0])  # the program, not where it is installed
                        self.names[pid] = " ".join(" ".join(argv).split())[:60]
                    except OSError:
                        self.names[pid] = "?"
                todo += children(pid)
        self.alive = live
        return sum(self.last.values())

    def left_tree(self, top: int = 5) -> tuple[float, list[tuple[float, str]]]:
        """CPU seconds of the processes that left the tree (reparented: ``/usr/bin/time`` never counts them) and
        the ``top`` largest as (seconds, command line)."""
        rows = sorted(((self.last[p], self.names.get(p, "?")) for p in self.left), reverse=True)
        return sum(r[0] for r in rows), rows[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, required=True, help="where to write the samples")
    ap.add_argument("--plot", type=Path, help="a PNG of machine and command cores over time")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run")
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        print("error: no command given (cpu_trace.py --csv F -- make run)", file=sys.stderr)
        return 2
    a.csv.parent.mkdir(parents=True, exist_ok=True)
    t0, m0 = time.monotonic(), machine_busy_s()
    proc = subprocess.Popen(cmd)
    tree = TreeCpu(proc.pid)
    rows, prev_t, prev_m, prev_c = [], t0, m0, 0.0
    while True:
        done = proc.poll() is not None
        now, m, c = time.monotonic(), machine_busy_s(), tree.sample()
        dt = max(now - prev_t, 1e-6)
        rows.append((round(now - t0, 2), round((m - prev_m) / dt, 3), round((c - prev_c) / dt, 3), len(tree.alive)))
        prev_t, prev_m, prev_c = now, m, c
        if done:
            break
        time.sleep(a.interval)
    wall = prev_t - t0
    with a.csv.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "machine_cores", "tree_cores", "processes"])
        w.writerows(rows)
    machine, job = (prev_m - m0) / wall, prev_c / wall
    low = sum(min(r[0], wall) - min(p[0], wall) for p, r in zip(rows, rows[1:]) if r[1] < 1.25) / wall
    print(f"\ncpu_trace: exit {proc.returncode}, wall {wall:.1f} s, {len(tree.last)} processes seen; average cores "
          f"busy: machine {machine:.2f} ({machine:.0%} CPU), the command's processes {job:.2f} ({job:.0%} CPU); "
          f"{low:.0%} of the wall time below 1.25 cores busy (machine). Samples: {a.csv}", flush=True)
    gone, top = tree.left_tree()
    print(f"cpu_trace: {gone:.0f} s of CPU in processes that left the command's tree (reparented when their parent "
          f"died: /usr/bin/time and a shell's times never count them)" +
          "".join(f"\n    {sec:7.1f} s  {name}" for sec, name in top), flush=True)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(11, 3.5))
        ax.plot([r[0] for r in rows], [r[1] for r in rows], lw=0.8, label="machine (busy cores)")
        ax.plot([r[0] for r in rows], [r[2] for r in rows], lw=0.8, label="the command's processes")
        ax.axhline(os.cpu_count() or 1, color="grey", lw=0.5, ls="--")
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("cores")
        ax.set_title(f"{' '.join(cmd)}: machine {machine:.0%}, command {job:.0%} CPU on average")
        ax.legend(loc="upper right")
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
        print(f"cpu_trace: plot {a.plot}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
