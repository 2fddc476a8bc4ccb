"""The update budget of one training call: optimizer steps per batch, warm-up of a fresh optimizer state, the KL
penalty to a chosen reference logged per depth (docs/algorithm.md "The trainer's steps")."""

import pytest
import torch

from rao_core.samples import Sample
from rao_core.train import TrainerConfig, train
from rao_core.train.trainer import _step_schedule, planned_steps
from rao_core.train.loss import token_logprobs


def _samples(tiny) -> list[Sample]:
    """Four on-policy node samples (depths 0, 1, 0, 1) with advantages +1, -1, +1, -1, each its own group."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    prompt = [1, 520, 3412, 28, 905, 2]
    conts = [[4110, 3310, 2970, 812], [9051, 6200, 7310, 14002], [4110, 3310, 2970, 813], [9051, 6200, 7310, 140]]
    out = []
    for k, c in enumerate(conts):
        ids = prompt + c
        mask = [0] * len(prompt) + [1] * len(c)
        with torch.no_grad():
            lp = token_logprobs(model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids]))[0].tolist()
        a = 1.0 if k % 2 == 0 else -1.0
        out.append(Sample(tree_id=f"t{k}", node_id="n", group_id=f"g{k}", depth=k % 2, token_ids=ids,
                          assistant_mask=mask, behaviour_logprobs=[x if m else 0.0 for x, m in zip(lp, mask)],
                          success=float(a > 0), reward=float(a > 0), baseline=0.5, advantage=a, weight=1.0))
    return out


def test_steps_per_batch_counts_minibatches_of_whole_groups_not_micro_batches():
    one = TrainerConfig(shuffle=False)
    assert _step_schedule(6, one, iteration=0, world=1) == [(0, [0, 1, 2, 3, 4, 5])]  # the default: one step
    assert _step_schedule(5, TrainerConfig(shuffle=False, grad_accum=1), iteration=0, world=2) == [
        (0, [0, 1]), (0, [2, 3]), (0, [4, -1])]  # two processes: 5 micro-batches padded with one filler
    assert planned_steps(6, one) == 1 and planned_steps(0, one) == 0
    assert planned_steps(12, TrainerConfig(grad_accum=3, max_steps=2)) == 2
    # more minibatches: their steps follow the samples' groups (tests/algo/test_minibatches.py), not a count
    with pytest.raises(ValueError, match="depend on the samples' groups"):
        planned_steps(6, TrainerConfig(steps_per_batch=3))


def test_the_budget_is_given_one_way_and_said_in_words():
    with pytest.raises(ValueError, match="give the update budget one way"):
        TrainerConfig(grad_accum=3, steps_per_batch=2)
    assert TrainerConfig().update_budget() == "1 optimizer step per batch"
    assert TrainerConfig(steps_per_batch=3, epochs=2, max_steps=4).update_budget() == (
        "3 optimizer steps per batch x 2 epochs, at most 4 steps")
    assert TrainerConfig(grad_accum=2).update_budget() == "one optimizer step per 2 micro-batches"
    assert TrainerConfig(steps_per_batch=4, target_kl=0.02).update_budget() == (
        "4 optimizer steps per batch, KL stop at 0.02")


def test_a_fresh_optimizer_state_warms_up_and_the_budget_is_in_the_manifest(tiny, tmp_path):
    steps: list[dict[str, float]] = []
    cfg = TrainerConfig(loss_type="ppo", lr=1e-3, micro_batch_size=1, steps_per_batch=2)
    res = train(_samples(tiny), tiny, tmp_path / "a", cfg, on_step=steps.append)
    assert [s["train/lr"] for s in steps] == pytest.approx([5e-4, 1e-3])  # warm-up over 2 steps: lr/2, then lr
    assert res.manifest["num_steps"] == 2 and res.manifest["update_budget"] == "2 optimizer steps per batch"
    # the next iteration continues the state (same loss type): no second warm-up
    more: list[dict[str, float]] = []
    train(_samples(tiny), res.checkpoint, tmp_path / "b", cfg.model_copy(update={"steps_per_batch": 1}),
          iteration=1, on_step=more.append)
    assert more[0]["train/lr"] == pytest.approx(1e-3) and more[0]["train/optimizer_steps_total"] == 3
    # a parent whose state is of another loss type (an SFT warm start) is a fresh state: it warms up again
    first_rl: list[dict[str, float]] = []
    train(_samples(tiny), res.checkpoint, tmp_path / "c", cfg.model_copy(update={"loss_type": "reinforce"}),
          iteration=1, on_step=first_rl.append)
    assert first_rl[0]["train/lr"] == pytest.approx(5e-4)


def test_kl_penalty_to_a_chosen_reference_is_logged_per_depth(tiny, tmp_path):
    samples = _samples(tiny)
    moved = train(samples, tiny, tmp_path / "moved", TrainerConfig(lr=5e-3, warmup_steps=0, micro_batch_size=4))
    steps: list[dict[str, float]] = []
    cfg = TrainerConfig(lr=1e-6, kl_coef=0.1, micro_batch_size=4)
    # parent = the reference: the first step's KL is 0 at every depth
    train(samples, tiny, tmp_path / "same", cfg, on_step=steps.append)
    assert steps[0]["train/kl_ref_depth_0"] == pytest.approx(0.0, abs=1e-7)
    assert steps[0]["train/kl_ref_depth_1"] == pytest.approx(0.0, abs=1e-7)
    # the trained checkpoint against the original as reference: a positive KL at both depths
    far: list[dict[str, float]] = []
    train(samples, moved.checkpoint, tmp_path / "far", cfg.model_copy(update={"kl_reference": str(tiny)}),
          iteration=1, on_step=far.append)
    assert far[0]["train/kl_ref_depth_0"] > 1e-4 and far[0]["train/kl_ref_depth_1"] > 1e-4
    assert far[0]["train/kl_ref"] == pytest.approx(
        (far[0]["train/kl_ref_depth_0"] + far[0]["train/kl_ref_depth_1"]) / 2, rel=1e-4)  # 4 tokens per depth
    with pytest.raises(ValueError, match="no checkpoint folder there"):
        train(samples, tiny, tmp_path / "bad", cfg.model_copy(update={"kl_reference": str(tmp_path)}))
    with pytest.raises(ValueError, match="resolved by a campaign's train stage"):
        train(samples, tiny, tmp_path / "bad", cfg.model_copy(update={"kl_reference": "warm_start"}))


def test_a_campaign_refuses_a_kl_reference_that_is_not_a_checkpoint_before_anything_starts(tmp_path):
    from rao_core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"trainer.kl_reference = '.*nowhere': no checkpoint folder there"):
        load_config("configs/cpu-smoke.yaml", ["trainer.kl_coef=0.1", f"trainer.kl_reference={tmp_path}/nowhere"])
    ok = load_config("configs/cpu-smoke.yaml", ["trainer.kl_coef=0.1", "trainer.kl_reference=warm_start"])
    assert ok.trainer.kl_reference == "warm_start"
    off = load_config("configs/cpu-smoke.yaml", [f"trainer.kl_reference={tmp_path}/nowhere"])  # no penalty: unused
    assert off.trainer.kl_coef == 0
