"""Does a task shape fit one node? The scripted expert with and without delegation, through the real runtime.

For each difficulty and context window, grows N expert trees per arm through the real runtime (bubblewrap
REPLs, the policy's tokenizer, the exact verifier) and prints one table row per (difficulty, window, arm):
root successes / N, how the roots ended, the longest node prompt (tokens) and nodes per tree. The
``single`` arm has delegation disabled and ``--single-steps`` steps (as many as it wants); the
``recursive`` arm is the expert of the warm start (``split_targets_min``). Used for the table of
docs/environments.md, "The tier1xK shape" (issue 25, item 1).

Usage:
    python scripts/shape_fit.py --difficulties tier1x3 tier1x4 tier1x6 --windows 1536 2048 --n 20
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

from rao_core.envs import get_env
from rao_core.paths import default_model_path
from rao_core.runtime import RuntimeConfig, load_tokenizer, run_tree
from rao_core.tree import verifier_value
from rao_core.warmstart import DemoConfig, _EosTerminated, expert_for_tree


async def arm_row(env, tasks, tok, rc: RuntimeConfig, demo: DemoConfig) -> dict:
    """Grow one expert tree per task under ``rc``; summary of the roots and nodes."""
    sem = asyncio.Semaphore(8)

    async def one(i, task):
        async with sem:
            return await run_tree(env, task, _EosTerminated(expert_for_tree(env.name, demo, i, rc), tok), rc,
                                  tokenizer=tok, group_id=task.task_id, rollout_index=0)

    trees = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    ok = sum(1 for t in trees if (verifier_value(t.root) or 0.0) >= 1.0)
    ends = Counter(str(t.root.end_reason).split(".")[-1].lower() for t in trees)
    longest = max(n.num_prompt_tokens + n.num_completion_tokens for t in trees for n in t.nodes)
    longest_root = max(t.root.num_prompt_tokens + t.root.num_completion_tokens for t in trees)
    return {"ok": ok, "n": len(trees), "ends": dict(ends), "longest_node": longest, "longest_root": longest_root,
            "nodes": sum(len(t.nodes) for t in trees) / len(trees)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--difficulties", nargs="+", default=["tier1x3", "tier1x4", "tier1x6"])
    ap.add_argument("--windows", nargs="+", type=int, default=[1536, 2048])
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--n", type=int, default=20, help="trees per (difficulty, window, arm)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", default="train")
    ap.add_argument("--child-steps", type=int, default=6)
    ap.add_argument("--single-steps", type=int, default=40, help="steps of the single-agent node")
    ap.add_argument("--model", default=str(default_model_path()), help="tokenizer")
    a = ap.parse_args()
    env = get_env("textcraft-synth")
    tok = load_tokenizer(a.model)
    demo = DemoConfig(split_targets_min=2, parallel_prob=0.5, suboptimal_prob=0.0, seed=a.seed)
    print(f"| shape | window / new tokens | arm | root successes | root end reasons | longest root (tokens) | "
          f"longest node | nodes per tree |")
    print("|---|---|---|---|---|---|---|---|")
    for diff in a.difficulties:
        tasks = env.generate_tasks(n=a.n, seed=a.seed, difficulty=diff, split=a.split)
        for w in a.windows:
            for arm in ("single", "recursive"):
                rc = RuntimeConfig(context_window=w, max_new_tokens=a.max_new_tokens, max_depth=1,
                                   max_steps_per_node=a.single_steps if arm == "single" else a.child_steps,
                                   delegation=arm == "recursive", tree_timeout_s=300)
                r = asyncio.run(arm_row(env, tasks, tok, rc, demo))
                ends = ", ".join(f"{k} {v}" for k, v in sorted(r["ends"].items()))
                print(f"| {diff} | {w} / {a.max_new_tokens} | {arm} | {r['ok']}/{r['n']} | {ends} | "
                      f"{r['longest_root']} | {r['longest_node']} | {r['nodes']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
