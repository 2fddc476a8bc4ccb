"""The great-expectations suite on good and deliberately broken training data (no services needed)."""

from __future__ import annotations

import math

import pytest

from rao_core.samples import build_samples
from rao_core.tree import EndReason, ExecutionTree, Node


def _tree(i: int, root_success: float, *, parent: str = "0", depth: int = 1, child_tokens: int = 3) -> ExecutionTree:
    root = Node(node_id="0", goal="g", token_ids=[1, 2, 3, 4], assistant_mask=[0, 0, 1, 1],
                behaviour_logprobs=[0, 0, -1, -1], end_reason=EndReason.FINISHED, success=root_success,
                children=["0.0"])
    kid = Node(node_id="0.0", parent_id=parent, depth=depth, goal="c", token_ids=list(range(1, child_tokens + 1)),
               assistant_mask=[0] + [1] * (child_tokens - 1), behaviour_logprobs=[0.0] + [-1.0] * (child_tokens - 1),
               end_reason=EndReason.FINISHED, success=1.0)
    return ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id="a", group_id="a", rollout_index=i,
                         root_id="0", nodes=[root, kid])


def _validate(trees, **kw):
    from infra.validation import validate_training_data

    args = {"max_depth": 2, "lam": 0.5, "context_window": 100, **kw}
    return validate_training_data(trees, build_samples(trees, lam=0.5), **args)


def test_good_batch_passes_and_reports_every_expectation():
    rep = _validate([_tree(0, 1.0), _tree(1, 0.0)])
    assert rep["success"] is True and rep["failures"] == []
    assert rep["tables"]["nodes"]["rows"] == 4 and rep["tables"]["samples"]["rows"] == 4
    assert len(rep["tables"]["nodes"]["expectations"]) == 6 and len(rep["tables"]["samples"]["expectations"]) == 11
    assert rep["group_sizes"] == {"2": 4}


@pytest.mark.parametrize("broken, expected", [
    ({"parent": "ghost"}, "parent_exists"),  # a node whose parent is not in the tree
    ({"depth": 5}, "'depth'"),  # deeper than the runtime allows
    ({"child_tokens": 150}, "'num_tokens'"),  # longer than the context window
])
def test_broken_node_table_fails(broken, expected):
    rep = _validate([_tree(0, 1.0), _tree(1, 0.0, **broken)])
    assert rep["success"] is False
    assert any(expected in f for f in rep["failures"]), rep["failures"]


def test_reward_out_of_range_and_nan_advantage_fail():
    trees = [_tree(0, 1.0), _tree(1, 0.0)]
    batch = build_samples(trees, lam=0.5)
    trees[0].nodes[0].reward = 2.0  # above 1 + lambda = 1.5
    batch.samples[0].advantage = math.nan
    from infra.validation import validate_training_data

    rep = validate_training_data(trees, batch, max_depth=2, lam=0.5, context_window=100)
    assert rep["success"] is False
    assert any("'reward'" in f for f in rep["failures"])
    assert any("'advantage'" in f for f in rep["failures"])


def test_single_tree_group_fails_group_size():
    trees = [_tree(0, 1.0), _tree(1, 0.0)]
    batch = build_samples(trees, lam=0.5)
    for s in batch.samples[:2]:
        s.group_id = "lonely"  # a group with one scored tree has no leave-one-out baseline
    from infra.validation import validate_training_data

    rep = validate_training_data(trees, batch, max_depth=2, lam=0.5, context_window=100)
    assert any("group_size" in f for f in rep["failures"])


def test_no_progress_bars_in_the_stage_log(capfd):
    """great-expectations draws tqdm bars ("Calculating Metrics") by default, into piped logs of `rao run`;
    the context's ``progress_bars`` setting turns them off."""
    rep = _validate([_tree(0, 1.0), _tree(1, 0.0)])
    got = capfd.readouterr()
    assert rep["success"] is True
    assert "Calculating Metrics" not in got.err + got.out and "it/s" not in got.err


def test_a_baseline_rounded_above_the_bound_still_passes():
    """The first ablation run (cap 0.4): seven roots at R = 1.4 and one at 0 gave the failed root the
    leave-one-out baseline 1.4000000000000001 and A = -1.4000000000000001, outside [-1.4, 1.4]."""
    from infra.validation import validate_training_data

    trees = []
    for i in range(8):
        t = _tree(i, 0.0 if i == 0 else 1.0)
        t.nodes = t.nodes[:1]
        t.nodes[0].children = []
        trees.append(t)
    for t in trees[1:]:  # a credited child that succeeded: R = 1 + 0.4
        t.nodes[0].children = ["0.0"]
        t.nodes.append(_tree(9, 1.0).nodes[1])
    batch = build_samples(trees, lam=0.4, bonus="useful")
    root0 = next(s for s in batch.samples if s.tree_id == "t0" and s.depth == 0)
    assert abs(root0.advantage) > 1.4  # the rounding this test is about
    rep = validate_training_data(trees, batch, max_depth=2, lam=0.4, context_window=100)
    assert rep["success"] is True, rep["failures"]


def test_validation_keeps_great_expectations_info_lines_out_of_the_log(caplog):
    """GX's 'Created temporary directory ... for ephemeral docs site' INFO line reached every campaign's log
    (new-user trial, 2026-12-04); the validation raises that logger to WARNING."""
    import logging

    with caplog.at_level(logging.INFO):
        rep = _validate([_tree(0, 1.0), _tree(1, 0.0)])
    assert rep["success"], rep["failures"]
    assert not [r for r in caplog.records if "ephemeral docs site" in r.getMessage()]


def test_a_batch_emptied_by_the_authors_filters_passes_and_an_empty_one_without_them_fails():
    """Every group's nodes scored alike: the zero-variance filter leaves no sample, an iteration without an
    optimizer step (not bad data); the same trees with every node unscored leave no sample either and fail."""
    from infra.validation import validate_training_data

    trees = [_tree(0, 1.0), _tree(1, 1.0)]  # root and child solved in both trees: one reward, R = 1
    batch = build_samples(trees, lam=0.0, filter_zero_variance_groups=True)
    assert len(batch) == 0 and batch.stats.dropped_uniform_groups == 1
    rep = validate_training_data(trees, batch, max_depth=2, lam=0.0, context_window=100)
    assert rep["success"] is True and rep["emptied_by_filters"] is True, rep["failures"]
    assert rep["tables"]["samples"]["rows"] == 0

    for t in trees:
        for n in t.nodes:
            n.success = None
    batch = build_samples(trees, lam=0.0, filter_zero_variance_groups=True)
    assert len(batch) == 0 and batch.stats.dropped_uniform_groups == 0
    rep = validate_training_data(trees, batch, max_depth=2, lam=0.0, context_window=100)
    assert rep["success"] is False and rep["emptied_by_filters"] is False
    assert any("expect_table_row_count_to_be_between" in f for f in rep["failures"]), rep["failures"]
