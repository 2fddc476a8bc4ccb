"""Baselines and advantages (Eqs. 3-4) with a registry of estimators, and depth-level weights (Eq. 5).

Equations as numbered in docs/algorithm.md (arXiv:2605.06639, sections 4 and 5):

    b_g = (1/(G-1)) * sum_{h != g} r_h                                                            (3)
    A_n = R(n) - b_g                  (every node n of tree g shares its tree's baseline)        (4)
    w_d = alpha / |B_d|,   alpha = N / K                                                          (5)

An estimator of :data:`ADVANTAGE_ESTIMATORS` (``algo.advantage``: ``leave_one_out``, the default, Eq. 3;
``group_mean``, ``grpo``, ``none``) maps a group's scored root rewards to a (baseline, scale) per tree, and
``A_n = (R(n) - b_g) / sigma_g``. Pure functions, no I/O. Project choice: an unscored root reward gets a NaN
baseline and is left out of the others'; a group with < 2 scored roots has none (ValueError; the caller drops it).
Docs: docs/algorithm.md#credit-assignment,
docs/algorithm.md#estimators-losses-and-the-papers-ablations-chosen-in-config.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

from rao_core.tree import unscored

__all__ = ["ADVANTAGE_ESTIMATORS", "depth_weights", "group_baselines", "node_advantage"]

#: Scored root rewards of one group (V >= 2) -> (b_g, sigma_g) per tree, same order.
Estimator = Callable[[list[float]], list[tuple[float, float]]]


def leave_one_out(r: list[float]) -> list[tuple[float, float]]:
    """Eq. (3): ``b_g = (S - r_g) / (V - 1)`` with S the sum of the V scored roots; sigma = 1."""
    total, v = sum(r), len(r)
    return [((total - x) / (v - 1), 1.0) for x in r]


def group_mean(r: list[float]) -> list[tuple[float, float]]:
    """``b_g = S / V``: the group mean, own root included (authors' default: platoon 0.4.0, 97e7601); sigma = 1."""
    return [(sum(r) / len(r), 1.0)] * len(r)


def grpo(r: list[float]) -> list[tuple[float, float]]:
    """GRPO (Shao et al. 2024, arXiv:2402.03300): ``b_g = S / V``, sigma = sqrt(sum (r - mean)^2 / (V - 1)) as
    ``torch.std`` in TRL, or 1 when that is 0 [project choice: inner nodes' R(n) - b_g need not be 0]."""
    mean = sum(r) / len(r)
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1))
    return [(mean, std if std > 0 else 1.0)] * len(r)


def no_baseline(r: list[float]) -> list[tuple[float, float]]:
    """No baseline: b_g = 0, sigma = 1, so A_n = R(n)."""
    return [(0.0, 1.0)] * len(r)


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "leave_one_out": leave_one_out, "group_mean": group_mean, "grpo": grpo, "none": no_baseline,
}


def group_baselines(root_rewards: Sequence[float | None], estimator: str = "leave_one_out",
                    ) -> list[tuple[float, float]]:
    """(b_g, sigma_g) of each tree of one group by ``estimator`` (Eq. 3 for the default).

    Args:
        root_rewards: r_g = R(root_g), one per tree of the group (length G); None/NaN when the root
            could not be scored.
        estimator: a key of :data:`ADVANTAGE_ESTIMATORS`.

    Returns:
        (b_g, sigma_g) per tree, same order and length, computed over the scored roots only; (NaN, NaN)
        for a tree whose own root is unscored.

    Raises:
        ValueError: an unknown estimator, or fewer than 2 scored root rewards (G = 1 is a configuration
            error; a group reduced below 2 by failed judgements contributes no samples).
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}")
    valid = [float(r) for r in root_rewards if not unscored(r)]  # type: ignore[arg-type]
    if len(valid) < 2:
        raise ValueError(
            f"a baseline (Eq. 3) needs at least 2 scored roots in a group, got "
            f"{len(valid)} valid of {len(root_rewards)} (NaN roots are left out)"
        )
    out = iter(ADVANTAGE_ESTIMATORS[estimator](valid))
    return [(math.nan, math.nan) if unscored(r) else next(out) for r in root_rewards]


def node_advantage(node_reward: float, baseline: float, scale: float = 1.0) -> float:
    """Eq. (4): ``A_n = (R(n) - b_g) / sigma_g`` (sigma = 1 but for ``grpo``; NaN in, NaN out)."""
    return (float(node_reward) - float(baseline)) / scale


def depth_weights(depths: Sequence[int]) -> list[float]:
    """Eq. (5): inverse-frequency weight of each node trajectory of one training batch, same order.

    With N = ``len(depths)``, K the number of distinct depths and |B_d| the count at depth d, each entry
    at depth d gets ``(N / K) / |B_d|``; the weights sum to N and every depth level sums to N / K.
    Example: 1 root, 4 children, 16 grandchildren -> N = 21, K = 3, weights 7, 1.75, 0.4375.

    Returns ``[]`` for an empty batch. Raises ValueError on a negative depth.
    """
    if not depths:
        return []
    if min(depths) < 0:
        raise ValueError(f"depths must be >= 0, got {min(depths)}")
    counts = Counter(depths)
    alpha = len(depths) / len(counts)
    return [alpha / counts[d] for d in depths]
