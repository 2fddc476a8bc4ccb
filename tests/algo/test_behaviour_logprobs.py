"""Behaviour log-probs recorded by the real vLLM server vs the trainer's recomputation.

Rollouts are sampled at T = 0.7 through ``OpenAIPolicy`` against the session's vLLM server (started by
``VLLMServer`` with ``--logprobs-mode processed_logprobs``); the trainer recomputes the sampled tokens'
log-probs with ``token_logprobs(..., temperature=0.7)``. They must agree (importance ratio ~1); the
trainer at T = 1 (what raw log-probs would need) must visibly disagree, so the check can fail.
"""

from __future__ import annotations

import pytest
import torch

from rao_core.policies.base import PolicyRequest
from rao_core.policies.openai_policy import OpenAIPolicy
from rao_core.train.loss import token_logprobs
from rao_core.tree import Node

pytestmark = [pytest.mark.vllm]

T = 0.7


async def test_trainer_reproduces_served_logprobs_at_temperature(vllm_tiny):
    from transformers import AutoModelForCausalLM

    prompt = [1, 520, 3412, 28, 905, 2, 611, 87, 1290, 44]
    pol = OpenAIPolicy(vllm_tiny.base_url, vllm_tiny.model, temperature=T, stop=[],
                       extra_body={"ignore_eos": True})
    gens = []
    try:
        for seed in range(4):
            pol.extra_body["seed"] = seed
            gens.append(await pol.generate(PolicyRequest(node=Node(node_id='r', depth=0, goal='g'), env='test',
                                                         prompt_token_ids=prompt, max_tokens=48)))
    finally:
        await pol.aclose()
    model = AutoModelForCausalLM.from_pretrained(vllm_tiny.model_path, dtype=torch.float32).eval()
    diffs = {T: [], 1.0: []}
    ratios = []
    with torch.no_grad():
        for g in gens:
            assert len(g.token_ids) == len(g.logprobs) == 48
            ids = torch.tensor([prompt + g.token_ids])
            logits = model(input_ids=ids).logits
            recorded = torch.tensor(g.logprobs)
            for temp in (T, 1.0):
                mine = token_logprobs(logits, ids, temp)[0, len(prompt):]
                diffs[temp].append((mine - recorded).abs().mean().item())
                if temp == T:
                    ratios.append(torch.exp(mine - recorded))
    ratio = torch.cat(ratios)
    assert abs(ratio.mean().item() - 1.0) < 0.01, ratio.mean()
    assert ((ratio - 1).abs() > 0.2).float().mean().item() == 0.0  # no token would be clipped
    assert max(diffs[T]) < 0.01, diffs
    assert min(diffs[1.0]) > 10 * max(diffs[T]), diffs  # the wrong temperature is visibly wrong
