"""Leave-one-out baseline (Eq. 3), advantage (Eq. 4) and depth-level weights (Eq. 5).

Equations from ``shared/spec/rao-algorithm.md``, sections 4 and 5:

    b_g = (1/(G-1)) * sum_{h != g} r_h                                                            (3)
    A_n = R(n) - b_g                  (every node n of tree g shares its tree's baseline)        (4)
    w_d = alpha / |B_d|,   alpha = N / K                                                          (5)

Pure functions over plain sequences, no I/O. Batching over trees is done by
:func:`rao_core.samples.build_samples`.

Failure handling ([project choice], spec section 4): a root reward that is NaN (the root could not be
scored) is left out of the other trees' baselines and gets a NaN baseline itself; a group with fewer than
2 valid roots has no baseline at all (:class:`ValueError`), and the caller drops the group.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

__all__ = ["leave_one_out_baselines", "node_advantage", "depth_weights"]


def _nan(x: float | None) -> bool:
    return x is None or math.isnan(x)


def leave_one_out_baselines(root_rewards: Sequence[float | None]) -> list[float]:
    """Eq. (3) for one group: the baseline of each tree is the mean root reward of the OTHER trees.

    Args:
        root_rewards: r_g = R(root_g), one per tree of the group (length G); NaN/None when the root
            could not be scored.

    Returns:
        b_g per tree, same order and length. Over the V valid roots, ``b_g = (S - r_g) / (V - 1)``
        with ``S`` their sum; NaN for a tree whose own root reward is NaN.

    Raises:
        ValueError: fewer than 2 valid (non-NaN) root rewards, since a leave-one-out baseline needs at
            least one other tree (G = 1 is a configuration error; a group reduced below 2 by failed
            judgements contributes no samples).
    """
    valid = [float(r) for r in root_rewards if not _nan(r)]
    if len(valid) < 2:
        raise ValueError(
            f"the leave-one-out baseline (Eq. 3) needs at least 2 scored roots in a group, got "
            f"{len(valid)} valid of {len(root_rewards)} (NaN roots are left out)"
        )
    total, v = sum(valid), len(valid)
    return [math.nan if _nan(r) else (total - float(r)) / (v - 1) for r in root_rewards]  # type: ignore[arg-type]


def node_advantage(node_reward: float, baseline: float) -> float:
    """Eq. (4): ``A_n = R(n) - b_g`` (NaN in, NaN out)."""
    return float(node_reward) - float(baseline)


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
