"""The per-token objectives of the RAO update, by the name chosen in config (``TrainerConfig.loss_type``).

Every assistant token t of node trajectory n carries the weight ``c_n = w_d * A_n`` (Eq. 5 times Eq. 4,
docs/algorithm.md). With ``logp_t = log pi_theta(y_t | ...)``, ``rho_t = exp(logp_t - old_t)`` the
importance ratio to the behaviour log-prob recorded at generation time and ``[lo, hi] = [1 - eps_low,
1 + eps_high]``, :data:`LOSSES` holds:

- ``reinforce``: ``-c_n * logp_t`` (REINFORCE, Williams 1992; exact when on-policy, rho = 1);
- ``ppo``:       ``-min(rho_t * c_n, clip(rho_t, lo, hi) * c_n)`` (PPO-clip, Schulman et al. 2017,
                 arXiv:1707.06347; asymmetric bounds as in DAPO, Yu et al. 2025, arXiv:2503.14476);
- ``cispo``:     ``-sg[clip(rho_t, lo, hi)] * c_n * logp_t`` (CISPO, MiniMax-M1, arXiv:2506.13585: clip
                 the importance weight, never drop the token's gradient; sg = stop-gradient);
- ``sft``:       ``-logp_t`` (cross-entropy on assistant tokens; weights and advantages ignored).

A new loss is one function here and one entry of :data:`LOSSES`: :func:`rao_core.train.loss.policy_loss`
applies the mask, the KL penalty and the aggregation to any of them. The functions use tensor methods
only, so this module, and the config that checks ``loss_type`` against it, import without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LOSSES", "TokenLoss"]

Tensor = Any  # torch.Tensor (not imported here)


@dataclass(frozen=True)
class TokenLoss:
    """One per-token objective: ``fn(logp, ratio, c, lo, hi) -> (loss [B, L], clipped [B, L] bool or None)``.

    ``logp`` and ``ratio`` are [B, L], ``c`` is [B, 1]; ``clipped`` marks tokens whose ratio was clipped
    (None: never). ``uses_advantage`` False means ``c`` is ignored, so a zero coefficient does not make a
    sample's loss 0 (the trainer then never skips such samples).
    """

    fn: Callable[[Tensor, Tensor, Tensor, float, float], tuple[Tensor, Tensor | None]]
    uses_advantage: bool = True


def reinforce(logp: Tensor, ratio: Tensor, c: Tensor, lo: float, hi: float) -> tuple[Tensor, None]:
    """``-c * logp``."""
    return -c * logp, None


def ppo(logp: Tensor, ratio: Tensor, c: Tensor, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """``-min(rho * c, clip(rho, lo, hi) * c)``; clipped where the clipped branch is the smaller."""
    unclipped, clipped = ratio * c, ratio.clamp(lo, hi) * c  # [B, L]
    return -unclipped.minimum(clipped), clipped < unclipped


def cispo(logp: Tensor, ratio: Tensor, c: Tensor, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """``-sg[clip(rho, lo, hi)] * c * logp``; clipped where rho is outside [lo, hi]."""
    return -ratio.detach().clamp(lo, hi) * c * logp, (ratio < lo) | (ratio > hi)


def sft(logp: Tensor, ratio: Tensor, c: Tensor, lo: float, hi: float) -> tuple[Tensor, None]:
    """``-logp``."""
    return -logp, None


LOSSES: dict[str, TokenLoss] = {
    "reinforce": TokenLoss(reinforce), "ppo": TokenLoss(ppo), "cispo": TokenLoss(cispo),
    "sft": TokenLoss(sft, uses_advantage=False),
}
