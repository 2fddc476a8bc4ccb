"""Local node reward R(X, tau_X) of Eq. (1) (docs/algorithm.md; arXiv:2605.06639, section 2), with two rules
for its delegation bonus.

    R(X, tau_X) = s(X, tau_X) + lambda * (1/|C(X)|) * sum_{c in C(X)} s(c, tau_c)            (1)

Pure functions, no I/O. The bonus reads the direct children's base successes ``s``, never their ``R`` (bonuses
do not compound). ``algo.bonus``: ``eq1``, Eq. (1) as written; ``useful`` (default), the authors' ``cap *
succeeded / launched`` (platoon 0.4.0 ``platoon/rewards.py`` ``delegation_capped``). Departures [project choice]:

- ``useful`` adds anti-farming: a child with ``Node.no_bonus`` counts in ``|C(X)|`` and earns nothing;
- an unscored child (None/NaN) is left out of the mean (no valid child: bonus 0); an unfinished child has s = 0;
- a node whose own success is unscored gets ``R = NaN`` (dropped by :func:`rao_core.samples.build_samples`).

Docs: docs/algorithm.md#delegation-bonus.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from rao_core.tree import ExecutionTree, unit_score

__all__ = ["BONUS_RULES", "BonusRule", "assign_rewards", "delegation_bonus", "local_node_reward", "node_rewards"]

BonusRule = Literal["useful", "eq1"]
#: The delegation-bonus rules ``algo.bonus`` accepts (module docstring).
BONUS_RULES: tuple[str, ...] = ("useful", "eq1")


def delegation_bonus(children_success: Sequence[float | None], lam: float, *, bonus: BonusRule = "eq1",
                     credited: Sequence[bool] | None = None) -> float:
    """The second term of Eq. (1) for one node, by rule ``bonus`` (module docstring).

    Args:
        children_success: s(c, tau_c) of the direct children C(X), launch order; ``None``/NaN entries
            (failed judgements) are left out of numerator and denominator.
        lam: lambda of Eq. (1) (``eq1``) or the cap of the bonus (``useful``); finite, >= 0 in configs.
        bonus: ``"eq1"``: ``lam * mean(s_c)``; ``"useful"``: ``lam * sum(s_c for credited c) / n`` with n the
            number of scored children.
        credited: per child, whether it may earn its parent the bonus (False: the environment's rule said it
            forwards or pads; ``Node.no_bonus``). None: every child is credited. Ignored by ``eq1``.

    Returns:
        The bonus, in [0, lam]; 0.0 when no child is scored.

    Raises:
        ValueError: ``lam`` not finite, an unknown rule, a scored success outside [0, 1], or ``credited`` of
            another length than ``children_success``.
    """
    if not math.isfinite(lam):
        raise ValueError(f"lambda (Eq. 1) must be finite, got {lam!r}")
    if bonus not in BONUS_RULES:
        raise ValueError(f"unknown delegation-bonus rule {bonus!r}; known: {', '.join(BONUS_RULES)}")
    if credited is not None and len(credited) != len(children_success):
        raise ValueError(f"credited has {len(credited)} entries for {len(children_success)} children")
    kids = [unit_score(c, f"children_success[{i}]") for i, c in enumerate(children_success)]
    ok = [True] * len(kids) if credited is None or bonus == "eq1" else [bool(c) for c in credited]
    valid = [(s, k) for s, k in zip(kids, ok) if s is not None]
    if not valid:
        return 0.0
    return lam * sum(s for s, k in valid if k) / len(valid)


def local_node_reward(own_success: float | None, children_success: Sequence[float | None], lam: float, *,
                      bonus: BonusRule = "eq1", credited: Sequence[bool] | None = None) -> float:
    """Local reward of one node, Eq. (1), with the delegation bonus of rule ``bonus``.

    Args:
        own_success: s(X, tau_X) in [0, 1]; ``None``/NaN when the node could not be scored.
        children_success, lam, bonus, credited: as :func:`delegation_bonus` (the default ``"eq1"`` is the
            paper's Eq. 1 as written; the configs' default is ``"useful"``, ``AlgoSettings.bonus``).

    Returns:
        ``s + delegation_bonus(...)``; ``s`` alone when there is no valid child; NaN when ``own_success``
        is unscored.

    Raises:
        ValueError: as :func:`delegation_bonus`, or ``own_success`` outside [0, 1].
    """
    b = delegation_bonus(children_success, lam, bonus=bonus, credited=credited)
    s = unit_score(own_success, "own_success")
    return math.nan if s is None else s + b


def node_rewards(tree: ExecutionTree, lam: float, *, bonus: BonusRule = "eq1") -> dict[str, float]:
    """R of every node of ``tree`` (node id -> Eq. 1 reward, NaN when unscored); the tree is not modified.

    Children are the nodes whose ``parent_id`` is the node's id; their base successes ``s`` (not their
    rewards) enter the bonus, and a child with ``no_bonus`` set is not credited under ``bonus="useful"``.
    Raises ValueError as :func:`local_node_reward`, naming the tree and node.
    """
    children: dict[str, list[tuple[float | None, bool]]] = {}
    for n in tree.nodes:
        if n.parent_id is not None:
            children.setdefault(n.parent_id, []).append((n.success, n.no_bonus is None))
    out = {}
    for n in tree.nodes:
        kids = children.get(n.node_id, [])
        try:
            out[n.node_id] = local_node_reward(n.success, [s for s, _ in kids], lam, bonus=bonus,
                                               credited=[c for _, c in kids])
        except ValueError as e:
            raise ValueError(f"tree {tree.tree_id}, node {n.node_id}: {e}") from e
    return out


def assign_rewards(tree: ExecutionTree, lam: float, *, bonus: BonusRule = "eq1") -> ExecutionTree:
    """Fill ``node.reward`` of every node of ``tree`` by Eq. (1) (:func:`node_rewards`); NaN when unscored.

    The tree is updated IN PLACE and returned, so both ``assign_rewards(t, lam)`` and
    ``t = assign_rewards(t, lam)`` work. Use ``tree.model_copy(deep=True)`` first to keep the input.
    Raises ValueError as :func:`node_rewards`.
    """
    rewards = node_rewards(tree, lam, bonus=bonus)
    for n in tree.nodes:
        n.reward = rewards[n.node_id]
    return tree
