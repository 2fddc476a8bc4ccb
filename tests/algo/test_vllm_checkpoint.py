"""Checkpoints written by the trainer are served by vLLM as they are (full weights and LoRA adapter)."""

import pytest

from rao_core.samples import Sample
from rao_core.train import LoraSettings, TrainerConfig, train

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _samples():
    return [Sample(tree_id=f"t{i}", node_id="r", group_id="g", depth=i % 2, token_ids=[1, 520, 3412, 28, 800 + i, 2],
                   assistant_mask=[0, 0, 0, 0, 1, 1], behaviour_logprobs=[0, 0, 0, 0, -10.0, -10.0],
                   success=float(i % 2), reward=float(i % 2), baseline=0.5, advantage=(i % 2) - 0.5)
            for i in range(4)]


def test_trained_checkpoints_served_by_vllm(tiny_model_path, tmp_path):
    from openai import OpenAI

    from infra.serving import VLLMServer

    full = train(_samples(), tiny_model_path, tmp_path / "full", TrainerConfig(lr=1e-3, micro_batch_size=4)).checkpoint
    lora = train(_samples(), tiny_model_path, tmp_path / "lora",
                 TrainerConfig(lr=1e-3, micro_batch_size=4, lora=LoraSettings(r=8, alpha=16))).checkpoint
    with VLLMServer(full, served_model_name="policy", max_model_len=512, enable_lora=True, max_lora_rank=8,
                    log_dir=tmp_path / "logs") as server:
        client = OpenAI(base_url=server.base_url, api_key=server.api_key)
        out = client.completions.create(model="policy", prompt="Hello", max_tokens=8, temperature=0.0,
                                        logprobs=1, extra_body={"return_token_ids": True})
        assert out.usage.completion_tokens > 0 and out.choices[0].logprobs.token_logprobs
        server.load_lora("adapter", lora)
        out = client.completions.create(model="adapter", prompt="Hello", max_tokens=8, temperature=0.0)
        assert out.usage.completion_tokens > 0
