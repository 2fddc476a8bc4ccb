"""The cause of each missed task (rao_core.evaluation.miss_cause), by hand-built trees.

Every cause alone, then the precedence when several hold, then the counts an evaluation row keeps."""

from __future__ import annotations

import pytest

from rao_core.evaluation import MISS_CAUSES, miss_cause, miss_counts, summarise
from rao_core.tree import EndReason, ExecutionTree, Node

F = EndReason.FINISHED


def _tree(root_end: EndReason = F, root_value: float | None = 0.0,
          kids: list[tuple[EndReason, float | None, int]] = (), error: str | None = None, i: int = 0) -> ExecutionTree:
    """A root and depth-1 children given as (end reason, verifier value, number of targets)."""
    root = Node(node_id="0", goal="craft", end_reason=root_end, verifier=root_value,
                goal_args={"targets": {"a": 1, "b": 1}})
    nodes = [root]
    for j, (end, value, k) in enumerate(kids):
        child = Node(node_id=f"0.{j}", parent_id="0", depth=1, goal="part", end_reason=end, verifier=value,
                     goal_args={"targets": {f"t{m}": 1 for m in range(k)}})
        root.children.append(child.node_id)
        nodes.append(child)
    return ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id=f"task-{i}", root_id="0", nodes=nodes,
                         error=error)


@pytest.mark.parametrize("tree,cause", [
    # solved and unscored roots are not misses
    (_tree(root_value=1.0, kids=[(F, 1.0, 1), (F, 1.0, 1)]), None),
    (_tree(root_value=None, kids=[(F, 0.0, 1)]), None),
    # each cause alone
    (_tree(kids=[(F, 0.0, 2)]), "child_two_targets"),  # a 2-target child that failed
    (_tree(kids=[(EndReason.CONTEXT_OVERFLOW, 0.0, 3)]), "child_two_targets"),  # ... by its window
    (_tree(kids=[(F, 1.0, 2)]), "finished_wrong"),  # a 2-target child that succeeded is not the cause
    (_tree(kids=[(EndReason.TREE_TIMEOUT, 0.0, 2)], root_end=EndReason.TREE_TIMEOUT), "limit"),  # cut: the tree's
    (_tree(kids=[(F, 1.0, 1), (F, 0.0, 1)]), "child_failed"),  # finished wrong
    (_tree(kids=[(EndReason.CONTEXT_OVERFLOW, 0.0, 1)]), "child_failed"),  # the child's own window
    (_tree(kids=[(EndReason.MAX_STEPS, None, 1)]), "child_failed"),  # no value, did not finish
    (_tree(root_end=EndReason.CONTEXT_OVERFLOW, kids=[(F, 1.0, 1)]), "window"),
    (_tree(root_end=EndReason.MAX_STEPS), "limit"),
    (_tree(root_end=EndReason.TREE_TIMEOUT, kids=[(EndReason.TREE_TIMEOUT, 0.0, 1)]), "limit"),  # cut child: the tree's
    (_tree(root_end=EndReason.TREE_STEP_BUDGET), "limit"),
    (_tree(root_end=EndReason.POLICY_ERROR), "error"),
    (_tree(root_end=EndReason.SANDBOX_ERROR), "error"),
    (_tree(root_end=EndReason.TOKEN_PREFIX_BREAK), "error"),
    (_tree(root_end=EndReason.CANCELLED), "error"),
    (_tree(kids=[(EndReason.POLICY_ERROR, 0.0, 1)]), "error"),  # a child's server failure, the root finished
    (_tree(error="RuntimeError: crashed"), "error"),  # the rollout crashed, the root ended finished
    (_tree(kids=[(F, 1.0, 1), (F, 1.0, 1)]), "finished_wrong"),  # every child fine, the root's own miss
    (_tree(), "finished_wrong"),  # no child at all
    (_tree(root_end=EndReason.RUNNING), "other"),
    (_tree(root_value=0.75, kids=[(F, 1.0, 1)]), "finished_wrong"),  # a graded value below 1 is a miss
])
def test_each_cause_alone(tree, cause):
    assert miss_cause(tree) == cause


def test_precedence():
    # a failed two-target child beats a failed child, the window, a limit and an error
    assert miss_cause(_tree(EndReason.CONTEXT_OVERFLOW, kids=[(F, 0.0, 1), (F, 0.0, 3)])) == "child_two_targets"
    # a two-target child that succeeded leaves the cause to the failed one-target child
    assert miss_cause(_tree(EndReason.CONTEXT_OVERFLOW, kids=[(F, 0.0, 1), (F, 1.0, 3)])) == "child_failed"
    # a failed child beats the root's window, a limit and an error
    assert miss_cause(_tree(EndReason.CONTEXT_OVERFLOW, kids=[(F, 0.0, 1)])) == "child_failed"
    assert miss_cause(_tree(EndReason.TREE_TIMEOUT, kids=[(F, 0.0, 1), (EndReason.TREE_TIMEOUT, 0.0, 1)])) == \
        "child_failed"
    # the window beats a limit cutting a child and an infrastructure error
    assert miss_cause(_tree(EndReason.CONTEXT_OVERFLOW, kids=[(EndReason.TREE_TIMEOUT, 0.0, 1)],
                            error="x")) == "window"
    # a cancelled child (the root overflowed while it ran) is not a failed child
    assert miss_cause(_tree(EndReason.CONTEXT_OVERFLOW, kids=[(EndReason.CANCELLED, 0.0, 1)])) == "window"
    # a limit beats an error
    assert miss_cause(_tree(EndReason.MAX_STEPS, kids=[(EndReason.SANDBOX_ERROR, 0.0, 1)])) == "limit"
    # an error beats finished wrong
    assert miss_cause(_tree(F, kids=[(F, 1.0, 1), (EndReason.SANDBOX_ERROR, None, 1)])) == "error"
    # a failed child that the root relaunched with success (same targets, later) is not a cause; relaunched and
    # failed again, or a success before the failure, still is
    assert miss_cause(_tree(EndReason.CONTEXT_OVERFLOW, kids=[(F, 0.0, 1), (F, 1.0, 1)])) == "window"
    assert miss_cause(_tree(F, kids=[(F, 0.0, 2), (F, 1.0, 2)])) == "finished_wrong"
    assert miss_cause(_tree(F, kids=[(F, 0.0, 1), (F, 0.0, 1)])) == "child_failed"
    assert miss_cause(_tree(F, kids=[(F, 0.0, 2), (F, 1.0, 1)])) == "child_two_targets"  # other targets
    assert MISS_CAUSES == ("child_two_targets", "child_failed", "window", "limit", "error", "finished_wrong", "other")


def test_counts_follow_the_order_and_sum_to_the_scored_misses():
    trees = [_tree(i=0, root_value=1.0), _tree(i=1), _tree(i=2, root_end=EndReason.CONTEXT_OVERFLOW),
             _tree(i=3, kids=[(F, 0.0, 1)]), _tree(i=4, root_end=EndReason.CONTEXT_OVERFLOW),
             _tree(i=5, root_value=None, root_end=EndReason.POLICY_ERROR)]
    # roots: solved, finished wrong, window, child failed, window, unscored (not a miss)
    assert miss_counts(trees) == {"child_failed": 1, "window": 2, "finished_wrong": 1}
    assert list(miss_counts(trees)) == ["child_failed", "window", "finished_wrong"]  # MISS_CAUSES order
    row = summarise(trees, mode="recursive", difficulty="tier1x2")
    assert row.misses == miss_counts(trees) and sum(row.misses.values()) == row.scored - row.successes == 4
    assert row.table_row()["misses"] == {"child_failed": 1, "window": 2, "finished_wrong": 1}
    assert miss_counts(trees[:1]) == {} and summarise(trees[:1], mode="single", difficulty="x").misses == {}
