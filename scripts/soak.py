"""Soak of the runtime: many execution trees through the real sandbox, resources recorded (docs/benchmarks/soak.md).

TextCraft-Synth tasks solved by the scripted TextCraft expert (no model server) through ``run_trees`` with
the bubblewrap sandbox, in batches (one ``run_trees`` call per batch, as one generate stage per
iteration). Before the first tree, after each batch and at the end it prints the process's resident
memory, its open file descriptors and threads, its live child processes, and the ``rao-repl-*`` work
folders left in its own temporary folder (``tempfile`` is pointed at a fresh folder, so nothing another
job leaves in /tmp is counted). Exits 1 when a child process or a work folder is left after the run.

Usage: python scripts/soak.py [--trees 500] [--batch 50] [--difficulty medium] [--sandbox bwrap]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path


def _sample(tmp: Path) -> dict[str, float]:
    """RSS (MiB), open fds, threads, live children (not zombies), zombies, rao-repl-* folders."""
    import psutil

    me = psutil.Process()
    kids = me.children(recursive=True)
    zombies = 0
    for k in kids:
        try:
            zombies += k.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            pass
    return {"rss_mb": me.memory_info().rss / 2**20, "fds": me.num_fds(), "threads": me.num_threads(),
            "children": len(kids) - zombies, "zombies": zombies,
            "repl_dirs": sum(1 for _ in tmp.glob("rao-repl-*"))}


def _row(label: str, done: int, t0: float, s: dict[str, float], extra: str = "") -> None:
    print(f"| {label:<12} | {done:>5} | {time.monotonic() - t0:>8.1f} | {s['rss_mb']:>8.1f} | {s['fds']:>4} | "
          f"{s['threads']:>7} | {s['children']:>8} | {s['zombies']:>7} | {s['repl_dirs']:>9} |{extra}", flush=True)


async def soak(n_trees: int, batch: int, difficulty: str, sandbox: str, tmp: Path) -> int:
    from rao_core.envs import get_env
    from rao_core.paths import tiny_model_path
    from rao_core.policies.textcraft_expert import TextCraftExpert
    from rao_core.runtime import RuntimeConfig, load_tokenizer, run_trees

    env = get_env("textcraft-synth")
    tok = load_tokenizer(tiny_model_path())
    cfg = RuntimeConfig(max_depth=2, context_window=32768, max_new_tokens=2048, max_children_per_node=8,
                        sandbox=sandbox, repl_pool_size=2, tree_timeout_s=300)
    policy = TextCraftExpert(seed=0, max_depth=2)
    t0 = time.monotonic()
    print("| checkpoint   | trees |    wall s |   RSS MiB |  fds | threads | children | zombies | rao-repl-* |"
          " solved / nodes / errors")
    print("|---|---|---|---|---|---|---|---|---|---|")
    _row("start", 0, t0, _sample(tmp))
    done = solved = nodes = errors = 0
    k = 0
    while done < n_trees:
        n = min(batch, n_trees - done)
        tasks = env.generate_tasks(n=n, seed=1000 + k, difficulty=difficulty)
        trees = await run_trees(env, [(t, 1) for t in tasks], policy, cfg, tokenizer=tok)
        k += 1
        done += len(trees)
        solved += sum(t.root.verifier == 1.0 for t in trees)
        nodes += sum(len(t.nodes) for t in trees)
        errors += sum(t.error is not None for t in trees)
        del trees
        gc.collect()
        _row(f"batch {k}", done, t0, _sample(tmp), f" {solved} / {nodes} / {errors}")
    await asyncio.sleep(1.0)  # REPL processes reaped by the pool's close have exited
    end = _sample(tmp)
    _row("end (+1 s)", done, t0, end)
    left = end["children"] + end["repl_dirs"]
    print(f"{done} trees, {solved} solved, {nodes} nodes, {errors} tree errors, {time.monotonic() - t0:.0f} s; "
          f"left behind: {end['children']} child processes, {end['repl_dirs']} rao-repl-* folders")
    return 1 if left else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=500)
    ap.add_argument("--batch", type=int, default=50, help="trees per run_trees call")
    ap.add_argument("--difficulty", default="medium", help="TextCraft-Synth difficulty of the tasks")
    ap.add_argument("--sandbox", default="bwrap", choices=["bwrap", "none"])
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rao-soak-"))
    tempfile.tempdir = str(tmp)  # REPL work folders go here, and only ours are counted
    os.environ["TMPDIR"] = str(tmp)
    print(f"soak: {args.trees} trees in batches of {args.batch}, TextCraft-Synth {args.difficulty}, "
          f"TextCraft expert, sandbox {args.sandbox}, pid {os.getpid()}, temporary folder {tmp}")
    try:
        return asyncio.run(soak(args.trees, args.batch, args.difficulty, args.sandbox, tmp))
    finally:
        leftover = list(tmp.glob("rao-repl-*"))
        if not leftover:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
