"""The update per batch: minibatches of whole groups (one optimizer step each), the approximate-KL stop on the
minibatch loop, the AdamW state carried across iterations and through a resumed campaign (docs/algorithm.md, "The
trainer's steps"; TrainerConfig.steps_per_batch, target_kl, optimizer_state)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rao_core.samples import Sample
from rao_core.train import TrainerConfig, train
from rao_core.train.data import minibatch_partition
from rao_core.train.loss import token_logprobs
from rao_core.train.trainer import OPTIMIZER_DIR, _micro_batches, _schedule, _skip_zero_coefficient, epoch_order

PROMPT = [1, 520, 3412, 28, 905, 2]
CONTS = [[4110, 3310, 2970, 812, 1001], [9051, 6200, 7310, 14002, 330, 41], [4110, 3310, 2970],
         [9051, 6200, 7310, 140], [812, 1001, 77, 5021, 6001, 311, 96], [330, 41, 4110, 3310]]
TARGET = 1e-4  # target_kl between float rounding and the KL one step at lr 3e-2 leaves on the tiny model


def _light(group_sizes: list[int], zero: frozenset[int] = frozenset()) -> list[Sample]:
    """Samples without a model: group k holds ``group_sizes[k]`` of them; those at the indices in ``zero`` have
    advantage 0; lengths vary so that micro-batches differ."""
    out, i = [], 0
    for g, n in enumerate(group_sizes):
        for _ in range(n):
            T = 6 + (i * 5) % 11
            out.append(Sample(tree_id=f"t{i}", node_id="r", group_id=f"g{g}", depth=i % 2, token_ids=[3] * T,
                              assistant_mask=[0] * 3 + [1] * (T - 3), behaviour_logprobs=[0.0] * 3 + [-1.0] * (T - 3),
                              success=1.0, reward=1.0, baseline=0.5, advantage=0.0 if i in zero else 0.5 - i % 2,
                              weight=1.0))
            i += 1
    return out


def _tiny_samples(tiny: Path, groups: int) -> list[Sample]:
    """``groups`` groups of two on-policy samples each (behaviour log-probs from the tiny model in fp32), advantages
    +1 / -1 within each group."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    out = []
    for k in range(2 * groups):
        ids = PROMPT + CONTS[k % len(CONTS)] + [17 + k]
        mask = [0] * len(PROMPT) + [1] * (len(ids) - len(PROMPT))
        with torch.no_grad():
            lp = token_logprobs(model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids]))[0].tolist()
        a = 1.0 if k % 2 == 0 else -1.0
        out.append(Sample(tree_id=f"t{k}", node_id="r", group_id=f"g{k // 2}", depth=0, token_ids=ids,
                          assistant_mask=mask, behaviour_logprobs=[x if m else 0.0 for x, m in zip(lp, mask)],
                          success=float(a > 0), reward=float(a > 0), baseline=0.5, advantage=a, weight=1.0))
    return out


def _fp32(**kw) -> TrainerConfig:
    """fp32 compute (no bf16 weight copy): on-policy samples have a KL of float rounding at the first step."""
    return TrainerConfig(**{**dict(loss_type="ppo", dtype="float32", resume_every_s=None, warmup_steps=0), **kw})


def test_minibatch_partition_keeps_groups_whole_and_uses_each_sample_once():
    gids = ["a", "a", "b", "c", "c", "c", "d", "b", "e"]  # 5 groups, b's samples apart
    for k in (1, 2, 3, 5, 9):
        for epoch in (0, 1):
            parts = minibatch_partition(gids, k, seed=3, iteration=2, epoch=epoch)
            assert sorted(i for p in parts for i in p) == list(range(len(gids)))  # each sample exactly once
            assert all(p == sorted(p) for p in parts)
            owner = {gids[i]: n for n, p in enumerate(parts) for i in p}
            assert all(owner[gids[i]] == n for n, p in enumerate(parts) for i in p)  # a group in one minibatch
            assert len(parts) == min(k, 5)
            assert sorted(len({gids[i] for i in p}) for p in parts) == sorted(
                [5 // min(k, 5) + (n < 5 % min(k, 5)) for n in range(min(k, 5))])  # equal group counts
    assert minibatch_partition(gids, 1) == [list(range(len(gids)))]
    shuffled = {tuple(map(tuple, minibatch_partition(gids, 2, seed=0, iteration=it, epoch=0))) for it in range(8)}
    assert len(shuffled) > 1  # another iteration, another partition
    assert minibatch_partition(gids, 2, shuffle=False) == [[0, 1, 2, 7], [3, 4, 5, 6, 8]]  # a, b | c, d, e
    assert minibatch_partition([], 3) == []
    with pytest.raises(ValueError, match="minibatches must be >= 1"):
        minibatch_partition(gids, 0)


def test_one_minibatch_is_one_step_over_the_whole_batch_as_before():
    """steps_per_batch 1 (the default): one step per epoch over the micro-batches of all running samples, in
    epoch_order, with every skipped (zero-coefficient) sample in its normaliser: the schedule the trainer had
    before minibatches."""
    rows_all = _light([3, 2, 4], zero=frozenset({1, 4}))
    cfg = TrainerConfig(micro_batch_size=2, epochs=2, seed=5)
    rows, skipped = _skip_zero_coefficient(rows_all, cfg)
    mbs, steps = _schedule(rows_all, rows, cfg, iteration=7, world=1)
    flat = _micro_batches(rows, cfg)
    assert len(steps) == 2 and skipped[0] == 2
    for epoch, step in enumerate(steps):
        assert step.epoch == epoch and step.skipped == skipped
        assert [mbs[j].indices for j in step.micro_batches] == [
            flat[j].indices for j in epoch_order(len(flat), seed=5, iteration=7, epoch=epoch)]
    # two processes: 7 samples in 3 micro-batches, padded with a filler to whole rounds of 2
    _, two = _schedule(rows_all, rows, cfg.model_copy(update={"micro_batch_size": 3}), iteration=7, world=2)
    assert [len(s.micro_batches) for s in two] == [4, 4] and [s.micro_batches.count(-1) for s in two] == [1, 1]


def test_k_minibatches_are_k_steps_of_whole_groups_each_sample_once():
    rows_all = _light([2, 3, 1, 2, 2], zero=frozenset({5}))  # sample 5 (group g2's only one) has coefficient 0
    cfg = TrainerConfig(micro_batch_size=1, steps_per_batch=2, shuffle=False)
    rows, _ = _skip_zero_coefficient(rows_all, cfg)
    mbs, steps = _schedule(rows_all, rows, cfg, iteration=0, world=1)
    assert len(steps) == 2
    seen = [rows[i] for s in steps for j in s.micro_batches for i in mbs[j].indices]
    assert sorted(s.tree_id for s in seen) == sorted(s.tree_id for s in rows)  # each running sample once
    groups = [{rows[i].group_id for j in s.micro_batches for i in mbs[j].indices} for s in steps]
    # 5 groups in 2 minibatches: g0 g1 | g2 g3 g4; g2 has nothing to run (its sample is in the second normaliser)
    assert groups == [{"g0", "g1"}, {"g3", "g4"}]
    assert [s.skipped for s in steps] == [(0, 0), (1, rows_all[5].num_assistant_tokens)]
    # a minibatch whose every sample has coefficient 0 takes no step (the authors' rule)
    _, fewer = _schedule(rows_all, rows, cfg.model_copy(update={"steps_per_batch": 5}), iteration=0, world=1)
    assert len(fewer) == 4
    _, capped = _schedule(rows_all, rows, cfg.model_copy(update={"steps_per_batch": 5, "max_steps": 3}), 0, 1)
    assert len(capped) == 3


def test_one_minibatch_gives_the_update_of_one_step_over_every_micro_batch(tiny, tmp_path):
    """The default's update equals the one-step update of the unchanged grad_accum path (every micro-batch in one
    step, same order and normaliser): bit-identical weights on the tiny model."""
    from safetensors.torch import load_file

    samples = _tiny_samples(tiny, groups=3)
    base = dict(micro_batch_size=2, lr=1e-3, seed=1)
    one = train(samples, tiny, tmp_path / "one", TrainerConfig(**base), show_progress=False)
    ref = train(samples, tiny, tmp_path / "ref", TrainerConfig(grad_accum=3, **base), show_progress=False)
    assert len(one.metrics) == len(ref.metrics) == 1 and one.metrics[0]["train/samples"] == 6
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "ref" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    w0 = load_file(tiny / "model.safetensors")
    assert any(not torch.equal(a[k], w0[k]) for k in a)  # it moved


def test_k_minibatches_take_k_optimizer_steps_of_whole_groups(tiny, tmp_path, monkeypatch):
    import rao_core.train.trainer as trainer

    samples = _tiny_samples(tiny, groups=3)
    forwards: list[list[str]] = []  # the groups of each forward pass
    real = trainer.collate
    monkeypatch.setattr(trainer, "collate", lambda rows, *a, **k: (forwards.append([s.group_id for s in rows]),
                                                                    real(rows, *a, **k))[1])
    per_step: list[set[str]] = []

    def cut(m):
        per_step.append({g for f in forwards for g in f})
        forwards.clear()

    res = train(samples, tiny, tmp_path / "k3", _fp32(steps_per_batch=3, lr=1e-4, micro_batch_size=1), on_step=cut)
    assert len(res.metrics) == 3 and res.manifest["num_steps"] == 3
    assert res.manifest["update_budget"] == "3 optimizer steps per batch"
    assert [m["train/samples"] for m in res.metrics] == [2.0, 2.0, 2.0]
    assert sorted(map(sorted, per_step)) == [["g0"], ["g1"], ["g2"]]  # one whole group per step
    two = train(samples, tiny, tmp_path / "k2", _fp32(steps_per_batch=2, lr=1e-4, micro_batch_size=1))
    assert sorted(m["train/samples"] for m in two.metrics) == [2.0, 4.0]  # 3 groups in 2: one and two


def test_the_kl_stop_ends_the_minibatch_loop_after_the_step_whose_kl_passes_the_target(tiny, tmp_path):
    """On-policy samples in fp32: the first minibatch's approximate KL is float rounding (below the target); a large
    step then moves the policy, so the second minibatch's KL, measured in its own forward before its update, passes
    the target: that step is taken and the third is skipped."""
    samples = _tiny_samples(tiny, groups=3)
    cfg = _fp32(steps_per_batch=3, lr=3e-2, micro_batch_size=2, shuffle=False, max_grad_norm=None)
    free = train(samples, tiny, tmp_path / "free", cfg, show_progress=False)
    kl = [m["train/approx_kl"] for m in free.metrics]
    assert len(kl) == 3 and kl[0] < 1e-6 < TARGET < kl[1], kl  # the case this test needs
    assert kl[0] == pytest.approx(free.metrics[0]["train/kl_mismatch"], abs=1e-9)  # on-policy: the same estimate
    assert "train/kl_stop" not in free.metrics[0] and free.manifest["kl_stop"]["stopped"] is False

    calls: list[tuple[int, int]] = []
    phases: list[str] = []
    stopped = train(samples, tiny, tmp_path / "stop", cfg.model_copy(update={"target_kl": TARGET}),
                    show_progress=False, on_progress=lambda d, t: calls.append((d, t)), on_phase=phases.append)
    assert [m["train/kl_stop"] for m in stopped.metrics] == [0.0, 1.0]
    assert [m["train/approx_kl"] for m in stopped.metrics] == pytest.approx(kl[:2], rel=1e-4)
    assert stopped.manifest["num_steps"] == 2 and stopped.manifest["kl_stop"] == {
        "target_kl": TARGET, "stopped": True, "steps_planned": 3, "approx_kl": stopped.metrics[1]["train/approx_kl"]}
    assert calls == [(1, 3), (2, 2)]  # the plan is lowered to the steps taken
    assert any("the remaining 1 step(s) skipped" in p for p in phases)
    high = train(samples, tiny, tmp_path / "high", cfg.model_copy(update={"target_kl": 10 * max(kl) + 1}))
    assert len(high.metrics) == 3 and high.manifest["kl_stop"]["stopped"] is False


def test_the_optimizer_state_survives_a_resumed_campaign(tiny, tmp_path):
    """Iteration 2 continues iteration 1's AdamW moments from the checkpoint folder alone: copied away (as a resumed
    campaign fetches iter-1 from the store) and the original deleted, it gives the same weights and moments as two
    steps of one uninterrupted run; a reset state gives other weights."""
    from safetensors.torch import load_file

    samples = _tiny_samples(tiny, groups=2)
    cfg = _fp32(loss_type="reinforce", lr=1e-3, micro_batch_size=4, shuffle=False, warmup_steps=2)
    both = train(samples, tiny, tmp_path / "both", cfg.model_copy(update={"epochs": 2}), iteration=1)
    assert len(both.metrics) == 2
    first = train(samples, tiny, tmp_path / "it1", cfg, iteration=1)
    shutil.copytree(first.checkpoint, tmp_path / "fetched" / "iter-1")
    shutil.rmtree(first.checkpoint)
    second = train(samples, tmp_path / "fetched" / "iter-1", tmp_path / "it2", cfg, iteration=2)
    assert second.manifest["optimizer_state"] == {"continued": True, "why": "continued", "steps_total": 2}
    assert second.metrics[0]["train/lr"] == pytest.approx(both.metrics[1]["train/lr"])  # warm-up not restarted
    a, b = load_file(tmp_path / "both" / "model.safetensors"), load_file(tmp_path / "it2" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-8) for k in a)
    sa = torch.load(tmp_path / "both" / OPTIMIZER_DIR / "state.pt", weights_only=True)["optimizer"]["state"]
    sb = torch.load(tmp_path / "it2" / OPTIMIZER_DIR / "state.pt", weights_only=True)["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert int(sa[k]["step"]) == int(sb[k]["step"]) == 2
        assert torch.allclose(sa[k]["exp_avg"], sb[k]["exp_avg"], rtol=1e-6, atol=1e-12)
        assert torch.allclose(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"], rtol=1e-6, atol=1e-18)
    fresh = train(samples, tmp_path / "fetched" / "iter-1", tmp_path / "reset",
                  cfg.model_copy(update={"optimizer_state": "reset"}), iteration=2)
    c = load_file(fresh.checkpoint / "model.safetensors")
    assert max(float((a[k] - c[k]).abs().max()) for k in a) > 1e-5  # the state matters: this test can tell
