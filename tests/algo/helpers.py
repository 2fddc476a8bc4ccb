"""Builders of small execution trees for the algorithm tests."""

from __future__ import annotations

from rao_core.tree import EndReason, ExecutionTree, Node


def node(node_id: str, parent: str | None, depth: int, success: float | None, n_prompt: int = 2,
         n_gen: int = 2, logprob: float = -0.5) -> Node:
    """A node with ``n_prompt`` prompt ids then ``n_gen`` generated ids (ids are arbitrary small ints)."""
    ids = [(sum(map(ord, node_id)) + k) % 50 + 1 for k in range(n_prompt + n_gen)]
    return Node(node_id=node_id, parent_id=parent, depth=depth, goal=f"goal {node_id}", token_ids=ids,
                assistant_mask=[0] * n_prompt + [1] * n_gen,
                behaviour_logprobs=[0.0] * n_prompt + [logprob] * n_gen,
                end_reason=EndReason.FINISHED, success=success)


def tree(tree_id: str, group_id: str, nodes: list[Node]) -> ExecutionTree:
    """A tree whose root is the first node; children lists are filled from parent ids."""
    for n in nodes:
        n.children = [c.node_id for c in nodes if c.parent_id == n.node_id]
    return ExecutionTree(tree_id=tree_id, env="test", task_id=group_id, group_id=group_id,
                         root_id=nodes[0].node_id, nodes=nodes)


def wide_tree(tree_id: str = "t", group_id: str = "g", success: float = 1.0) -> ExecutionTree:
    """1 root, 4 children, 16 grandchildren (4 per child), all with ``success``."""
    nodes = [node("r", None, 0, success)]
    for i in range(4):
        nodes.append(node(f"c{i}", "r", 1, success))
        for j in range(4):
            nodes.append(node(f"c{i}g{j}", f"c{i}", 2, success))
    return tree(tree_id, group_id, nodes)
