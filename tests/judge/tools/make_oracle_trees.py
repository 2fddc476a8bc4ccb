"""Grow TextCraft-Synth execution trees with the oracle policy, for judge calibration.

    python -m tests.judge.tools.make_oracle_trees OUT.jsonl [--n 6] [--difficulty medium] [--max-steps 10]

A small ``--max-steps`` makes some nodes run out of steps (negatives for the calibration).
"""

from __future__ import annotations

import argparse
import asyncio

from rao_core.envs import get_env
from rao_core.paths import tiny_model_path
from rao_core.policies.textcraft_expert import TextCraftExpert
from rao_core.runtime import RuntimeConfig, run_trees
from rao_core.tree import write_trees


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--difficulty", default="medium")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--suboptimal", type=float, default=0.3)
    a = ap.parse_args()
    env = get_env("textcraft-synth")
    tasks = env.generate_tasks(n=a.n, seed=a.seed, difficulty=a.difficulty)
    cfg = RuntimeConfig(max_steps_per_node=a.max_steps, repl_pool_size=1)
    policy = TextCraftExpert(seed=a.seed, suboptimal_prob=a.suboptimal)
    trees = asyncio.run(run_trees(env, [(t, 1) for t in tasks], policy, cfg, tokenizer=tiny_model_path()))
    write_trees(a.out, trees)
    nodes = [n for t in trees for n in t.nodes]
    pos = sum(1 for n in nodes if (n.verifier or 0) >= 0.5)
    print(f"{len(trees)} trees, {len(nodes)} nodes, verifier positives {pos}, negatives {len(nodes) - pos}")


if __name__ == "__main__":
    main()
