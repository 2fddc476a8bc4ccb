"""What an evaluation row keeps so a record can be audited (per-task outcomes, end reasons, tokens
and wall-clock per tree, children and depth histograms, per-depth statistics) and the compact tree sample."""

from __future__ import annotations

import json

import pytest

from rao_core.evaluation import (EvalConfig, compact_tree, depth_stats, report_from_trees, summarise,
                                 tree_sample)
from rao_core.envs.base import Task
from rao_core.tree import EndReason, ExecutionTree, Node, Turn


def _node(nid: str, parent: str | None, depth: int, verifier: float | None, gen: int, end=EndReason.FINISHED,
          text: str = "ok") -> Node:
    """A node with ``gen`` generated tokens after a 2-token prompt, and one turn."""
    turn = Turn(prompt_token_ids=[1, 2], completion_token_ids=[3] * gen, completion_logprobs=[-0.5] * gen,
                text=text, code="print(1)", observation="1")
    return Node(node_id=nid, parent_id=parent, depth=depth, goal=f"goal {nid}", verifier=verifier, end_reason=end,
                token_ids=[1, 2] + [3] * gen, assistant_mask=[0, 0] + [1] * gen,
                behaviour_logprobs=[0.0, 0.0] + [-0.5] * gen, turns=[turn],
                messages=[{"role": "system", "content": "a long system prompt"}])


def _tree(i: int, nodes: list[Node], wall_s: float) -> ExecutionTree:
    for n in nodes:
        if n.parent_id is not None:
            next(p for p in nodes if p.node_id == n.parent_id).children.append(n.node_id)
    return ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id=f"task-{i}", root_id="0", nodes=nodes,
                         wall_s=wall_s)


@pytest.fixture
def trees() -> list[ExecutionTree]:
    # t0: solved root (10 tokens) with two children (4 and 6 tokens; one solved), the first with a grandchild
    #     (2 tokens, max_steps, unscored); t1: failed root alone (5 tokens, max_steps); t2: unscored root (3 tokens)
    t0 = _tree(0, [_node("0", None, 0, 1.0, 10), _node("0.0", "0", 1, 1.0, 4), _node("0.1", "0", 1, 0.0, 6),
                   _node("0.0.0", "0.0", 2, None, 2, EndReason.MAX_STEPS)], wall_s=9.0)
    t1 = _tree(1, [_node("0", None, 0, 0.0, 5, EndReason.MAX_STEPS)], wall_s=1.0)
    t2 = _tree(2, [_node("0", None, 0, None, 3, EndReason.CONTEXT_OVERFLOW)], wall_s=2.0)
    return [t0, t1, t2]


def test_row_keeps_per_task_outcomes_histograms_tokens_and_per_depth(trees):
    r = summarise(trees, mode="recursive", difficulty="tier1x2")
    assert r.per_task == {"task-0": 1, "task-1": 0, "task-2": None}  # None: unscored, left out of the rate
    assert r.end_reasons == {"context_overflow": 1, "finished": 1, "max_steps": 1}  # roots only
    # completion tokens: 10 + 4 + 6 + 2 = 22, 5, 3 -> total 30, mean 10 per tree
    assert r.tokens_total == 30 and r.mean_tokens == pytest.approx(10.0)
    assert r.median_tree_wall_s == 2.0 and r.mean_tree_wall_s == pytest.approx(4.0)  # 1, 2, 9
    assert r.children_per_tree == {"0": 2, "2": 1}  # the root's children: 2, 0, 0
    assert r.depth_hist == {"0": 2, "2": 1}
    d = r.per_depth
    # depth 0: 3 roots, 2 scored (1, 0), one delegated (2 children): 2 / 3 children per node
    assert d["0"] == {"nodes": 3, "scored": 2, "success": 0.5, "delegation_rate": round(1 / 3, 6),
                      "children_per_node": round(2 / 3, 6),
                      "end_reasons": {"context_overflow": 1, "finished": 1, "max_steps": 1}}
    # depth 1: two children (1, 0), one of them delegated once
    assert d["1"] == {"nodes": 2, "scored": 2, "success": 0.5, "delegation_rate": 0.5, "children_per_node": 0.5,
                      "end_reasons": {"finished": 2}}
    assert d["2"] == {"nodes": 1, "scored": 0, "success": None, "delegation_rate": 0.0, "children_per_node": 0.0,
                      "end_reasons": {"max_steps": 1}}
    assert depth_stats(trees) == d
    row = r.table_row()
    assert (row["tokens_per_tree"], row["tokens_total"], row["tree_wall_s_median"]) == (10.0, 30, 2.0)
    assert "tokens_per_success" not in row and "trees" not in row  # no sample asked for
    assert row["per_task"] == r.per_task and row["per_depth"]["1"]["success"] == 0.5
    assert json.loads(json.dumps(row)) == row  # JSON keys already strings: a marker read back is equal


def test_per_task_outcome_follows_the_scoring_rule():
    t = [_tree(0, [_node("0", None, 0, 0.5, 1)], 1.0), _tree(1, [_node("0", None, 0, 1.0, 1)], 1.0)]
    assert summarise(t, mode="single", difficulty="x").per_task == {"task-0": 0.5, "task-1": 1}  # graded value
    assert summarise(t, mode="single", difficulty="x", graded=False).per_task == {"task-0": 0, "task-1": 1}


def test_compact_tree_strips_arrays_and_cuts_long_texts(trees):
    big = trees[0].model_copy(deep=True)
    big.nodes[1].turns[0].text = "x" * 50
    small = compact_tree(big, max_chars=20)
    assert all(n.token_ids == [] and n.assistant_mask == [] and n.behaviour_logprobs == [] and n.messages == []
               for n in small.nodes)
    assert all(t.prompt_token_ids == t.completion_token_ids == t.completion_logprobs == []
               for n in small.nodes for t in n.turns)
    kept = small.nodes[0].turns[0]
    assert (kept.text, kept.code, kept.observation) == ("ok", "print(1)", "1")  # short texts kept whole
    assert small.nodes[1].turns[0].text == "x" * 20 + "... [30 characters cut]"
    assert [n.end_reason for n in small.nodes] == [n.end_reason for n in big.nodes]
    assert small.meta["compact"]["completion_tokens"] == {"0": 10, "0.0": 4, "0.1": 6, "0.0.0": 2}
    assert small.meta["compact"]["trajectory_tokens"]["0"] == 12
    assert big.nodes[0].token_ids and big.nodes[1].turns[0].text == "x" * 50  # the original is unchanged
    assert ExecutionTree.model_validate_json(small.model_dump_json()) == small


def test_tree_sample_alternates_failures_and_successes_within_a_size_bound():
    ts = [_tree(i, [_node("0", None, 0, v, 3)], 1.0) for i, v in enumerate([1.0, 1.0, 0.0, None, 1.0, 0.0])]
    # failed (value < 1 or unscored): 2, 3, 5; solved: 0, 1, 4 -> order 2, 0, 3, 1, 5, 4; kept in task order
    assert [t.task_id for t in tree_sample(ts, 3)] == ["task-0", "task-2", "task-3"]
    assert [t.task_id for t in tree_sample(ts, 10)] == [f"task-{i}" for i in range(6)]
    assert tree_sample(ts, 0) == []
    one = len(compact_tree(ts[2]).model_dump_json())
    assert len(tree_sample(ts, 10, max_chars=2 * one + 10)) == 2  # the budget: JSON characters of the sample
    r = summarise(ts, mode="recursive", difficulty="all", keep_trees=2)
    assert [t.task_id for t in r.sample] == ["task-0", "task-2"]
    row = r.table_row()
    assert [t["task_id"] for t in row["trees"]] == ["task-0", "task-2"]
    assert row["trees"][0]["nodes"][0]["token_ids"] == []
    assert "sample" not in r.model_dump()  # never serialised with the row itself


def test_report_from_trees_keeps_the_configured_sample():
    ts = [_tree(i, [_node("0", None, 0, 1.0, 3)], 1.0) for i in range(4)]
    tasks = [Task(task_id=f"task-{i}", env="textcraft-synth", difficulty="tier1x2") for i in range(4)]
    rep = report_from_trees(tasks, ts, mode="recursive", keep_trees=3)
    assert len(rep.rows[0].sample) == 3 and len(rep.trees) == 4
    assert len(report_from_trees(tasks, ts, mode="recursive").rows[0].sample) == 4  # default 10 >= 4 trees
    assert report_from_trees(tasks, ts, mode="recursive", keep_trees=0).rows[0].sample == []
    assert EvalConfig().stored_trees == 10
    with pytest.raises(ValueError):
        EvalConfig(stored_trees=-1)


def test_a_row_counts_distinct_problems_not_draws():
    """Three draws of two problems (task ids differ, two share their targets): n 3, distinct_problems 2, per
    difficulty; summarise alone (no tasks) does not claim a count."""
    tasks = [Task(task_id=f"task-{i}", env="textcraft-synth", difficulty="nest1", data={"targets": targets})
             for i, targets in enumerate([{"a": 1}, {"a": 1}, {"a": 2}])]
    trees = [_tree(i, [_node("0", None, 0, 1.0, 3)], 1.0) for i in range(3)]
    row = report_from_trees(tasks, trees, mode="recursive").row("recursive", "nest1")
    assert (row.n, row.distinct_problems) == (3, 2)
    assert row.table_row()["distinct_problems"] == 2
    assert summarise(trees, mode="recursive", difficulty="nest1").distinct_problems is None
