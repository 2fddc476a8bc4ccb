"""The judge protocol against a real OpenAI-compatible server (vLLM on the tiny random model).

The tiny model writes noise, so most answers are unparseable: that exercises the retry-then-NaN path,
token accounting from real ``usage`` fields, and the cache on real responses.
"""

from __future__ import annotations

import math

import pytest

from rao_core.judge import JudgeConfig, JudgeEndpointError, judge_trees
from tests.judge.conftest import node, tree

pytestmark = pytest.mark.vllm


async def test_judge_against_vllm(vllm_tiny, tmp_path):
    cfg = JudgeConfig(base_url=vllm_tiny.base_url, model=vllm_tiny.model, cache_path=tmp_path / "c.sqlite",
                      max_tokens=24, max_concurrency=4, max_retries=1, timeout_s=120)
    t = tree("oolong", [node("r", None, verifier=1.0)] + [
        node(f"k{i}", "r", depth=1, goal=f"count rolls of player {i}", result=i, cells=[("print(1)", "1")])
        for i in range(3)])
    out, stats = await judge_trees([t], "oolong", cfg)
    judged = [n for n in out[0].nodes if n.success_source == "judge"]
    assert len(judged) == 3 and stats.transport_errors == 0
    # every request was answered: 1 per node, plus one parse retry per unparseable answer
    assert stats.requests == 3 + stats.parse_retries
    assert stats.prompt_tokens > 3 * 100 and 3 <= stats.completion_tokens <= 24 * stats.requests
    for n in judged:
        assert n.judge["model"] == vllm_tiny.model and n.judge["raw"] != ""
        assert (n.judge["status"] == "ok" and n.success in (0.0, 1.0)) or \
               (n.judge["status"] == "failed" and math.isnan(n.success))
    assert stats.failures == sum(1 for n in judged if n.judge["status"] == "failed")
    # a second pass answers parsed verdicts from the cache; only failures are asked again
    _, again = await judge_trees([t], "oolong", cfg)
    assert again.cache_hits == 3 - stats.failures


async def test_unknown_model_on_vllm_is_an_endpoint_error(vllm_tiny, tmp_path):
    cfg = JudgeConfig(base_url=vllm_tiny.base_url, model="no-such-model", cache_path=tmp_path / "c.sqlite",
                      max_retries=0)
    t = tree("oolong", [node("r", None, verifier=1.0), node("a", "r", depth=1)])
    with pytest.raises(JudgeEndpointError, match="no-such-model"):
        await judge_trees([t], "oolong", cfg)
