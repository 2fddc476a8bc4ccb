"""The fast CPU training step computes the same update as the reference path.

Two levers are checked against the path they replace, on the tiny Llama, gradient by gradient (the master weights'
gradients just before AdamW's step, so Adam's normalisation cannot hide a difference):
- ``row_execution='per_length'`` (one forward per group of equal-length rows, no padding) vs ``'padded'``: the same
  gradients to float32 rounding (max abs difference <= 1e-6 x the largest gradient entry);
- ``bf16_weights='on'`` (a bf16 weight copy, fp32 master weights and gradients) vs bf16 autocast over fp32 weights,
  both against the fp32 reference: every parameter's gradient within bf16 rounding of the fp32 one (cosine >= 0.99
  over all gradients, relative norm error <= 5%), and the bf16 copy no further from fp32 than 2x autocast's error
  plus 1%.
"""

from __future__ import annotations

import random

import pytest
import torch

from rao_core.samples import Sample
from rao_core.train import TrainerConfig, train
from rao_core.train.config import cpu_has_bf16


def _samples(vocab: int = 250, n: int = 12, seed: int = 0) -> list[Sample]:
    """``n`` samples of lengths 9..40 (some equal, so per-length groups hold several rows), half prompt."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        T = rng.choice([9, 17, 17, 26, 33, 40])
        ids = [rng.randrange(3, vocab) for _ in range(T)]
        mask = [0] * (T // 2) + [1] * (T - T // 2)
        out.append(Sample(tree_id=f"t{i}", node_id="r", group_id=f"g{i // 4}", depth=i % 2, token_ids=ids,
                          assistant_mask=mask, behaviour_logprobs=[-5.0 * m for m in mask], success=float(i % 2),
                          reward=float(i % 2), baseline=0.5, advantage=(i % 2) - 0.5 + 0.1 * (i % 3),
                          weight=1.0 + 0.5 * (i % 2)))
    return out


def _step_grads(monkeypatch, tiny, tmp_path, name: str, **cfg) -> list[torch.Tensor]:
    """The fp32 gradients AdamW sees at the first optimizer step of ``train`` with ``cfg`` (one step over the
    whole batch), in parameter order."""
    seen: list[list[torch.Tensor]] = []
    real = torch.optim.AdamW.step

    def recording(self, *a, **k):
        seen.append([p.grad.detach().clone() for g in self.param_groups for p in g["params"]])
        return real(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # accelerate keeps one mixed-precision setting per process; these runs differ
    base = dict(loss_type="ppo", lr=1e-3, micro_batch_tokens=120, max_grad_norm=None, shuffle=False,
                resume_every_s=None)
    train(_samples(), tiny, tmp_path / name, TrainerConfig(**{**base, **cfg}), show_progress=False)
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    assert len(seen) == 1
    assert all(g.dtype == torch.float32 for g in seen[0])
    return seen[0]


def _flat(gs: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in gs])


def test_per_length_rows_give_the_padded_gradients(monkeypatch, tiny, tmp_path):
    padded = _step_grads(monkeypatch, tiny, tmp_path, "padded", row_execution="padded", dtype="float32")
    rows = _step_grads(monkeypatch, tiny, tmp_path, "rows", row_execution="per_length", dtype="float32")
    a, b = _flat(padded), _flat(rows)
    assert float(a.abs().max()) > 1e-4  # a real gradient, so equality means something
    assert float((a - b).abs().max()) <= 1e-6 * float(a.abs().max())


@pytest.mark.skipif(not cpu_has_bf16(), reason="this CPU has no native bf16 (avx512_bf16/amx_bf16)")
def test_bf16_weight_copy_gives_the_fp32_gradients_to_bf16_rounding(monkeypatch, tiny, tmp_path):
    ref = _flat(_step_grads(monkeypatch, tiny, tmp_path, "fp32", dtype="float32"))
    auto = _flat(_step_grads(monkeypatch, tiny, tmp_path, "autocast", dtype="bfloat16", bf16_weights="off"))
    copy = _flat(_step_grads(monkeypatch, tiny, tmp_path, "copy", dtype="bfloat16", bf16_weights="on"))

    def err(g: torch.Tensor) -> tuple[float, float]:
        cos = float(torch.nn.functional.cosine_similarity(g, ref, dim=0))
        return cos, float((g - ref).norm() / ref.norm())

    (cos_auto, rel_auto), (cos_copy, rel_copy) = err(auto), err(copy)
    assert cos_auto >= 0.99 and rel_auto <= 0.05, (cos_auto, rel_auto)
    assert cos_copy >= 0.99 and rel_copy <= 0.05, (cos_copy, rel_copy)
    assert rel_copy <= 2 * rel_auto + 0.01, (rel_copy, rel_auto)
    assert not torch.equal(copy, ref)  # the copy did compute in bf16


@pytest.mark.skipif(not cpu_has_bf16(), reason="this CPU has no native bf16 (avx512_bf16/amx_bf16)")
def test_bf16_weight_copy_updates_fp32_master_weights_and_refreshes_the_copy(tiny, tmp_path):
    """AdamW updates the fp32 master weights (a first step at lr 1e-6 moves every weight by about 5e-7, far below a
    bf16 weight's rounding step, and the saved fp32 weights show it), and the bf16 copy is refreshed after each step
    (two epochs of one step over the same batch: the second step's loss differs from the first)."""
    from safetensors.torch import load_file

    cfg = TrainerConfig(loss_type="ppo", lr=1e-6, micro_batch_tokens=120, dtype="bfloat16", bf16_weights="on",
                        shuffle=False, resume_every_s=None, max_grad_norm=None)
    res = train(_samples(), tiny, tmp_path / "a", cfg, show_progress=False)
    w0, w1 = load_file(tiny / "model.safetensors"), load_file(res.checkpoint / "model.safetensors")
    assert all(v.dtype == torch.float32 for v in w1.values())  # the master's dtype, not the copy's
    moved = {k: float((w1[k] - w0[k]).abs().max()) for k in w0}
    assert 1e-7 < max(moved.values()) < 1e-5, moved
    two = train(_samples(), tiny, tmp_path / "b", cfg.model_copy(update={"lr": 1e-2, "epochs": 2}),
                show_progress=False)
    assert len(two.metrics) == 2
    assert two.metrics[1]["train/loss"] != pytest.approx(two.metrics[0]["train/loss"], rel=1e-4)


def test_two_sft_runs_give_the_same_weights(tiny, tmp_path):
    """The warm start is rebuilt, not fetched: the same samples, config and machine give bit-identical weights
    (sha256 of model.safetensors), with the CPU defaults (bf16 copy where native, per-length rows, shuffled
    micro-batches, two epochs)."""
    import hashlib

    cfg = TrainerConfig(loss_type="sft", lr=1e-3, epochs=2, grad_accum=2, micro_batch_tokens=80,
                        dtype="bfloat16_if_native", resume_every_s=None)
    digests = []
    for name in ("a", "b"):
        res = train(_samples(), tiny, tmp_path / name, cfg, show_progress=False)
        assert res.manifest["compute"]["torch_threads"] == torch.get_num_threads()
        digests.append(hashlib.sha256((res.checkpoint / "model.safetensors").read_bytes()).hexdigest())
    start = hashlib.sha256((tiny / "model.safetensors").read_bytes()).hexdigest()
    assert digests[0] == digests[1] != start
