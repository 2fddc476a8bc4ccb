"""Local node reward R(X, tau_X) of Eq. (1) (docs/algorithm.md; arXiv:2605.06639, section 2).

    R(X, tau_X) = s(X, tau_X) + lambda * (1/|C(X)|) * sum_{c in C(X)} s(c, tau_c)            (1)

Pure functions, no I/O. The delegation bonus is the MEAN of the direct children's base successes ``s``
(never their rewards ``R``, so bonuses do not compound up the tree).

Departures from / additions to the paper ([project choice], docs/algorithm.md):

- an unscored success (``None`` or NaN, a failed judgement) is left out of its parent's mean; when no
  child has a valid success the bonus is 0, exactly as for a node without children;
- a node whose own success is unscored gets ``R = NaN`` (it is dropped from the loss by
  :func:`rao_core.samples.build_samples` and counted there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rao_core.tree import ExecutionTree, unit_score

__all__ = ["assign_rewards", "local_node_reward", "node_rewards"]


def local_node_reward(own_success: float | None, children_success: Sequence[float | None], lam: float) -> float:
    """Local reward of one node, Eq. (1).

    Args:
        own_success: s(X, tau_X) in [0, 1]; ``None``/NaN when the node could not be scored.
        children_success: s(c, tau_c) of the direct children C(X), any order; ``None``/NaN entries
            (failed judgements) are left out of the mean.
        lam: lambda of Eq. (1), the weight of the delegation bonus (finite).

    Returns:
        ``s + lam * mean(valid children's s)``; ``s`` alone when there is no valid child; NaN when
        ``own_success`` is unscored.

    Raises:
        ValueError: ``lam`` not finite, or a scored success outside [0, 1].
    """
    if not math.isfinite(lam):
        raise ValueError(f"lambda (Eq. 1) must be finite, got {lam!r}")
    kids = [unit_score(c, f"children_success[{i}]") for i, c in enumerate(children_success)]
    valid = [c for c in kids if c is not None]
    s = unit_score(own_success, "own_success")
    if s is None:
        return math.nan
    return s + lam * (sum(valid) / len(valid)) if valid else s


def node_rewards(tree: ExecutionTree, lam: float) -> dict[str, float]:
    """R of every node of ``tree`` (node id -> Eq. 1 reward, NaN when unscored); the tree is not modified.

    Children are the nodes whose ``parent_id`` is the node's id; their base successes ``s`` (not their
    rewards) enter the bonus. Raises ValueError as :func:`local_node_reward`, naming the tree and node.
    """
    children: dict[str, list[float | None]] = {}
    for n in tree.nodes:
        if n.parent_id is not None:
            children.setdefault(n.parent_id, []).append(n.success)
    out = {}
    for n in tree.nodes:
        try:
            out[n.node_id] = local_node_reward(n.success, children.get(n.node_id, []), lam)
        except ValueError as e:
            raise ValueError(f"tree {tree.tree_id}, node {n.node_id}: {e}") from e
    return out


def assign_rewards(tree: ExecutionTree, lam: float) -> ExecutionTree:
    """Fill ``node.reward`` of every node of ``tree`` by Eq. (1) (:func:`node_rewards`); NaN when unscored.

    The tree is updated IN PLACE and returned, so both ``assign_rewards(t, lam)`` and
    ``t = assign_rewards(t, lam)`` work. Use ``tree.model_copy(deep=True)`` first to keep the input.
    Raises ValueError as :func:`node_rewards`.
    """
    rewards = node_rewards(tree, lam)
    for n in tree.nodes:
        n.reward = rewards[n.node_id]
    return tree
