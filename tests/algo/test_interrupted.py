"""An interrupted node (cancelled, or stopped by the tree's timeout) is left out of training by default, as the authors'
code leaves an interrupted trajectory's policy tokens out (platoon 0.4.0 utils/tinker_data_processing.py,
utils/trajectory_status.py); ``algo.interrupted: train`` trains it with its outcome s = 0 (docs/algorithm.md,
"Defaults: the authors' released setting"). Values by hand, Eqs. (1), (3)-(5)."""

import pytest

from rao_core.samples import INTERRUPTED_END_REASONS, AlgoSettings, build_samples
from rao_core.tree import EndReason
from tests.algo.helpers import node, tree


def _group(end: EndReason):
    """Tree A: root s = 1 with a finished child (s = 1) and a child that ended by ``end`` (s = 0, the judge's rule
    ``unfinished``); tree B: a root-only tree, s = 1. One group.

    Eq. (1), lambda 0.5 (eq1): R(A.r) = 1 + 0.5 * mean(1, 0) = 1.25, R(A.c1) = 1, R(A.c2) = 0, R(B.r) = 1.
    Eq. (3): b_A = R(B.r) = 1, b_B = R(A.r) = 1.25. Eq. (4): A(A.r) = 0.25, A(A.c1) = 0, A(A.c2) = -1,
    A(B.r) = -0.25."""
    cut = node("c2", "r", 1, 0.0)
    cut.end_reason = end
    return [tree("A", "g", [node("r", None, 0, 1.0), node("c1", "r", 1, 1.0), cut]),
            tree("B", "g", [node("r", None, 0, 1.0)])]


@pytest.mark.parametrize("end", [EndReason.CANCELLED, EndReason.TREE_TIMEOUT])
def test_an_interrupted_child_is_left_out_by_default_and_trained_on_request(end):
    assert end in INTERRUPTED_END_REASONS and AlgoSettings().interrupted == "exclude"
    default = build_samples(_group(end), lam=0.5)  # the function's default is the config's: the authors'
    got = {(s.tree_id, s.node_id): s for s in default.samples}
    assert sorted(got) == [("A", "c1"), ("A", "r"), ("B", "r")]
    assert default.stats.dropped_interrupted_nodes == 1
    # the cancelled child still counts in its parent's bonus (launched, failed) and the baselines are unchanged
    assert got["A", "r"].reward == pytest.approx(1.25) and got["A", "r"].advantage == pytest.approx(0.25)
    assert got["B", "r"].advantage == pytest.approx(-0.25)
    # Eq. (5) over the kept samples: depths 0, 1, 0 -> N = 3, K = 2: w_0 = 1.5 / 2, w_1 = 1.5 / 1
    assert [got["A", "r"].weight, got["A", "c1"].weight, got["B", "r"].weight] == pytest.approx([0.75, 1.5, 0.75])

    old = build_samples(_group(end), lam=0.5, interrupted="train")  # our former rule, a listed departure
    got = {(s.tree_id, s.node_id): s for s in old.samples}
    assert len(old) == 4 and old.stats.dropped_interrupted_nodes == 0
    assert got["A", "c2"].success == 0.0 and got["A", "c2"].advantage == pytest.approx(-1.0)  # pushed down
    assert got["A", "r"].advantage == pytest.approx(0.25)  # the same credit for everyone else
    # depths 0, 1, 1, 0 -> N = 4, K = 2: every w_d = 2 / 2
    assert [s.weight for s in old.samples] == pytest.approx([1.0, 1.0, 1.0, 1.0])


def test_a_node_that_ended_by_its_own_limit_is_trained_either_way():
    """Only an interruption from outside is left out: a child that used up its steps failed on its own (the authors
    grade and train it too)."""
    trees = _group(EndReason.MAX_STEPS)
    for rule in ("exclude", "train"):
        batch = build_samples(trees, lam=0.5, interrupted=rule)
        assert len(batch) == 4 and batch.stats.dropped_interrupted_nodes == 0
    with pytest.raises(ValueError, match="interrupted must be 'exclude' or 'train'"):
        build_samples(trees, lam=0.5, interrupted="drop")


def test_the_switch_is_a_campaign_setting():
    from rao_core.config import load_config

    assert load_config("configs/cpu-smoke.yaml").algo.interrupted == "exclude"
    assert load_config("configs/cpu-smoke.yaml", ["algo.interrupted=train"]).algo.interrupted == "train"
