"""Pipeline helpers without the heavy services: the nightly's logging, registry promotion, tree metrics."""

from __future__ import annotations

import pytest

from rao_core.metrics import depth_histogram, tree_metrics
from rao_core.tree import EndReason, ExecutionTree, Node


def test_log_evaluation_logs_the_comparison_and_fails_the_run_on_a_regression(tmp_path, monkeypatch):
    """The nightly flow's logging task: metrics and evaluation.json (with both outcome sets) on the run, which
    ends FAILED on a regression (rao_core.regression.decide) and FINISHED otherwise; inside a Prefect run the
    decision (markdown) and two table artifacts (recorded here: outside a flow run Prefect would start a
    temporary API server for them), none outside one."""
    import mlflow
    import prefect.artifacts

    from infra.tracking import configure_mlflow
    from rao_core.regression import decide
    from tasks import tracking
    from infra.stage_io import in_prefect_run
    from tasks.tracking import log_evaluation

    configure_mlflow(f"sqlite:///{tmp_path / 'm.db'}")
    client = mlflow.MlflowClient()
    exp = mlflow.create_experiment("nightly", artifact_location=(tmp_path / "a").as_uri())
    artifacts, notes = [], []
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact", lambda key, **kw: artifacts.append(key))
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact",
                        lambda key, markdown, **kw: (artifacts.append(key), notes.append(markdown)))
    monkeypatch.setattr(tracking, "in_prefect_run", lambda: True)  # as in the nightly flow's run
    m = "eval/recursive/easy/success"
    champ = {f"t{i}": float(i < 30) for i in range(50)}  # 30/50
    for solved, status in ((10, "FAILED"), (30, "FINISHED")):  # 10/50: 20 losses, a drop of 0.4
        cand = {f"t{i}": float(i < solved) for i in range(50)}
        run = client.create_run(exp).info.run_id
        d = decide(m, champ, cand, tolerance=0.05)
        rows, bad = log_evaluation.fn(run, "nightly", "models:/p@candidate", {m: solved / 50}, [], [d],
                                      {"candidate": {m: cand}, "champion": {m: champ}}, "the rule")
        assert bool(bad) == (status == "FAILED") and rows[0]["metric"] == m and rows[0]["n"] == 50
        assert client.get_run(run).info.status == status and client.get_run(run).data.metrics[m] == solved / 50
        assert client.list_artifacts(run)[0].path == "evaluation.json"
        assert mlflow.artifacts.load_dict(f"runs:/{run}/evaluation.json")["outcomes"]["champion"][m] == champ
    assert artifacts == ["nightly-decision", "nightly-comparison", "nightly-results"] * 2
    assert notes[0].startswith("## models:/p@candidate vs champion: REGRESSION: ") and "the rule" in notes[0]
    assert "| metric | n | champion | candidate |" in notes[1] and "no regression" in notes[1]
    monkeypatch.setattr(tracking, "in_prefect_run", in_prefect_run)  # the real check: this test is in no run
    run = client.create_run(exp).info.run_id
    log_evaluation.fn(run, "nightly", "models:/p@candidate", {m: 0.6}, [], [decide(m, champ, champ, tolerance=0.05)],
                      {}, "")
    assert len(artifacts) == 6


def test_promotion_moves_champion_only_when_not_worse(tmp_path, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    from infra.tracking import configure_mlflow
    from tasks import tracking

    configure_mlflow(f"sqlite:///{tmp_path / 'm.db'}")
    import mlflow

    exp = mlflow.create_experiment("t", artifact_location=(tmp_path / "a").as_uri())
    run = mlflow.MlflowClient().create_run(exp).info.run_id
    m = "eval/recursive/easy/success"
    v1 = tracking.register_version("p", "s3://b/c/iter-1/checkpoint", run, {m: 0.5})
    assert tracking.promote("p", v1, 0.5, m) is True  # no champion yet
    v2 = tracking.register_version("p", "s3://b/c/iter-2/checkpoint", run, {m: 0.4})
    assert tracking.promote("p", v2, 0.4, m) is False  # worse: champion stays
    v3 = tracking.register_version("p", "s3://b/c/iter-3/checkpoint", run, {m: 0.5})
    assert tracking.promote("p", v3, 0.5, m) is True  # not worse: champion moves
    c = mlflow.MlflowClient()
    assert str(c.get_model_version_by_alias("p", "champion").version) == str(v3)
    assert str(c.get_model_version_by_alias("p", "candidate").version) == str(v3)
    # an iteration that made no optimizer step (weights = parent's) never moves the champion, even if it
    # scores better by chance
    v4 = tracking.register_version("p", "s3://b/c/iter-4/checkpoint", run, {m: 0.9})
    assert tracking.promote("p", v4, 0.9, m, updated=False) is False
    # worse, but within the evaluation tolerance: a real update moves it; beyond the tolerance it does not
    v5 = tracking.register_version("p", "s3://b/c/iter-5/checkpoint", run, {m: 0.45})
    assert tracking.promote("p", v5, 0.45, m, tolerance=0.1) is True
    v6 = tracking.register_version("p", "s3://b/c/iter-6/checkpoint", run, {m: 0.2})
    assert tracking.promote("p", v6, 0.2, m, tolerance=0.1) is False
    assert str(c.get_model_version_by_alias("p", "champion").version) == str(v5)


def _node(nid, parent, depth, success, reward, children=(), end=EndReason.FINISHED, toks=4, gen=2):
    return Node(node_id=nid, parent_id=parent, depth=depth, goal="g", token_ids=list(range(toks)),
                assistant_mask=[0] * (toks - gen) + [1] * gen, behaviour_logprobs=[0.0] * toks, end_reason=end,
                success=success, reward=reward, children=list(children))


def test_tree_metrics_by_hand():
    # tree a: root (s=1, R=1 + 0.5 * mean(1, 0) = 1.25) with two children (s=1, s=0)
    a = ExecutionTree(tree_id="a", env="e", task_id="t", root_id="0", wall_s=2.0, nodes=[
        _node("0", None, 0, 1.0, 1.25, ["0.0", "0.1"]), _node("0.0", "0", 1, 1.0, 1.0),
        _node("0.1", "0", 1, 0.0, 0.0, end=EndReason.MAX_STEPS)])
    # tree b: a root alone that failed (s=0, R=0)
    b = ExecutionTree(tree_id="b", env="e", task_id="t", root_id="0", wall_s=4.0,
                      nodes=[_node("0", None, 0, 0.0, 0.0)])
    m = tree_metrics([a, b])
    assert m["success/root"] == 0.5  # (1 + 0) / 2
    assert m["reward/depth_0"] == 0.625  # (1.25 + 0) / 2
    assert m["success/depth_1"] == 0.5
    assert m["tree/delegation_rate"] == 0.5 and m["tree/children_per_node"] == 2.0
    assert m["tree/depth_mean"] == 0.5 and m["tree/depth_max"] == 1.0 and m["tree/nodes_mean"] == 2.0
    assert m["end/max_steps"] == pytest.approx(0.25) and m["end/finished"] == pytest.approx(0.75)
    assert m["tokens/completion_total"] == 8.0 and m["tree/wall_s_mean"] == 3.0
    assert depth_histogram([a, b]) == {0: 2, 1: 2}


def test_trees_logged_as_traces_one_span_per_node(tmp_path, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    from infra.tracking import configure_mlflow
    from tasks import tracking

    configure_mlflow(f"sqlite:///{tmp_path / 'm.db'}")
    import mlflow

    exp = mlflow.create_experiment("traces", artifact_location=(tmp_path / "a").as_uri())
    client = mlflow.MlflowClient()
    run = client.create_run(exp).info.run_id
    # root -> (0.0 -> 0.0.0), 0.1 : four nodes, depth 2
    t = ExecutionTree(tree_id="tr1", env="e", task_id="t", root_id="0", nodes=[
        _node("0", None, 0, 1.0, 1.5, ["0.0", "0.1"]), _node("0.0", "0", 1, 1.0, 1.0, ["0.0.0"]),
        _node("0.0.0", "0.0", 2, 1.0, 1.0), _node("0.1", "0", 1, 0.0, 0.0, end=EndReason.MAX_STEPS)])
    single = ExecutionTree(tree_id="tr2", env="e", task_id="t", root_id="0", nodes=[_node("0", None, 0, 0.0, 0.0)])
    assert tracking.log_trees_as_traces(run, exp, [t, single]) == 2
    traces = client.search_traces(locations=[exp], run_id=run, max_results=10, flush=True)
    by_tree = {tr.info.tags.get("rao.tree_id"): tr for tr in traces}
    assert set(by_tree) == {"tr1", "tr2"}
    spans = by_tree["tr1"].data.spans
    assert len(spans) == 4 and len(by_tree["tr2"].data.spans) == 1
    ids = {s.name: s for s in spans}
    parent_of = {s.name: s.parent_id for s in spans}
    grandchild = next(n for n in ids if n.startswith("node 0.0.0"))
    child = next(n for n in ids if n.startswith("node 0.0 "))
    assert parent_of[grandchild] == ids[child].span_id  # nested like the tree
    assert ids[child].attributes["depth"] == 1 and ids[child].attributes["reward"] == 1.0
