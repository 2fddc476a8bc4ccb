"""The token-level policy loss: hand-computed values for each loss type, masks, aggregation, stats."""

import math

import pytest
import torch

from rao_core.train.loss import policy_loss, token_logprobs

E = math.e


def one(logp: float, old: float = 0.0, coef: float = 1.0, **kw):
    lp = torch.tensor([[0.0, logp]], requires_grad=True)  # [1, 2]: a prompt token and an assistant token
    loss, st = policy_loss(lp, torch.tensor([[0.0, old]]), torch.tensor([[0.0, 1.0]]), torch.tensor([coef]), **kw)
    loss.backward()
    return loss.item(), lp.grad[0, 1].item(), st


def test_ppo_positive_advantage_clipped():
    # ratio = exp(1 - 0) = e > 1.2 and c = +1: min(e * 1, 1.2 * 1) = 1.2 (clipped branch, no gradient)
    loss, grad, st = one(1.0, loss_type="ppo", clip_eps_low=0.2, clip_eps_high=0.2)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and st.clipped_tokens.item() == 1


def test_ppo_negative_advantage_not_clipped():
    # ratio = e, c = -1: min(-e, -1.2) = -e (unclipped); loss = e; d loss / d logp = -c * ratio = e
    loss, grad, st = one(1.0, coef=-1.0, loss_type="ppo")
    assert loss == pytest.approx(E) and grad == pytest.approx(E) and st.clipped_tokens.item() == 0


def test_ppo_on_policy_equals_reinforce_gradient():
    # ratio = 1 (logp == old): loss = -c * 1 and d/dlogp = -c, same gradient as REINFORCE -c * logp
    loss, grad, _ = one(-0.7, old=-0.7, coef=0.5, loss_type="ppo")
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)
    loss, grad, _ = one(-0.7, coef=0.5, loss_type="reinforce")
    assert loss == pytest.approx(-0.5 * -0.7) and grad == pytest.approx(-0.5)


def test_cispo_clips_weight_keeps_gradient():
    # ratio = e, clipped weight sg(1.2); loss = -1.2 * c * logp = -1.2 * 2 * 1 = -2.4; grad = -2.4
    loss, grad, st = one(1.0, coef=2.0, loss_type="cispo", clip_eps_high=0.2)
    assert loss == pytest.approx(-2.4) and grad == pytest.approx(-2.4) and st.clipped_tokens.item() == 1


def test_asymmetric_clip():
    # ratio = exp(0.2) = 1.2214 within [0.8, 1.28] with eps_high = 0.28: not clipped; loss = -1.2214
    loss, _, st = one(0.2, loss_type="ppo", clip_eps_low=0.2, clip_eps_high=0.28)
    assert loss == pytest.approx(-math.exp(0.2)) and st.clipped_tokens.item() == 0


def test_sft_ignores_coef():
    # loss = -logp = 0.3 whatever the advantage
    loss, grad, _ = one(-0.3, coef=-5.0, loss_type="sft")
    assert loss == pytest.approx(0.3) and grad == pytest.approx(-1.0)


def test_token_mean_mask_and_normalizer():
    # two rows; REINFORCE per token -c * logp, only masked tokens count
    # row 0: c=1, tokens logp -1, -2 (both masked): 1 + 2 = 3; row 1: c=-1, logp -4 masked, -8 not: -4
    # token sum 3 - 4 = -1 over 3 tokens -> -1/3; with normalizer 10 -> -0.1
    lp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -4.0, -8.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    coef = torch.tensor([1.0, -1.0])
    loss, st = policy_loss(lp, torch.zeros_like(lp), mask, coef, loss_type="reinforce")
    assert loss.item() == pytest.approx(-1 / 3) and st.tokens.item() == 3
    loss, _ = policy_loss(lp, torch.zeros_like(lp), mask, coef, loss_type="reinforce", normalizer=10.0)
    assert loss.item() == pytest.approx(-0.1)
    assert st.tokens_per_sample.tolist() == [2.0, 1.0]


def test_kl_mismatch_and_reference_kl():
    # log ratio = log 2: k3 = 2 - 1 - log 2 = 0.30685 (mismatch to behaviour)
    _, _, st = one(math.log(2.0), loss_type="ppo", clip_eps_high=10.0)
    assert st.kl_mismatch_per_sample.item() == pytest.approx(1 - math.log(2.0))
    # reference KL: ref - logp = -log 2: k3 = 0.5 + log 2 - 1 = 0.19315, times kl_coef 0.5 added to the loss
    lp = torch.tensor([[0.0, math.log(2.0)]])
    m = torch.tensor([[0.0, 1.0]])
    base, _ = policy_loss(lp, lp.clone(), m, torch.tensor([0.0]), loss_type="ppo")
    loss, st = policy_loss(lp, lp.clone(), m, torch.tensor([0.0]), loss_type="ppo", ref_logprobs=torch.zeros_like(lp), kl_coef=0.5)
    assert (loss - base).item() == pytest.approx(0.5 * (0.5 + math.log(2.0) - 1))
    assert st.ref_kl_sum.item() == pytest.approx(0.5 + math.log(2.0) - 1)


def test_bad_inputs_rejected():
    lp = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="shape mismatch"):
        policy_loss(lp, torch.zeros(1, 2), torch.ones(1, 3), torch.ones(1))
    with pytest.raises(ValueError, match="non-finite advantage"):
        policy_loss(lp, lp, torch.ones(1, 3), torch.tensor([math.nan]))
    with pytest.raises(ValueError, match="kl_coef > 0 needs"):
        policy_loss(lp, lp, torch.ones(1, 3), torch.ones(1), kl_coef=0.1)
    with pytest.raises(ValueError, match="unknown loss_type"):
        policy_loss(lp, lp, torch.ones(1, 3), torch.ones(1), loss_type="dpo")


def test_token_logprobs_matches_naive():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    ids = torch.randint(0, 7, (2, 4))
    lp = token_logprobs(logits, ids)
    for b in range(2):
        assert lp[b, 0] == 0
        for t in range(1, 4):
            assert lp[b, t].item() == pytest.approx(torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]].item(), abs=1e-5)


def _level_mass(aggregation: str) -> tuple[float, float]:
    """Gradient mass |d loss / d logp| of depth 0 (1 root, 4000 tokens) vs depth 1 (4 children, 300 tokens),
    equal advantages, Eq. (5) weights."""
    from rao_core.advantages import depth_weights

    lengths, depths = [4000, 300, 300, 300, 300], [0, 1, 1, 1, 1]
    L = max(lengths)
    mask = torch.zeros(5, L)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logp = torch.full((5, L), -1.0, requires_grad=True)
    coef = torch.tensor(depth_weights(depths)) * 1.0  # A_n = 1 for every node
    loss, _ = policy_loss(logp, logp.detach(), mask, coef, loss_type="reinforce", aggregation=aggregation)
    loss.backward()
    g = logp.grad.abs().sum(-1)
    return float(g[0]), float(g[1:].sum())


def test_sequence_mean_gives_depth_levels_equal_gradient_mass():
    root, kids = _level_mass("token_mean")
    assert root / kids == pytest.approx(4000 * 2.5 / (4 * 300 * 0.625))  # 13.3: token count decides
    root, kids = _level_mass("sequence_mean")
    assert root == pytest.approx(kids)  # Eq. (5) now equalises the levels' gradient mass
    assert root + kids == pytest.approx(2.5 * 2 / 5)  # sum of |w_d A_n| over nodes / N nodes


def test_sequence_mean_normaliser_counts_nodes():
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    coef = torch.tensor([1.0, 1.0])
    loss, _ = policy_loss(logp, logp.detach(), mask, coef, loss_type="reinforce", aggregation="sequence_mean")
    assert float(loss) == pytest.approx((1.0 + 2.0) / 2)  # per-node means 1 and 2, averaged over 2 nodes
    loss, _ = policy_loss(logp, logp.detach(), mask, coef, loss_type="reinforce", aggregation="sequence_mean",
                          normalizer=4.0)
    assert float(loss) == pytest.approx(3.0 / 4)
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(logp, logp.detach(), mask, coef, aggregation="sum")


def test_loss_registry_chosen_by_name(monkeypatch):
    """A new loss is one entry of LOSSES: the config accepts its name and policy_loss applies it."""
    from rao_core.train import TrainerConfig
    from rao_core.train.objectives import LOSSES, TokenLoss

    assert set(LOSSES) == {"reinforce", "ppo", "cispo", "sft"} and not LOSSES["sft"].uses_advantage
    with pytest.raises(ValueError, match="unknown loss_type 'double'"):
        TrainerConfig(loss_type="double")
    monkeypatch.setitem(LOSSES, "double", TokenLoss(lambda logp, ratio, c, lo, hi: (-2 * c * logp, None)))
    assert TrainerConfig(loss_type="double").loss_type == "double"
    # -2 * c * logp with c = 0.5, logp = -0.7: loss 0.7, d loss / d logp = -2 * 0.5 = -1
    loss, grad, st = one(-0.7, coef=0.5, loss_type="double")
    assert loss == pytest.approx(0.7) and grad == pytest.approx(-1.0) and st.clipped_tokens.item() == 0
