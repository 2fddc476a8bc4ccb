"""Asynchronous RL: the decoupled off-policy loss (AReaL, arXiv:2505.24298 Eq. 5), the
staleness bound on training samples and the trainer's proximal log-probs (docs/algorithm/async-rl.md)."""

import json
import math

import pytest
import torch

from rao_core.samples import Sample, StaleSamplesError, check_staleness, node_sample, sample_staleness
from rao_core.train import TrainerConfig, train
from rao_core.train.data import collate
from rao_core.train.loss import policy_loss
from tests.algo.test_trainer import _samples


def _case():
    """One sample, 3 tokens, the last two trained: theta, pi_prox and pi_behaviour log-probs chosen by hand."""
    prox = torch.tensor([[0.0, -1.0, -2.0]])
    old = torch.tensor([[0.0, -1.0 - math.log(2.0), -2.0 - math.log(8.0)]])  # u = 2 on token 1, 8 on token 2
    lp = (prox + torch.tensor([[0.0, math.log(1.1), math.log(1.1)]])).requires_grad_(True)  # rho to prox = 1.1
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    return lp, prox, old, mask


def test_decoupled_ppo_by_hand_weights_each_token_by_u_and_drops_it_above_the_cap():
    lp, prox, old, mask = _case()
    loss, st = policy_loss(lp, old, mask, torch.tensor([1.0]), loss_type="ppo", clip_eps_low=0.2, clip_eps_high=0.2,
                           prox_logprobs=prox, behaviour_weight_cap=5.0)
    # token 1: -min(1.1 * 1, clip(1.1) * 1) * u = -1.1 * 2; token 2: u = 8 > 5, dropped; normaliser 2 tokens
    assert loss.item() == pytest.approx(-1.1)
    loss.backward()
    assert lp.grad[0, 1].item() == pytest.approx(-1.1)  # d/dlp of -u * exp(lp - prox) / 2 = -2 * 1.1 / 2
    assert lp.grad[0, 2].item() == 0.0 and lp.grad[0, 0].item() == 0.0
    assert st.stale_tokens.item() == 2 and st.capped_tokens.item() == 1
    assert st.behaviour_weight_sum.item() == pytest.approx(10.0)
    assert st.ratio_sum.item() == pytest.approx(2.2)  # the ratio is to pi_prox, not to pi_behaviour


def test_without_a_cap_every_stale_token_counts_and_the_clip_is_around_the_proximal_policy():
    lp, prox, old, mask = _case()
    with torch.no_grad():
        lp[0, 2] = prox[0, 2] + math.log(1.5)  # rho = 1.5 to prox: clipped at 1.2 (A > 0)
    loss, st = policy_loss(lp, old, mask, torch.tensor([1.0]), loss_type="ppo", clip_eps_low=0.2, clip_eps_high=0.2,
                           prox_logprobs=prox, behaviour_weight_cap=None)
    assert loss.item() == pytest.approx(-(1.1 * 2 + 1.2 * 8) / 2)
    assert st.capped_tokens.item() == 0 and st.clipped_tokens.item() == 1


@pytest.mark.parametrize("loss_type", ["ppo", "cispo", "reinforce"])
def test_proximal_equal_to_behaviour_is_the_on_policy_loss_and_gradient_exactly(loss_type):
    torch.manual_seed(0)
    old = -torch.rand(2, 5) * 3
    base = old + 0.3 * torch.randn(2, 5)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
    coef = torch.tensor([0.7, -1.3])
    a, b = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    la, sa = policy_loss(a, old, mask, coef, loss_type=loss_type)
    lb, sb = policy_loss(b, old, mask, coef, loss_type=loss_type, prox_logprobs=old.clone(), behaviour_weight_cap=5.0)
    la.backward()
    lb.backward()
    assert lb.item() == la.item()
    assert torch.equal(a.grad, b.grad)
    assert sb.stale_tokens.item() == 0 and sb.capped_tokens.item() == 0 and sa.stale_tokens.item() == 0


def test_proximal_logprobs_of_another_shape_or_non_finite_are_refused():
    lp, prox, old, mask = _case()
    with pytest.raises(ValueError, match="prox_logprobs"):
        policy_loss(lp, old, mask, torch.tensor([1.0]), prox_logprobs=prox[:, :2])
    bad = prox.clone()
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite proximal"):
        policy_loss(lp, old, mask, torch.tensor([1.0]), prox_logprobs=bad)


def _versioned(versions):
    return [Sample(tree_id=f"t{i}", node_id="r", group_id="g", depth=0, token_ids=[1, 2, 3], assistant_mask=[0, 1, 1],
                   behaviour_logprobs=[0.0, -1.0, -1.0], success=1.0, reward=1.0, baseline=0.5, advantage=0.5,
                   policy_version=v) for i, v in enumerate(versions)]


def test_staleness_is_the_lag_behind_the_trained_checkpoint_and_older_samples_are_refused():
    rows = _versioned([4, 3, 1, None])
    assert sample_staleness(rows, 4) == [0, 1, 3, 0]  # no version: a demonstration, counted as current
    assert check_staleness(rows, 4, 3) == {0: 2, 1: 1, 3: 1}
    with pytest.raises(StaleSamplesError, match=r"1 of 4 training samples .* oldest lag 3; algo.max_staleness 2"):
        check_staleness(rows, 4, 2)
    with pytest.raises(StaleSamplesError, match="max_staleness 0"):
        check_staleness(rows, 4, 0)  # the synchronous loop takes only the trained checkpoint's own samples
    with pytest.raises(ValueError, match="newer than the checkpoint trained from"):
        sample_staleness(_versioned([5]), 4)


def test_a_tree_passes_its_policy_version_to_its_node_samples_and_the_version_is_stored():
    from rao_core.tree import ExecutionTree, Node

    root = Node(node_id="root", depth=0, goal="g", token_ids=[1, 2], assistant_mask=[0, 1],
                behaviour_logprobs=[0.0, -0.5])
    tree = ExecutionTree(tree_id="t", task_id="x", env="textcraft", root_id="root", nodes=[root], policy_version=2)
    s = node_sample(tree, root, success=1.0, reward=1.0, baseline=0.0, advantage=1.0)
    assert s.policy_version == 2
    s2 = s.model_copy(update={"proximal_logprobs": [0.0]})
    assert "proximal_logprobs" not in json.loads(s2.model_dump_json())  # never stored: the trainer computes it
    assert json.loads(s2.model_dump_json())["policy_version"] == 2


def test_collate_gives_proximal_rows_only_when_a_sample_carries_them():
    rows = _versioned([0, 0])
    assert "proximal_logprobs" not in collate(rows, pad_id=0)
    rows[1] = rows[1].model_copy(update={"proximal_logprobs": [0.0, -0.5, -0.25]})
    batch = collate(rows, pad_id=0)
    assert batch["proximal_logprobs"].tolist() == [[0.0, -1.0, -1.0], [0.0, -0.5, -0.25]]  # row 0: its behaviour


def test_the_trainer_refuses_samples_older_than_the_bound_before_loading(tiny, tmp_path):
    rows = [s.model_copy(update={"policy_version": 0}) for s in _samples(tiny)]
    with pytest.raises(StaleSamplesError, match="more than 1 checkpoint version"):
        train(rows, tiny, tmp_path / "ckpt", TrainerConfig(loss_type="ppo"), iteration=3, max_staleness=1)
    assert not (tmp_path / "ckpt").exists()


def test_a_stale_sample_trains_against_the_proximal_policy(tiny, tmp_path):
    # behaviour log-probs of -1 (a policy unlike the tiny model): on-policy the first step's ratio is far from 1;
    # with the samples marked one version old, the ratio is to pi_prox (the checkpoint trained from) and is 1
    rows = _samples(tiny, on_policy=False)
    cfg = TrainerConfig(loss_type="ppo", lr=1e-3, micro_batch_size=2, max_grad_norm=1.0, behaviour_weight_cap=None)
    on, off = [], []
    train(rows, tiny, tmp_path / "on", cfg, iteration=2, on_step=on.append)
    stale = [s.model_copy(update={"policy_version": 0}) for s in rows]  # iteration 2 trains version 1
    res = train(stale, tiny, tmp_path / "off", cfg, iteration=2, on_step=off.append, max_staleness=1)
    assert off[0]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert abs(on[0]["train/ratio_mean"] - 1.0) > 0.1
    assert off[0]["train/stale_token_frac"] == 1.0 and off[0]["train/behaviour_weight_capped_frac"] == 0.0
    # the random model gives these tokens about exp(-10), the behaviour policy said exp(-1): u = pi_prox / pi_behaviour << 1
    assert off[0]["train/behaviour_weight_mean"] < 0.01
    assert "train/stale_token_frac" not in on[0]
    assert res.manifest["policy_version"] == {"parent": 1, "max_staleness": 1, "staleness": {"1": 4}}
    # the cap drops the tokens whose u exceeds it: a behaviour policy that gave them exp(-20) makes u about exp(10)
    unlikely = [s.model_copy(update={"behaviour_logprobs": [-20.0 * m for m in s.assistant_mask]}) for s in stale]
    capped = []
    train(unlikely, tiny, tmp_path / "cap", cfg.model_copy(update={"behaviour_weight_cap": 5.0}), iteration=2,
          on_step=capped.append, max_staleness=1)
    assert capped[0]["train/behaviour_weight_capped_frac"] == 1.0 and capped[0]["train/loss"] == 0.0


def test_proximal_log_probs_are_computed_only_for_the_samples_the_steps_train(tiny, tmp_path):
    # max_steps 1 of one 1-sample micro-batch trains one of the 4 stale samples: a forward over all of them (the
    # campaign configs train a few micro-batches of many) cost more than the steps; the one trained still gets
    # its pi_prox (its first ratio is 1, not the ~exp(9) to the behaviour log-probs of -1)
    rows = [s.model_copy(update={"policy_version": 0}) for s in _samples(tiny, on_policy=False)]
    cfg = TrainerConfig(loss_type="ppo", lr=1e-3, micro_batch_size=1, grad_accum=1, max_steps=1,
                        behaviour_weight_cap=None)
    phases, steps = [], []
    train(rows, tiny, tmp_path / "one", cfg, iteration=2, on_step=steps.append, on_phase=phases.append,
          max_staleness=1)
    assert "proximal log-probs of 1 samples from older checkpoints" in phases
    assert len(steps) == 1 and steps[0]["train/stale_token_frac"] == 1.0
    assert steps[0]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_current_samples_train_exactly_as_the_synchronous_trainer(tiny, tmp_path):
    # staleness 0 is today's loop: samples stamped with the parent's version (lag 0) give the same loss, metrics
    # and weights as samples without a version, whatever bound is allowed
    from safetensors.torch import load_file

    rows = _samples(tiny)
    cfg = TrainerConfig(loss_type="ppo", lr=1e-3, micro_batch_size=2, max_grad_norm=1.0)
    a, b = [], []
    train(rows, tiny, tmp_path / "a", cfg, iteration=3, on_step=a.append)
    train([s.model_copy(update={"policy_version": 2}) for s in rows], tiny, tmp_path / "b", cfg, iteration=3,
          on_step=b.append, max_staleness=1)
    drop = ("train/step_s", "train/tokens_per_s")
    assert [{k: v for k, v in m.items() if k not in drop} for m in a] == \
        [{k: v for k, v in m.items() if k not in drop} for m in b]
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("K", [1, 2, 3, 5])
def test_the_overlap_schedule_runs_each_stage_once_in_order_with_a_lag_of_at_most_one(K):
    from rao_core.async_rl import overlap_schedule, tree_version

    steps = overlap_schedule(K)
    assert len(steps) == K + 1 and [p.step for p in steps] == list(range(1, K + 2))
    where = {}
    for p in steps:
        for what in ("generate_first", "generate_next", "train", "evaluate"):
            k = getattr(p, what)
            if k is not None:
                key = ("generate" if what.startswith("generate") else what, k)
                assert key not in where, f"{key} scheduled twice"
                where[key] = p
    assert set(where) == {(s, k) for s in ("generate", "train", "evaluate") for k in range(1, K + 1)}
    for k in range(1, K + 1):
        gen, tr, ev = where[("generate", k)], where[("train", k)], where[("evaluate", k)]
        # trees come from the served checkpoint, which is tree_version(k); they exist before training starts
        assert gen.serve == tree_version(k, 1)
        assert gen.step < tr.step or (gen.step == tr.step and gen.generate_first == k)
        assert ev.step == tr.step + 1 and ev.serve == k  # evaluated once trained, on its own checkpoint
        assert (k - 1) - tree_version(k, 1) == (0 if k == 1 else 1)  # trained from k - 1: lag 0, then 1
    assert tree_version(3, 0) == 2 and tree_version(1, 3) == 0
    with pytest.raises(ValueError):
        overlap_schedule(0)


def test_asynchronous_rl_cannot_sleep_the_server_for_training():
    from rao_core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="gpus.sleep_while_training"):
        load_config("configs/cpu-smoke.yaml", {"algo.max_staleness": 1, "gpus.sleep_while_training": True})
    assert load_config("configs/cpu-smoke.yaml", {"algo.max_staleness": 1}).algo.max_staleness == 1


def test_iteration_ratio_stats_are_per_token_means_over_every_step():
    """The off-policy per-iteration statistics, by hand: step 1 has 100 tokens (ratio 1.0, clip 0.0, half
    stale with weight 2.0, none capped), step 2 has 300 (ratio 1.4, clip 0.2, all stale: weight 1.0, a tenth
    capped). The last step alone would say ratio 1.4; the iteration's tokens say (100 + 420) / 400 = 1.3."""
    from rao_core.async_rl import iteration_ratio_stats

    steps = [{"train/tokens": 100.0, "train/ratio_mean": 1.0, "train/clip_frac": 0.0, "train/stale_token_frac": 0.5,
              "train/behaviour_weight_mean": 2.0, "train/behaviour_weight_capped_frac": 0.0},
             {"train/tokens": 300.0, "train/ratio_mean": 1.4, "train/clip_frac": 0.2, "train/stale_token_frac": 1.0,
              "train/behaviour_weight_mean": 1.0, "train/behaviour_weight_capped_frac": 0.1}]
    got = iteration_ratio_stats(steps)
    assert got["train/iter_ratio_mean"] == pytest.approx(1.3)
    assert got["train/iter_clip_frac"] == pytest.approx(60 / 400)
    assert got["train/iter_stale_token_frac"] == pytest.approx(350 / 400)
    assert got["train/iter_behaviour_weight_mean"] == pytest.approx((50 * 2.0 + 300 * 1.0) / 350)
    assert got["train/iter_behaviour_weight_capped_frac"] == pytest.approx(30 / 350)
    # on-policy steps (no correction): only the ratio and clip means; no steps: nothing
    on = [{k: v for k, v in s.items() if "stale" not in k and "behaviour" not in k} for s in steps]
    assert set(iteration_ratio_stats(on)) == {"train/iter_ratio_mean", "train/iter_clip_frac"}
    assert iteration_ratio_stats([]) == {}
