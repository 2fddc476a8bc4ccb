"""A fresh clone's first ``make run`` on a loaded machine (docs/benchmarks/soak.md "The first run on a loaded machine").

For each of ``--tries`` tries: clone the repository (its committed HEAD) into a fresh folder and run the README's
``make run`` there, with a clean environment (no ``RAO_HOME``, ``PYTHONPATH`` or ``RAO_VLLM_PYTHON`` of the caller),
while beside it ``--busy`` processes spin at normal priority (one per core: a CPU busy loop on every core) and
threads open and close loopback connections (``scripts/port_soak.py``'s churn: each connection takes a source port
from the kernel's ephemeral range, as a busy machine's do). With ``--nightly``, after the last try the nightly
regression runs with its default parameters (``rao evaluate``) in the last clone, beside the same load.

Prints one line per try (``try I: exit RC, wall S s, log PATH``) and a summary ``passed: P / N``; exits 1 when any
command failed. Each clone but the last is removed once its try ends (``--keep`` keeps them); logs stay in
``--workdir``.

Usage: python scripts/loaded_first_run.py [--tries 3] [--busy 2] [--threads 2] [--nightly] [--workdir DIR]
       python scripts/loaded_first_run.py --nightly-in DIR/clone-1 --tries 2 --first-try 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from port_soak import Churn  # noqa: E402 - the soak's connection churn, one definition

REPO = Path(__file__).resolve().parents[1]
CLEAN_ENV_DROP = ("RAO_HOME", "PYTHONPATH", "RAO_VLLM_PYTHON", "VIRTUAL_ENV")


def spin() -> None:
    """A CPU busy loop (normal priority) until killed."""
    while True:
        pass


def clean_env() -> dict[str, str]:
    """The caller's environment without the project's own variables: what a new user's shell has."""
    return {k: v for k, v in os.environ.items() if k not in CLEAN_ENV_DROP}


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    """Run ``cmd`` in ``cwd``, stdout and stderr to ``log``: (exit code, wall seconds)."""
    t0 = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.call(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=clean_env())
    return rc, time.monotonic() - t0


def nightly(clone: Path, log: Path) -> tuple[str, int, float, Path]:
    """The nightly regression with its default parameters (``rao evaluate``) in ``clone``: its result row."""
    rc, wall = timed([str(clone / ".venv/bin/rao"), "evaluate"], clone, log)
    print(f"nightly in {clone.name}: exit {rc}, wall {wall:.0f} s, log {log}", flush=True)
    return "nightly", rc, wall, log


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=3, help="fresh clones, one make run each (1-10)")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy-loop processes (default: one per core)")
    ap.add_argument("--threads", type=int, default=2, help="connection-churn threads (0-8)")
    ap.add_argument("--hold", type=int, default=256, help="connections each churn thread holds open at once")
    ap.add_argument("--nightly", action="store_true", help="then run `rao evaluate` (default parameters) in the last clone")
    ap.add_argument("--nightly-in", type=Path, default=None,
                    help="first run `rao evaluate` in this clone (one whose make run passed), then the tries")
    ap.add_argument("--first-try", type=int, default=1, help="number of the first try (logs make-run-N.log)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/rao-loaded"), help="where clones and logs go")
    ap.add_argument("--keep", action="store_true", help="keep every clone")
    args = ap.parse_args(argv)
    if not (0 if args.nightly_in else 1) <= args.tries <= 10 or not 0 <= args.busy <= 64 or not 0 <= args.threads <= 8:
        print("error: --tries must be 1-10 (0 with --nightly-in), --busy 0-64, --threads 0-8", file=sys.stderr)
        return 2
    if args.nightly_in and not (args.nightly_in / ".venv/bin/rao").exists():
        print(f"error: --nightly-in {args.nightly_in}: no .venv/bin/rao there (a clone whose make run passed)",
              file=sys.stderr)
        return 2
    commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True).strip()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"repository {REPO} at {commit}; load: {args.busy} busy loops, {args.threads} churn threads "
          f"x {args.hold} connections", flush=True)
    spinners = [mp.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    results: list[tuple[str, int, float, Path]] = []
    try:
        with Churn(args.threads, limit=10**12, hold=args.hold) as churn:
            if args.nightly_in:
                results.append(nightly(args.nightly_in, args.workdir / f"nightly-{args.nightly_in.name}.log"))
            clone = None
            for i in range(args.first_try, args.first_try + args.tries):
                if clone is not None and not args.keep:
                    shutil.rmtree(clone, ignore_errors=True)
                clone = args.workdir / f"clone-{i}"
                shutil.rmtree(clone, ignore_errors=True)
                subprocess.check_call(["git", "clone", "-q", str(REPO), str(clone)])
                at = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=clone, text=True).strip()
                log = args.workdir / f"make-run-{i}.log"
                rc, wall = timed(["make", "run"], clone, log)
                results.append((f"try {i}", rc, wall, log))
                print(f"try {i} (commit {at}): exit {rc}, wall {wall:.0f} s, log {log}", flush=True)
            if args.nightly and clone is not None:
                results.append(nightly(clone, args.workdir / f"nightly-{clone.name}.log"))
            print(f"connections opened beside them: {churn.count:,} ({churn.errors} refused)", flush=True)
    finally:
        for p in spinners:
            p.kill()
    passed = sum(rc == 0 for _, rc, _, _ in results)
    print(f"passed: {passed} / {len(results)} ({', '.join(f'{n} {w:.0f} s' for n, _, w, _ in results)})", flush=True)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
