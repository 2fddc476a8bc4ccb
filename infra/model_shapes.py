"""Shapes of the models the GPU configs name, for plans made where the weights are not (HF ``config.json``
values). No imports beyond the standard library: ``scripts/gpu_train_step.py --shape`` builds a randomly
initialised model of one of these shapes on a GPU machine that has torch and transformers but not our
dependencies, and ``infra.plan`` estimates memory from the same numbers."""

from __future__ import annotations

KNOWN_SHAPES = {
    "qwen3-4b": dict(model_type="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=9728, vocab_size=151936,
                     tie_word_embeddings=True, torch_dtype="bfloat16"),
}
