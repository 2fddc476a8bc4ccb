"""Fixtures of the judge tests: tree builders and a fake OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

import pytest

from rao_core.judge import JudgeConfig
from rao_core.tree import CellStatus, EndReason, ExecutionTree, Node, Turn


def node(node_id: str, parent: str | None, *, depth: int = 0, goal: str = "", result: Any = "done",
         verifier: float | None = None, finished: bool = True, cells: list[tuple[str, str]] | None = None) -> Node:
    """A node with optional verifier value and (code, observation) cells."""
    turns = [Turn(prompt_token_ids=[], completion_token_ids=[], completion_logprobs=[], text=c, code=c,
                  observation=o, cell_status=CellStatus.OK) for c, o in (cells or [])]
    return Node(node_id=node_id, parent_id=parent, depth=depth, goal=goal or f"goal of {node_id}",
                result=result if finished else None, turns=turns,
                end_reason=EndReason.FINISHED if finished else EndReason.MAX_STEPS,
                verifier=verifier)


def tree(env: str, nodes: list[Node], tree_id: str = "t0") -> ExecutionTree:
    """A tree whose root is the first node; children lists filled from parent ids."""
    for n in nodes:
        n.children = [c.node_id for c in nodes if c.parent_id == n.node_id]
    return ExecutionTree(tree_id=tree_id, env=env, task_id="task0", root_id=nodes[0].node_id, nodes=nodes)


@pytest.fixture
def config(tmp_path) -> JudgeConfig:
    """A judge config with a private cache file, no retry sleeps to speak of, concurrency 1 (ordered)."""
    return JudgeConfig(base_url="http://127.0.0.1:9/v1", model="judge", cache_path=tmp_path / "judge.sqlite",
                       max_concurrency=1, max_retries=2, timeout_s=10)
