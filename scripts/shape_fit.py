"""Does a task shape fit one node? The scripted expert with and without delegation, through the real runtime.

For each difficulty and context window, grows N expert trees per arm through the real runtime (bubblewrap
REPLs, the policy's tokenizer, the exact verifier) and prints one table row per (difficulty, window, arm):
root successes / N, how the roots ended, the longest root and node (prompt + completion tokens), the longest
node at each depth (root first), the longest reply (one turn's completion tokens: a scripted expert is not held
to ``--max-new-tokens``, so a reply above it could not be imitated by a policy), nodes per tree, nodes verified
and the depths the trees reached (depth: trees). The
``single`` arm has delegation disabled and ``--single-steps`` steps (as many as it wants); the ``recursive``
arm is the expert of the warm start: ``--expert split`` (``split_targets_min: 2``, the tier1x<K> shape, docs
"The tier1xK shape") or ``--expert recurse`` (one sub-agent per craftable ingredient, the nest<L>
shape, docs "The nested shape"), with ``--max-depth`` as the runtime's depth limit.

Usage:
    python scripts/shape_fit.py --difficulties tier1x3 tier1x4 tier1x6 --windows 1536 2048 --n 20
    python scripts/shape_fit.py --difficulties nest1 nest2 --windows 1536 --expert recurse --max-depth 4 --n 20
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

from rao_core.envs import get_env
from rao_core.paths import default_model_path
from rao_core.policies.base import Policy
from rao_core.runtime import RuntimeConfig, load_tokenizer, run_tree
from rao_core.tree import verifier_value
from rao_core.warmstart import DemoConfig, _EosTerminated, expert_for_tree


def expert(env_name: str, demo: DemoConfig, index: int, rc: RuntimeConfig, recurse: bool = False) -> Policy:
    """Tree ``index``'s expert: the warm start's (``expert_for_tree``), with ``recurse`` the recursing TextCraft
    expert (``DemoConfig.recurse``: what the nested experiment's warm start demonstrates)."""
    return expert_for_tree(env_name, demo.model_copy(update={"recurse": recurse}) if recurse else demo, index, rc)


async def arm_row(env, tasks, tok, rc: RuntimeConfig, demo: DemoConfig, recurse: bool = False) -> dict:
    """Grow one expert tree per task under ``rc``; summary of the roots and nodes."""
    sem = asyncio.Semaphore(8)

    async def one(i, task):
        async with sem:
            return await run_tree(env, task, _EosTerminated(expert(env.name, demo, i, rc, recurse), tok), rc,
                                  tokenizer=tok, group_id=task.task_id, rollout_index=0)

    trees = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    ok = sum(1 for t in trees if (verifier_value(t.root) or 0.0) >= 1.0)
    ends = Counter(str(t.root.end_reason).split(".")[-1].lower() for t in trees)
    size = {id(n): n.num_prompt_tokens + n.num_completion_tokens for t in trees for n in t.nodes}
    by_depth: dict[int, int] = {}
    for t in trees:
        for n in t.nodes:
            by_depth[n.depth] = max(by_depth.get(n.depth, 0), size[id(n)])
    return {"ok": ok, "n": len(trees), "ends": dict(ends), "longest_node": max(size.values()),
            "longest_root": max(size[id(t.root)] for t in trees), "longest_by_depth": by_depth,
            "longest_reply": max((len(u.completion_token_ids) for t in trees for n in t.nodes for u in n.turns),
                                 default=0),
            "nodes": sum(len(t.nodes) for t in trees) / len(trees),
            "depths": dict(sorted(Counter(max(n.depth for n in t.nodes) for t in trees).items())),
            "nodes_ok": sum(1 for t in trees for n in t.nodes if (verifier_value(n) or 0.0) >= 1.0),
            "nodes_all": sum(len(t.nodes) for t in trees)}


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
    ap.add_argument("--expert", choices=("split", "recurse"), default="split",
                    help="the recursive arm's expert: one sub-agent per target, or per craftable ingredient")
    ap.add_argument("--max-depth", type=int, default=1, help="the recursive arm's runtime max_depth")
    ap.add_argument("--arms", nargs="+", choices=("single", "recursive"), default=["single", "recursive"])
    ap.add_argument("--items-per-tier", type=int, default=25, help="the recipe graph's items per domain and tier")
    ap.add_argument("--model", default=str(default_model_path()), help="tokenizer")
    a = ap.parse_args()
    env = get_env("textcraft-synth")
    tok = load_tokenizer(a.model)
    demo = DemoConfig(split_targets_min=2, parallel_prob=0.5, suboptimal_prob=0.0, seed=a.seed)
    print("| shape | window / new tokens | arm | root successes | root end reasons | longest root (tokens) | "
          "longest node | longest node by depth | longest reply | nodes per tree | nodes verified | tree depths |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for diff in a.difficulties:
        tasks = env.generate_tasks(n=a.n, seed=a.seed, difficulty=diff, split=a.split,
                                   items_per_tier=a.items_per_tier)
        for w in a.windows:
            for arm in a.arms:
                rc = RuntimeConfig(context_window=w, max_new_tokens=a.max_new_tokens, max_depth=a.max_depth,
                                   max_steps_per_node=a.single_steps if arm == "single" else a.child_steps,
                                   delegation=arm == "recursive", tree_timeout_s=300)
                r = asyncio.run(arm_row(env, tasks, tok, rc, demo, recurse=a.expert == "recurse"))
                ends = ", ".join(f"{k} {v}" for k, v in sorted(r["ends"].items()))
                by_depth = " / ".join(str(v) for _, v in sorted(r["longest_by_depth"].items()))
                depths = ", ".join(f"{d}: {c}" for d, c in r["depths"].items())
                print(f"| {diff} | {w} / {a.max_new_tokens} | {arm} | {r['ok']}/{r['n']} | {ends} | "
                      f"{r['longest_root']} | {r['longest_node']} | {by_depth} | {r['longest_reply']} | {r['nodes']:.1f} | "
                      f"{r['nodes_ok']}/{r['nodes_all']} | {depths} |", flush=True)


if __name__ == "__main__":
    main()
