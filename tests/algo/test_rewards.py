"""Eq. (1): local node reward, with the arithmetic written out."""

import math

import pytest

from rao_core.rewards import assign_rewards, local_node_reward
from tests.algo.helpers import node, tree


def test_no_children_no_bonus():
    # R = s = 0.7; no children -> bonus term is 0
    assert local_node_reward(0.7, [], lam=0.5) == pytest.approx(0.7)


def test_mean_of_children_not_sum():
    # children s = 1, 0, 1 -> mean 2/3; R = 0.5 + 0.3 * 2/3 = 0.5 + 0.2 = 0.7
    assert local_node_reward(0.5, [1.0, 0.0, 1.0], lam=0.3) == pytest.approx(0.7)
    # many trivial children earn nothing extra: 10 children at s=1 give the same bonus as 1
    assert local_node_reward(0.0, [1.0] * 10, lam=0.3) == local_node_reward(0.0, [1.0], lam=0.3) == pytest.approx(0.3)


def test_nan_children_left_out():
    # children 1, NaN, None, 0 -> valid 1, 0 -> mean 0.5; R = 0 + 1.0 * 0.5 = 0.5
    assert local_node_reward(0.0, [1.0, math.nan, None, 0.0], lam=1.0) == pytest.approx(0.5)
    # all children unscored -> no valid child -> no bonus: R = 0.25
    assert local_node_reward(0.25, [math.nan, None], lam=1.0) == pytest.approx(0.25)


def test_nan_own_success_gives_nan():
    assert math.isnan(local_node_reward(math.nan, [1.0], lam=0.5))
    assert math.isnan(local_node_reward(None, [], lam=0.5))


def test_bad_input_raises():
    with pytest.raises(ValueError, match="own_success"):
        local_node_reward(1.5, [], lam=0.1)
    with pytest.raises(ValueError, match=r"children_success\[1\]"):
        local_node_reward(0.5, [0.0, -0.1], lam=0.1)
    with pytest.raises(ValueError, match="lambda"):
        local_node_reward(0.5, [], lam=math.inf)


def test_assign_rewards_uses_children_base_success_not_their_reward():
    # r(s=0) -> a(s=1) -> b(s=1); lam = 0.5
    # R(b) = 1 (leaf); R(a) = 1 + 0.5 * s(b) = 1.5; R(r) = 0 + 0.5 * s(a) = 0.5 (not 0.5 * R(a) = 0.75)
    t = tree("t", "g", [node("r", None, 0, 0.0), node("a", "r", 1, 1.0), node("b", "a", 2, 1.0)])
    out = assign_rewards(t, lam=0.5)
    assert out is t  # in place, and returned
    assert [t.node(i).reward for i in ("r", "a", "b")] == pytest.approx([0.5, 1.5, 1.0])


def test_assign_rewards_nan_child_and_nan_node():
    # r(s=1) with children a(s=NaN), b(s=0.5): bonus = 0.2 * mean(0.5) = 0.1; R(r) = 1.1; R(a) = NaN
    t = tree("t", "g", [node("r", None, 0, 1.0), node("a", "r", 1, math.nan), node("b", "r", 1, 0.5)])
    assign_rewards(t, lam=0.2)
    assert t.node("r").reward == pytest.approx(1.1)
    assert math.isnan(t.node("a").reward)
    assert t.node("b").reward == pytest.approx(0.5)


def test_assign_rewards_matches_naive_loop():
    # vectorised-by-dict path vs a plain loop over nodes calling Eq. (1) directly
    t = tree("t", "g", [node("r", None, 0, 0.2), node("a", "r", 1, 0.9), node("b", "r", 1, None),
                        node("c", "a", 2, 0.4), node("d", "a", 2, 1.0)])
    assign_rewards(t, lam=0.7)
    for n in t.nodes:
        kids = [m.success for m in t.nodes if m.parent_id == n.node_id]
        want = local_node_reward(n.success, kids, 0.7)
        assert (math.isnan(want) and math.isnan(n.reward)) or n.reward == pytest.approx(want)
