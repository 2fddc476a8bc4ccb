"""Results crossing from a child to its parent or into a tree record are bounded and well-formed: size
and nesting limits give a clear ToolError in the child (and are enforced again by the orchestrator when model
code bypasses the REPL's check); NaN/inf are refused; one bad tree record never takes the other trees of a
file with it."""

from __future__ import annotations

import shutil

from rao_core.policies.scripted import ReplayPolicy, cell
from rao_core.runtime import RuntimeConfig, run_tree
from rao_core.tree import CellStatus, EndReason, ExecutionTree, Node, read_trees, write_trees
from tests.runtime.fakes import FakeEnv, task

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"


def cfg(**kw) -> RuntimeConfig:
    base = dict(max_depth=2, context_window=4096, max_new_tokens=128, sandbox=SANDBOX, repl_pool_size=0,
                tree_timeout_s=60, max_steps_per_node=4)
    base.update(kw)
    return RuntimeConfig(**base)


DEEP = "x = 1\nfor _ in range({n}):\n    x = [x]\n"


async def _root(tok, *cells: str, **kw) -> ExecutionTree:
    tree = await run_tree(FakeEnv(), task(), ReplayPolicy(default=[cell(c) for c in cells]), cfg(**kw), tokenizer=tok)
    write_trees_path_check(tree)
    return tree


def write_trees_path_check(tree: ExecutionTree) -> None:
    """Every tree a rollout returns can be written and read back."""
    assert ExecutionTree.model_validate_json(tree.model_dump_json()) == tree


async def test_deep_finish_is_refused_in_the_child_then_the_node_finishes(tok):
    tree = await _root(tok, DEEP.format(n=300) + "finish(x)", "finish('flat')")
    root = tree.root
    assert root.end_reason == EndReason.FINISHED and root.result == "flat"
    first = root.turns[0]
    assert first.cell_status == CellStatus.ERROR
    assert "ToolError: the finish() value is nested more than 64 levels deep" in first.observation


async def test_large_and_non_finite_finish_values_are_refused(tok):
    tree = await _root(tok, "finish('a' * 5000)", "finish({'v': float('nan')})", "finish([float('inf')])",
                       "finish('a' * 100)", result_max_bytes=1000)
    obs = [t.observation for t in tree.root.turns]
    assert "the finish() value is 5002 bytes as JSON; the limit is 1000 bytes" in obs[0]
    assert "contains nan, which is not valid JSON" in obs[1]
    assert "contains inf, which is not valid JSON" in obs[2]
    assert tree.root.end_reason == EndReason.FINISHED and tree.root.result == "a" * 100


async def test_deep_tool_arguments_are_refused_in_the_child(tok):
    tree = await _root(tok, DEEP.format(n=100) + "try:\n    add(x)\nexcept ToolError as e:\n    print('refused:', e)\n"
                       "finish('ok')")
    assert "refused: an argument of add() is nested more than 64 levels deep" in tree.root.turns[0].observation
    assert tree.root.result == "ok"


async def test_orchestrator_enforces_limits_when_the_repl_check_is_bypassed(tok):
    """Model code can reach the server's _send; the orchestrator still refuses (deep, big, NaN) and a
    message too deep to parse (5,000 levels) stops that REPL instead of the rollout."""
    send = "_send = finish.__globals__['_send']\n"
    raw = ("import os\nfd = finish.__globals__['_PROTO_OUT']\n"
           "os.write(fd, b'{\"type\": \"finish\", \"value\": ' + b'[' * 5000 + b']' * 5000 + b'}\\n')\n"
           "import time\ntime.sleep(5)\n")
    tree = await _root(tok, send + DEEP.format(n=300) + "_send({'type': 'finish', 'value': x, 'via': 'finish'})",
                       send + "_send({'type': 'finish', 'value': 'b' * 3000, 'via': 'finish'})",
                       raw, "finish('done')", result_max_bytes=1000)
    t = tree.root.turns
    assert "finish() was refused: the finish() value is nested more than 64 levels deep" in t[0].observation
    assert "finish() was refused: the finish() value is 3002 bytes" in t[1].observation
    assert t[2].cell_status == CellStatus.KILLED and "malformed message (RecursionError" in t[2].observation
    assert tree.root.end_reason == EndReason.FINISHED and tree.root.result == "done"
    assert tree.error is None


async def test_child_result_reaching_parent_is_bounded(tok):
    pol = ReplayPolicy(by_depth={
        0: [cell("try:\n    r = await launch_subagent('big')\nexcept ToolError as e:\n    print('child failed:', e)\n"
                 "finish('parent done')")],
        1: [cell("finish('c' * 2000)")],
    })
    tree = await run_tree(FakeEnv(), task(), pol, cfg(max_steps_per_node=1, result_max_bytes=1000), tokenizer=tok)
    child = tree.node("0.0")
    assert child.end_reason == EndReason.MAX_STEPS and child.result is None
    assert "the finish() value is 2002 bytes" in child.turns[0].observation
    assert "child failed: sub-agent ended without finishing (max_steps)" in tree.root.turns[0].observation


def test_one_unserialisable_tree_is_recorded_as_failed_and_keeps_the_others(tmp_path):
    deep: object = 1
    for _ in range(300):
        deep = [deep]

    def tree(tid: str, result: object) -> ExecutionTree:
        return ExecutionTree(tree_id=tid, env="fake", task_id="t", root_id="0", meta={"iteration": 1},
                             nodes=[Node(node_id="0", goal="g", result=result, end_reason=EndReason.FINISHED)])

    trees = [tree("a", 1), tree("bad", deep), tree("c", {"k": [1, 2]})]
    path = write_trees(tmp_path / "trees.jsonl", trees)
    back = read_trees(path)
    assert [t.tree_id for t in back] == ["a", "bad", "c"]
    assert back[0] == trees[0] and back[2] == trees[2]
    bad = back[1]
    assert bad.error.startswith("tree record could not be written whole: node(s) ['0']")
    assert bad.root.result is None and "could not be serialised" in bad.root.error
    assert bad.meta == {"iteration": 1} and trees[1].root.result is deep  # the input tree is untouched
