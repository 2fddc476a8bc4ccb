"""Execution trees as MLflow traces, read back from a real SQLite tracking store.

A trace is ERROR only for an infrastructure failure (the trees judging leaves unscored); a wrong answer
or a step limit is OK with its end reason and verifier value; every turn is a span under its node's span,
with token usage that MLflow sums into the trace's tokens column; the experiment opens in MLflow's
model-training view.
"""

from __future__ import annotations

import pytest

from rao_core.tree import CellStatus, EndReason, ExecutionTree, Node, Turn


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture
def client(store, monkeypatch):
    """An MlflowClient on one SQLite file shared by this module's tests (its schema is built once)."""
    monkeypatch.setenv("RAO_HOME", str(store))
    from infra.tracking import configure_mlflow

    configure_mlflow(f"sqlite:///{store / 'm.db'}")
    import mlflow

    return mlflow.MlflowClient()


def _turn(prompt: int, completion: int, code: str, output: str) -> Turn:
    return Turn(prompt_token_ids=list(range(prompt)), completion_token_ids=list(range(completion)),
                completion_logprobs=[0.0] * completion, text=f"```python\n{code}\n```", code=code,
                observation=output, cell_status=CellStatus.OK, generation_s=0.5, execution_s=0.25)


def _node(nid: str, parent: str | None, end: EndReason, turns=(), children=(), verifier=None, error=None) -> Node:
    return Node(node_id=nid, parent_id=parent, depth=nid.count("."), goal=f"goal of {nid}", turns=list(turns),
                children=list(children), end_reason=end, verifier=verifier, error=error,
                result="42" if end == EndReason.FINISHED else None)


def _tree(tree_id: str, nodes: list[Node]) -> ExecutionTree:
    return ExecutionTree(tree_id=tree_id, env="e", task_id=f"task-{tree_id}", root_id="0", nodes=nodes)


def _log(client, name: str, trees: list[ExecutionTree]) -> dict:
    from infra.tracking import ensure_experiment, log_trees_as_traces

    exp = ensure_experiment(name)
    run = client.create_run(exp).info.run_id
    assert log_trees_as_traces(run, exp, trees) == len(trees)
    traces = client.search_traces(locations=[exp], run_id=run, max_results=50, flush=True)
    return {t.info.tags["rao.tree_id"]: t for t in traces}


def test_only_infrastructure_failures_are_errors(client):
    from mlflow.entities import SpanStatusCode

    wrong = _tree("wrong", [  # the root answered wrongly (verifier 0); its child ran out of context
        _node("0", None, EndReason.FINISHED, children=["0.0"], verifier=0.0),
        _node("0.0", "0", EndReason.CONTEXT_OVERFLOW, error="next prompt exceeds 4096 tokens")])
    steps = _tree("steps", [_node("0", None, EndReason.MAX_STEPS, verifier=0.0)])
    broken = _tree("broken", [_node("0", None, EndReason.POLICY_ERROR, error="policy did not answer within 60 s")])
    sandbox = _tree("sandbox", [  # the root finished; its child's REPL died
        _node("0", None, EndReason.FINISHED, children=["0.0"], verifier=1.0),
        _node("0.0", "0", EndReason.SANDBOX_ERROR, error="REPL process died")])
    by_tree = _log(client, "statuses", [wrong, steps, broken, sandbox])
    state = {k: str(t.info.state) for k, t in by_tree.items()}
    assert state == {"wrong": "OK", "steps": "OK", "broken": "ERROR", "sandbox": "OK"}

    spans = {s.name: s for s in by_tree["wrong"].data.spans}
    root, child = spans["tree wrong"], spans["node 0.0 (depth 1)"]
    assert root.outputs == {"result": "42", "end_reason": "finished", "verifier": 0.0}
    assert root.attributes["verifier"] == 0.0 and root.attributes["end_reason"] == "finished"
    assert child.status.status_code == SpanStatusCode.OK and child.outputs["end_reason"] == "context_overflow"
    assert by_tree["steps"].data.spans[0].outputs["end_reason"] == "max_steps"

    failed = by_tree["broken"].data.spans[0]
    assert failed.status.status_code == SpanStatusCode.ERROR
    assert failed.status.description == "policy_error: policy did not answer within 60 s"
    sandbox_child = next(s for s in by_tree["sandbox"].data.spans if s.name.startswith("node 0.0"))
    assert sandbox_child.status.status_code == SpanStatusCode.ERROR  # the span says where it failed


def test_one_span_per_turn_under_its_node_with_token_usage(client):
    # root: 2 turns (prompts 10 and 20 tokens, completions 3 and 4), delegates to 0.0 (1 turn: 5 + 2),
    # which delegates to 0.0.0 (no turn: it failed before its first generation)
    tree = _tree("turns", [
        _node("0", None, EndReason.FINISHED, turns=[_turn(10, 3, "x = 1", ""), _turn(20, 4, "print(x)", "1")],
              children=["0.0"], verifier=1.0),
        _node("0.0", "0", EndReason.FINISHED, turns=[_turn(5, 2, "finish(2)", "")], children=["0.0.0"]),
        _node("0.0.0", "0.0", EndReason.MAX_STEPS)])
    trace = _log(client, "turns", [tree])["turns"]
    spans = {s.name: s for s in trace.data.spans}
    by_id = {s.span_id: s for s in trace.data.spans}
    root, child, grandchild = spans["tree turns"], spans["node 0.0 (depth 1)"], spans["node 0.0.0 (depth 2)"]
    turns = [s for s in trace.data.spans if s.name.startswith("turn ")]
    assert len(turns) == 3 == sum(len(n.turns) for n in tree.nodes)
    assert sorted(by_id[s.parent_id].name for s in turns) == ["node 0.0 (depth 1)", "tree turns", "tree turns"]
    assert child.parent_id == root.span_id and grandchild.parent_id == child.span_id  # nested like the tree

    second = next(s for s in turns if s.parent_id == root.span_id and s.attributes["turn"] == 1)
    # fenced: MLflow renders span strings as markdown (a bare cell was one run-on line, a comment a heading)
    assert second.inputs == {"code": "```python\nprint(x)\n```"} and second.outputs == {"output": "```text\n1\n```"}
    first = next(s for s in turns if s.parent_id == root.span_id and s.attributes["turn"] == 0)
    assert first.outputs == {"output": ""}  # nothing printed: nothing to fence
    assert second.attributes["mlflow.chat.tokenUsage"] == {"input_tokens": 20, "output_tokens": 4,
                                                           "total_tokens": 24}
    assert second.span_type == "LLM" and second.attributes["cell_status"] == "ok"
    # the trace's tokens column: the sum over turns, (10 + 20 + 5) in and (3 + 4 + 2) out
    assert trace.info.token_usage == {"input_tokens": 35, "output_tokens": 9, "total_tokens": 44}


def test_experiment_opens_in_the_model_training_view(client):
    from infra.tracking import EXPERIMENT_KIND_TAG, ensure_experiment

    kind = lambda exp_id: client.get_experiment(exp_id).tags.get(EXPERIMENT_KIND_TAG)  # noqa: E731
    assert kind(ensure_experiment("kind-new")) == "custom_model_development"
    # made before this tag existed, or tagged by the UI's own guess from the traces: re-tagged
    old = client.create_experiment("kind-old")
    guessed = client.create_experiment("kind-guessed", tags={EXPERIMENT_KIND_TAG: "genai_development_inferred"})
    chosen = client.create_experiment("kind-chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    assert [ensure_experiment(n) for n in ("kind-old", "kind-guessed", "kind-chosen")] == [old, guessed, chosen]
    assert kind(old) == kind(guessed) == "custom_model_development"
    assert kind(chosen) == "genai_development"  # a person's choice stays


def test_a_cell_is_a_fenced_code_block_that_its_own_backticks_cannot_close():
    """A cell with `# comment` lines and a markdown string inside stays one code block."""
    from infra.tracking import _fenced

    cell = "# count the planks\nx = '```'\n    print(x)"
    assert _fenced(cell, "python") == "````python\n" + cell + "\n````"
    assert _fenced("print(1)", "python") == "```python\nprint(1)\n```"
    assert _fenced(None, "text") is None and _fenced("", "text") == ""
