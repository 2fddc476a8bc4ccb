"""The warm start trains through the campaign's train-stage path (own process) and can use bf16 on CPU."""

from __future__ import annotations

import shutil

import pytest

from rao_core.paths import tiny_model_path
from rao_core.runtime import RuntimeConfig
from rao_core.train import TrainerConfig
from rao_core.warmstart import DemoConfig, default_sft_trainer_config, run_warm_start

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"


def test_bfloat16_on_a_cpu_with_native_bf16_is_autocast_and_refused_without(monkeypatch):
    from rao_core.train import trainer

    monkeypatch.setattr(trainer.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(trainer, "cpu_has_bf16", lambda: True)
    assert trainer._compute_dtype(TrainerConfig(dtype="bfloat16")) == "bf16"
    assert trainer._compute_dtype(TrainerConfig(dtype="bfloat16_if_native")) == "bf16"
    assert trainer._compute_dtype(TrainerConfig(dtype="auto")) == "no"  # auto stays fp32 on CPU
    monkeypatch.setattr(trainer, "cpu_has_bf16", lambda: False)
    with pytest.raises(ValueError, match="bf16-capable GPU or CPU"):
        trainer._compute_dtype(TrainerConfig(dtype="bfloat16"))
    assert trainer._compute_dtype(TrainerConfig(dtype="bfloat16_if_native")) == "no"


@pytest.mark.skipif(not (tiny_model_path() / "tokenizer_config.json").exists(), reason="tiny model not prepared")
def test_warm_start_trains_in_its_own_process(tmp_path):
    """process='subprocess': the SFT runs under `accelerate launch` (its log and metrics file exist), the
    samples it read are the ones written, and the checkpoint and step metrics come back."""
    out = tmp_path / "iter-0"
    cfg = default_sft_trainer_config(lr=1e-3, epochs=1, grad_accum=1, max_steps=1, warmup_steps=0,
                                     gradient_checkpointing=False, process="subprocess")
    rc = RuntimeConfig(sandbox=SANDBOX, context_window=4096, max_new_tokens=768, max_depth=2)
    res = run_warm_start("textcraft-synth", tiny_model_path(), out, demo_config=DemoConfig(n_tasks=1, seed=3),
                         trainer_config=cfg, runtime_config=rc)
    assert res.checkpoint == out and (out / "model.safetensors").exists()
    assert len(res.train_metrics) == 1 and res.train_metrics[0]["train/step"] == 1.0
    assert (tmp_path / "iter-0.train.log").exists() and (tmp_path / "iter-0.train-io" / "metrics.jsonl").exists()
    written = (tmp_path / "iter-0.samples.jsonl").read_text().splitlines()
    assert len(written) == res.num_samples > 0
