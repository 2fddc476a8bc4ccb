"""Does a warm-started policy open a root by delegating? Samples the root's first reply, without a server.

For held-out evaluation tasks of a campaign config (``eval_tasks``: the same seed, split and targets as the
campaign's evaluation), builds each root's first prompt exactly as the runtime does (the recursive system
prompt with ``launch_subagent``, the goal, the chat template's generation header: ``ChatTokens.initial``),
samples ``--samples`` first replies with Hugging Face ``generate`` at the config's temperature, and counts
replies whose first line announces sub-agents or whose text calls ``launch_subagent`` ("launch"), replies
that read recipes instead (``get_info`` without a launch) and the rest, per difficulty; then the most
common first lines. A cheap check of a warm start (minutes on 2 cores) before a campaign spends an hour on
it; the campaign's evaluation (vLLM, whole trees) stays the measurement of record: a reply that announces a
launch can still fail to run one.

Usage:
    python scripts/first_reply_probe.py var/ws/sft-v2 --config configs/experiment-textcraft-tier1x.yaml \\
        --n 10 --samples 4 --difficulty tier1x2 --difficulty tier1x3
"""

from __future__ import annotations

import argparse
from collections import Counter


def classify(text: str) -> str:
    """'launch' | 'get_info' | 'other' for one sampled first reply (module docstring)."""
    first = text.split("\n")[0].lower()
    if "launch_subagent" in text or "sub-agent" in first:
        return "launch"
    return "get_info" if "get_info" in text else "other"


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from flows.campaign import CampaignParams
    from rao_core.envs import get_env
    from rao_core.evaluation import eval_tasks, mode_runtime
    from rao_core.runtime.agent import system_prompt
    from rao_core.runtime.chat import ChatTokens, load_tokenizer
    from rao_core.tree import Node

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--config", default="configs/experiment-textcraft-tier1x.yaml")
    ap.add_argument("--n", type=int, default=10, help="held-out tasks per difficulty")
    ap.add_argument("--samples", type=int, default=4, help="sampled first replies per task")
    ap.add_argument("--difficulty", action="append", help="repeat; default: the config's eval difficulties")
    ap.add_argument("--max-new-tokens", type=int, default=90)
    ap.add_argument("--seed", type=int, default=0, help="torch sampling seed")
    a = ap.parse_args()

    cfg = CampaignParams(config=a.config).resolve()
    env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
    ev = cfg.eval.model_copy(update={"n_tasks": a.n, "difficulties": a.difficulty or cfg.eval.difficulties})
    rc = mode_runtime(cfg.runtime, "recursive")
    tok = load_tokenizer(a.checkpoint)
    chat = ChatTokens(tok)
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=torch.float32).eval()
    torch.manual_seed(a.seed)
    kinds: Counter = Counter()
    firsts: Counter = Counter()
    for task in eval_tasks(env, ev):
        spec = env.root_goal(task)
        node = Node(node_id="0", depth=0, goal=spec.goal, goal_args=spec.goal_args, max_steps=rc.max_steps_per_node)
        ids = torch.tensor([chat.initial(system_prompt(env, rc, node), spec.goal)])  # [1, T]
        with torch.no_grad():
            out = model.generate(ids, do_sample=True, temperature=rc.temperature, top_p=1.0,
                                 max_new_tokens=a.max_new_tokens, num_return_sequences=a.samples,
                                 pad_token_id=tok.eos_token_id)  # [samples, T + new]
        for row in out:
            text = tok.decode(row[ids.shape[1]:], skip_special_tokens=True)
            kinds[(task.difficulty, classify(text))] += 1
            firsts[text.split("\n")[0][:72]] += 1
    for diff in ev.difficulties:
        total = sum(v for (d, _), v in kinds.items() if d == diff)
        row = ", ".join(f"{k} {kinds[(diff, k)]}" for k in ("launch", "get_info", "other"))
        print(f"{diff}: {total} first replies: {row} (launch share {kinds[(diff, 'launch')] / max(total, 1):.2f})")
    print("most common first lines:")
    for line, v in firsts.most_common(8):
        print(f"  {v:3d}  {line!r}")


if __name__ == "__main__":
    main()
