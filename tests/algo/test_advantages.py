"""Eqs. (3), (4), (5): leave-one-out baseline and the other estimators, advantage, depth weights."""

import math

import pytest

from rao_core.advantages import ADVANTAGE_ESTIMATORS, depth_weights, group_baselines, node_advantage


def leave_one_out_baselines(roots):
    return [b for b, _ in group_baselines(roots, "leave_one_out")]


def flat(pairs):
    return [x for pair in pairs for x in pair]


def test_baseline_group_of_two():
    # G = 2: each tree's baseline is the other tree's root reward
    assert leave_one_out_baselines([1.0, 0.25]) == pytest.approx([0.25, 1.0])


def test_baseline_group_of_four():
    # r = 1, 0, 0.5, 0.5; sum 2
    # b_0 = (2 - 1)/3 = 1/3; b_1 = (2 - 0)/3 = 2/3; b_2 = b_3 = (2 - 0.5)/3 = 0.5
    assert leave_one_out_baselines([1.0, 0.0, 0.5, 0.5]) == pytest.approx([1 / 3, 2 / 3, 0.5, 0.5])


def test_baseline_matches_naive_loop():
    r = [0.1, 0.9, 0.3, 1.2, 0.0]
    naive = [sum(r[h] for h in range(len(r)) if h != g) / (len(r) - 1) for g in range(len(r))]
    assert leave_one_out_baselines(r) == pytest.approx(naive)


def test_baseline_nan_root_left_out():
    # r = 1, NaN, 0: valid are 1 and 0 -> b_0 = 0, b_2 = 1, b_1 = NaN (not (NaN + ...)/2)
    b = leave_one_out_baselines([1.0, math.nan, 0.0])
    assert b[0] == pytest.approx(0.0) and b[2] == pytest.approx(1.0) and math.isnan(b[1])
    b = leave_one_out_baselines([None, 0.5, 0.75])
    assert math.isnan(b[0]) and b[1:] == pytest.approx([0.75, 0.5])


def test_baseline_fewer_than_two_valid_raises():
    with pytest.raises(ValueError, match="at least 2 scored roots"):
        leave_one_out_baselines([1.0])  # G = 1
    with pytest.raises(ValueError, match="got 1 valid of 2"):
        leave_one_out_baselines([1.0, math.nan])
    with pytest.raises(ValueError, match="at least 2"):
        leave_one_out_baselines([])


def test_advantage():
    # A = R - b = 1.5 - 0.25 = 1.25; with the grpo scale 0.5: (1.5 - 0.25) / 0.5 = 2.5
    assert node_advantage(1.5, 0.25) == pytest.approx(1.25)
    assert node_advantage(1.5, 0.25, 0.5) == pytest.approx(2.5)


def test_estimators_by_hand():
    # r = 1, 0, 0.5, 0.5: sum 2, V = 4, mean 0.5
    r = [1.0, 0.0, 0.5, 0.5]
    assert set(ADVANTAGE_ESTIMATORS) == {"leave_one_out", "group_mean", "grpo", "none"}
    # leave_one_out: (2 - r_g) / 3 -> 1/3, 2/3, 1/2, 1/2; scale 1
    assert flat(group_baselines(r)) == pytest.approx([1 / 3, 1.0, 2 / 3, 1.0, 0.5, 1.0, 0.5, 1.0])
    # group_mean: the mean of all four, the tree's own root included
    assert group_baselines(r, "group_mean") == [(0.5, 1.0)] * 4
    # grpo: mean 0.5; squared deviations 0.25 + 0.25 + 0 + 0 = 0.5; / (V - 1) = 1/6; std = 0.408248
    assert flat(group_baselines(r, "grpo")) == pytest.approx([0.5, math.sqrt(1 / 6)] * 4)
    # none: no baseline
    assert group_baselines(r, "none") == [(0.0, 1.0)] * 4


def test_estimators_nan_root_and_flat_group():
    # r = 1, NaN, 0: the NaN root gets (NaN, NaN) and is left out of the others' mean (1 + 0) / 2 = 0.5
    out = group_baselines([1.0, math.nan, 0.0], "group_mean")
    assert out[0] == out[2] == (0.5, 1.0) and all(math.isnan(x) for x in out[1])
    # grpo with equal roots: std 0 -> scale 1 (not a division by ~0 for inner nodes whose R differs)
    assert group_baselines([1.0, 1.0], "grpo") == [(1.0, 1.0), (1.0, 1.0)]
    for name in ADVANTAGE_ESTIMATORS:  # one scored root is not a group, whatever the estimator
        with pytest.raises(ValueError, match="at least 2 scored roots"):
            group_baselines([1.0, None], name)
    with pytest.raises(ValueError, match="unknown advantage estimator 'median'"):
        group_baselines([1.0, 0.0], "median")


def test_depth_weights_paper_example():
    # 1 root, 4 children, 16 grandchildren: N = 21, K = 3, alpha = 7
    # w_0 = 7/1 = 7, w_1 = 7/4 = 1.75, w_2 = 7/16 = 0.4375; each level sums to 7, total 21
    depths = [0] + [1] * 4 + [2] * 16
    w = depth_weights(depths)
    assert w[0] == 7 and w[1:5] == [1.75] * 4 and w[5:] == [0.4375] * 16
    assert sum(w) == pytest.approx(21)


def test_depth_weights_order_and_single_depth():
    # depths 1, 0, 1, 1: N = 4, K = 2, alpha = 2 -> w(0) = 2, w(1) = 2/3
    assert depth_weights([1, 0, 1, 1]) == pytest.approx([2 / 3, 2, 2 / 3, 2 / 3])
    # one depth only (roots only): N = 3, K = 1, alpha = 3, |B_0| = 3 -> all 1
    assert depth_weights([0, 0, 0]) == [1.0, 1.0, 1.0]
    assert depth_weights([]) == []


def test_depth_weights_naive_loop():
    depths = [0, 2, 2, 1, 0, 3, 2, 1]
    n, k = len(depths), len(set(depths))
    naive = [(n / k) / sum(1 for e in depths if e == d) for d in depths]
    assert depth_weights(depths) == pytest.approx(naive)
    assert sum(depth_weights(depths)) == pytest.approx(n)


def test_depth_weights_negative_raises():
    with pytest.raises(ValueError, match=">= 0"):
        depth_weights([0, -1])
