"""Typed, serialisable execution-tree records (the record passed between every pipeline stage).

An *execution tree* is the set of agent *nodes* grown while one policy solves one RL task
(docs/algorithm.md; arXiv:2605.06639, section 1). Nodes point to their parent by id, so depth, children
and training samples all come from walking the flat node list.

Serialisation: one tree per JSON line (``ExecutionTree.model_dump_json()``), versioned by
``schema_version``; ``read_trees``/``write_trees`` round-trip to an equal object. Version 1 records (the
verifier's value in ``env_info["verifier_success"]``) are migrated on load to version 2
(``Node.verifier``). ``write_trees`` is atomic (temporary file + rename), so a file is complete or absent.

Token bookkeeping ("token in, token out", arXiv:2605.06639 section 6): every turn records the exact
prompt ids the server saw and the ids it generated with their log-probs. A node's trajectory is the last
turn's prompt ids followed by its completion ids; ``assistant_mask`` is 1 exactly on the ids that this
node's own generations produced, and ``behaviour_logprobs`` holds their log-probs (0.0 where the mask is 0).

Departures from the paper: none in the record itself; end reasons and timings are project additions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import to_json

from rao_core.jsonl import read_jsonl, write_jsonl

SCHEMA_VERSION = 2  # 2: the verifier's value is Node.verifier (was env_info["verifier_success"])


class EndReason(StrEnum):
    """Why a node stopped. Every limit that stops a node has its own value."""

    FINISHED = "finished"  # the node's code called finish(...) (or an env's finishing tool)
    MAX_STEPS = "max_steps"  # per-node step limit reached without finish
    CONTEXT_OVERFLOW = "context_overflow"  # the next prompt would exceed the node's context window
    TREE_STEP_BUDGET = "tree_step_budget"  # the whole tree's optional step budget is spent
    TREE_TIMEOUT = "tree_timeout"  # the wall-clock limit of the tree elapsed
    POLICY_ERROR = "policy_error"  # the policy server failed (dead, timeouts after retries)
    TOKEN_PREFIX_BREAK = "token_prefix_break"  # a turn's prompt ids did not extend the previous ids
    SANDBOX_ERROR = "sandbox_error"  # the node's REPL process died or could not start
    CANCELLED = "cancelled"  # the parent or the tree was cancelled
    RUNNING = "running"  # not ended yet (only in live views)


class CellStatus(StrEnum):
    """Outcome of running one code cell in the sandbox."""

    OK = "ok"
    ERROR = "error"  # the cell raised; the traceback is in the observation
    TIMEOUT = "timeout"  # per-cell wall-clock or CPU limit
    MEMORY = "memory"  # per-cell memory limit
    KILLED = "killed"  # the REPL process died (os._exit, signal, fork bomb...)
    NO_CODE = "no_code"  # the assistant message held no code cell


class Turn(BaseModel):
    """One policy generation of a node and the cell it produced.

    ``prompt_token_ids`` are exactly the ids the server received; ``completion_token_ids`` and
    ``completion_logprobs`` (natural log, same length) exactly what it returned.
    """

    model_config = ConfigDict(extra="forbid")

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    text: str  # the decoded assistant message
    finish_reason: str | None = None  # "stop" | "length" | ...
    code: str | None = None  # the code cell extracted from ``text``
    observation: str | None = None  # what the cell printed (truncated), shown to the node next
    cell_status: CellStatus | None = None
    queue_s: float = 0.0  # waiting for a concurrency slot, seconds
    generation_s: float = 0.0  # policy request latency, seconds
    execution_s: float = 0.0  # cell execution in the sandbox, seconds


class NodeTimings(BaseModel):
    """Wall-clock accounting of one node, seconds. ``started_at`` is a UNIX timestamp."""

    started_at: float = 0.0
    wall_s: float = 0.0
    queue_s: float = 0.0
    generation_s: float = 0.0
    execution_s: float = 0.0


class Node(BaseModel):
    """One agent instance solving one (sub-)task: a trajectory tau_X (arXiv:2605.06639, section 1).

    ``verifier`` is the environment's exact value of s(X, tau_X) (None: not checkable). Scoring fields
    (``success``, ``success_source``, ``reward``, ``judge``) are empty after rollout and filled by the
    judging stage: ``success`` is s(X, tau_X) of Eq. (1) in [0, 1] or NaN when the judgement
    failed; ``reward`` is R(X, tau_X) of Eq. (1).
    """

    model_config = ConfigDict(extra="forbid")

    node_id: str
    parent_id: str | None = None
    depth: int = 0
    goal: str
    goal_args: dict[str, Any] = Field(default_factory=dict)  # structured goal, e.g. TextCraft targets
    max_steps: int | None = None  # per-node step limit in force for this node
    messages: list[dict[str, Any]] = Field(default_factory=list)  # readable chat view of the context
    turns: list[Turn] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)  # [T] full trajectory of this node
    assistant_mask: list[int] = Field(default_factory=list)  # [T] 1 on this node's generated ids
    behaviour_logprobs: list[float] = Field(default_factory=list)  # [T] log pi_old, 0.0 where mask 0
    children: list[str] = Field(default_factory=list)  # ids of direct children, launch order
    result: Any = None  # the value passed to finish(...), JSON-serialisable
    end_reason: EndReason = EndReason.RUNNING
    error: str | None = None  # human-readable detail for non-"finished" ends
    env_info: dict[str, Any] = Field(default_factory=dict)  # env bookkeeping (e.g. inventory at start)
    timings: NodeTimings = Field(default_factory=NodeTimings)
    # The environment's exact check of this node (``env.verify``, set by the runtime when the node ends):
    # s(X, tau_X) in [0, 1], or None when the environment cannot check it (read it with verifier_value).
    verifier: float | None = None
    # Why this child earns its parent no delegation bonus under ``algo.bonus: useful`` (the environment's
    # verdict when it was launched, ``Environment.bonus_exclusion``: e.g. it forwards its parent's goal);
    # None: it may (rao_core.rewards).
    no_bonus: str | None = None
    # Filled by judging and credit assignment (Eq. 1):
    success: float | None = None
    success_source: str | None = None  # "verifier" | "judge" | "rule" | "proxy" | "none"
    reward: float | None = None
    judge: dict[str, Any] | None = None  # verdict, reason, raw text, model, cached

    @field_validator("verifier", mode="before")
    @classmethod
    def _check_verifier(cls, v: Any) -> float | None:
        return unit_score(v, "verifier")

    @property
    def finished(self) -> bool:
        """True when the node ended by calling finish."""
        return self.end_reason == EndReason.FINISHED

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens of the node's trajectory not generated by it (system, goal, observations)."""
        return len(self.token_ids) - sum(self.assistant_mask)

    @property
    def num_completion_tokens(self) -> int:
        """Tokens generated by this node (the ones that get a gradient)."""
        return sum(self.assistant_mask)


class ExecutionTree(BaseModel):
    """One rollout: all nodes grown from one root for one RL task.

    ``group_id`` identifies the G rollouts of the same task in one iteration (the group of Eq. 3);
    ``rollout_index`` is g in 0..G-1.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    tree_id: str
    env: str
    task_id: str
    group_id: str = ""
    rollout_index: int = 0
    root_id: str
    nodes: list[Node]
    wall_s: float = 0.0
    error: str | None = None  # set when the rollout itself crashed (partial tree kept)
    policy: str = ""  # model name / checkpoint / scripted policy name
    seed: int | None = None  # sampling seed of the rollout (task_sampling.rollout_seed; an evaluation tree: eval_tree_seed); None: unseeded
    # the checkpoint version that generated it (the RL iteration of checkpoint iter-K, the warm start 0;
    # rao_core.samples.sample_staleness); None: scripted, or recorded before asynchronous RL
    policy_version: int | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        """Version 1 -> 2: the verifier's value moves from ``env_info["verifier_success"]`` to ``verifier``."""
        if isinstance(data, dict) and data.get("schema_version") == 1:
            nodes = [dict(n, env_info={k: v for k, v in n.get("env_info", {}).items() if k != "verifier_success"},
                          verifier=n.get("env_info", {}).get("verifier_success")) for n in data.get("nodes", [])]
            data = {**data, "nodes": nodes, "schema_version": SCHEMA_VERSION}
        return data

    def node(self, node_id: str) -> Node:
        """Return the node with ``node_id``; raises KeyError naming the id if absent."""
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"tree {self.tree_id} has no node {node_id!r}")

    @property
    def root(self) -> Node:
        """The root node (depth 0)."""
        return self.node(self.root_id)

    def children_of(self, node_id: str) -> list[Node]:
        """Direct children of ``node_id`` in launch order."""
        return [n for n in self.nodes if n.parent_id == node_id]

    @property
    def depth(self) -> int:
        """Maximum node depth (0 for a root-only tree)."""
        return max((n.depth for n in self.nodes), default=0)

    def walk(self) -> Iterator[Node]:
        """Nodes in depth-first pre-order from the root."""
        by_parent: dict[str | None, list[Node]] = {}
        for n in self.nodes:
            by_parent.setdefault(n.parent_id, []).append(n)
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(reversed(by_parent.get(n.node_id, [])))


def unscored(x: Any) -> bool:
    """True for None or NaN: a success, reward or verifier value that could not be computed (the one test
    of "unscored", docs/algorithm.md: such values are left out of parents' means, baselines and the loss)."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def unit_score(v: Any, what: str) -> float | None:
    """``v`` as a score in [0, 1] (a bool counts as 0/1), None when unscored; ValueError naming ``what``
    when ``v`` is not a number in [0, 1]."""
    if unscored(v):
        return None
    if not isinstance(v, (bool, int, float)):
        raise ValueError(f"{what} = {v!r} is not a number")
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{what} = {v} is outside [0, 1]")
    return float(v)


def verifier_value(node: Node) -> float | None:
    """The verifier's value of ``node`` in [0, 1], None when not checkable; ValueError naming the node
    when the value (possibly set in memory, unvalidated) is not a number in [0, 1]."""
    return unit_score(node.verifier, f"node {node.node_id}: verifier")


def _dump(record: BaseModel) -> tuple[str, str | None]:
    """(JSON of ``record``, None), or ("", the serialisation error on one line)."""
    try:
        return record.model_dump_json(), None
    except Exception as e:  # noqa: BLE001 - pydantic raises PydanticSerializationError / ValueError
        return "", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def tree_json_line(tree: ExecutionTree) -> str:
    """``tree`` as one JSON line; a tree that cannot be serialised is recorded as failed, never dropped.

    A node whose free-form fields (``result``, ``goal_args``, ``env_info``, ``judge``) do not serialise
    (too deeply nested, not JSON) gets them emptied and an ``error`` saying so, and ``tree.error`` names
    the node; a tree still unserialisable after that becomes a root-only record with ``tree.error``.
    ``tree`` itself is never modified. NaN/inf floats in numeric fields are written as null (pydantic).
    """
    line, first = _dump(tree)
    if first is None:
        return line
    nodes, broken = [], []
    for n in tree.nodes:
        err = _dump(n)[1]
        if err is not None:
            broken.append(n.node_id)
            n = n.model_copy(update={"result": None, "goal_args": {}, "env_info": {}, "judge": None,
                                     "error": f"{n.error + '; ' if n.error else ''}record: free-form fields "
                                              f"dropped, they could not be serialised ({err})"})
        nodes.append(n)
    error = f"tree record could not be written whole: node(s) {broken[:5]} ({first})"
    meta = tree.meta
    try:
        to_json(meta)
    except Exception:  # noqa: BLE001
        meta = {}
    fixed = tree.model_copy(update={"nodes": nodes, "meta": meta,
                                    "error": (tree.error + "; " if tree.error else "") + error})
    try:
        return fixed.model_dump_json()
    except Exception:  # noqa: BLE001 - last resort: a root-only failed record
        goal = next((n.goal for n in tree.nodes if n.node_id == tree.root_id), "")
        root = Node(node_id=tree.root_id, goal=str(goal)[:2000],
                    end_reason=EndReason.SANDBOX_ERROR, error=error)
        return ExecutionTree(tree_id=tree.tree_id, env=tree.env, task_id=tree.task_id, group_id=tree.group_id,
                             rollout_index=tree.rollout_index, root_id=tree.root_id, nodes=[root],
                             wall_s=tree.wall_s, error=error, policy=tree.policy).model_dump_json()


def write_trees(path: str | os.PathLike[str], trees: Iterable[ExecutionTree]) -> Path:
    """Write trees as JSON lines atomically (temp file in the same folder, then rename).

    Each tree is serialised on its own (``tree_json_line``): one that cannot be is written as a failed
    record and never takes the others with it.
    """
    return write_jsonl(path, (tree_json_line(t) for t in trees))


def _tree_record(d: dict) -> ExecutionTree:
    t = ExecutionTree.model_validate(d)
    if t.schema_version != SCHEMA_VERSION:
        raise ValueError(f"schema_version {t.schema_version}, expected {SCHEMA_VERSION} (or 1, migrated)")
    return t


def read_trees(path: str | os.PathLike[str]) -> list[ExecutionTree]:
    """Read a JSON-lines tree file; raises ValueError naming the file and line on a bad record."""
    return read_jsonl(path, _tree_record, "execution tree record")
