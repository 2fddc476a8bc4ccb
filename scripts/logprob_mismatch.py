"""Sampler/trainer log-prob agreement on real generations (prints numbers; docs/benchmarks/generation.md).

Serves ``--model`` with vLLM (``--dtype``, processed log-probs), samples ``--n`` completions of
``--max-tokens`` tokens at ``--temperature`` from TextCraft-Synth root prompts (the rollouts' real
prompts), recomputes the sampled tokens' log-probs with the trainer's function
(``rao_core.train.loss.token_logprobs``, fp32, same temperature) and prints, over all sampled tokens:
mean |log-prob difference|, the k3 estimate of KL(sampler || trainer), the importance ratio's mean,
its 1st/99th percentiles and the fraction outside PPO's [0.8, 1.2] clip range.

Usage: python scripts/logprob_mismatch.py --model DIR [--dtype bfloat16|float32] [--temperature 0.7]
"""

from __future__ import annotations

import argparse
import asyncio


async def _sample(base_url: str, model: str, prompts: list[list[int]], temperature: float, max_tokens: int):
    from rao_core.policies.base import PolicyRequest
    from rao_core.policies.openai_policy import OpenAIPolicy
    from rao_core.tree import Node

    pol = OpenAIPolicy(base_url, model, temperature=temperature)
    try:
        reqs = [PolicyRequest(node=Node(node_id="r", depth=0, goal="g"), env="textcraft-synth",
                              prompt_token_ids=p, max_tokens=max_tokens) for p in prompts]
        return await asyncio.gather(*(pol.generate(r) for r in reqs))
    finally:
        await pol.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--difficulty", default="tier1")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from infra.serving import VLLMServer
    from rao_core.envs import get_env
    from rao_core.runtime import RuntimeConfig, load_tokenizer, system_prompt
    from rao_core.runtime.chat import ChatTokens
    from rao_core.train.loss import token_logprobs
    from rao_core.tree import Node

    env = get_env("textcraft-synth")
    tok = load_tokenizer(a.model)
    chat = ChatTokens(tok)
    rc = RuntimeConfig(max_depth=1)
    prompts = []
    for t in env.generate_tasks(n=a.n, seed=99, difficulty=a.difficulty, split="validation"):
        spec = env.root_goal(t)
        node = Node(node_id="0", depth=0, goal=spec.goal)
        prompts.append(chat.initial(system_prompt(env, rc, node), spec.goal))
    with VLLMServer(a.model, served_model_name="policy", max_model_len=4096, dtype=a.dtype) as srv:
        gens = asyncio.run(_sample(srv.base_url, srv.model, prompts, a.temperature, a.max_tokens))
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    diffs = []
    with torch.no_grad():
        for p, g in zip(prompts, gens):
            ids = torch.tensor([list(p) + g.token_ids])
            mine = token_logprobs(model(input_ids=ids).logits, ids, a.temperature)[0, len(p):]
            diffs.append(mine - torch.tensor(g.logprobs))
    d = torch.cat(diffs).double()  # log(pi_trainer / pi_sampler) per sampled token
    ratio = d.exp()
    k3 = (ratio - 1 - d).mean()
    print(f"dtype={a.dtype} T={a.temperature} tokens={d.numel()} mean|dlogp|={d.abs().mean():.4f} "
          f"KL_k3={k3:.5f} ratio_mean={ratio.mean():.4f} p01={ratio.quantile(0.01):.3f} "
          f"p99={ratio.quantile(0.99):.3f} outside_clip={((ratio < 0.8) | (ratio > 1.2)).double().mean():.4f}")


if __name__ == "__main__":
    main()
