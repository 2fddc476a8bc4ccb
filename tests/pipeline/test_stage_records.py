"""Resumable stages (``infra.stage_io.stage``) and their typed records (``infra.stage_records``): a stage runs once,
stores its record as the completion marker, and returns the stored record afterwards; markers written
before the records existed (plain dicts with ``_stage_s``) still resume. No S3: an in-memory store."""

from __future__ import annotations

import json

import pytest

from rao_core.config import CampaignConfig
from infra.stage_io import RunContext, stage
from infra.stage_records import Checkpoint, GenerateOutput, JudgeOutput, ServedEndpoint, TrainOutput


class _MemoryStore:
    """What a stage needs of the artifact store, in memory."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}

    def exists(self, key):
        return key in self.objects

    def get_bytes(self, key):
        return self.objects[key]

    def put_bytes(self, data, key):
        self.objects[key] = data
        return {"uri": f"s3://mem/{key}"}


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    store = _MemoryStore()
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    monkeypatch.setattr(RunContext, "store", lambda self: store)
    return RunContext(config=CampaignConfig(name="records"), s3={}, mlflow_uri="")


CALLS: list[int] = []


@stage("demo", name="demo-stage")
def demo(ctx: RunContext, iteration: int, x: int) -> JudgeOutput:
    """A stage that records its calls."""
    CALLS.append(x)
    return JudgeOutput(scored_uri=f"s3://mem/{x}", judge={"nan": float("nan")})


def test_a_stage_runs_once_then_returns_its_stored_record(ctx):
    CALLS.clear()
    first = demo.fn(ctx, 1, 7)
    assert CALLS == [7] and not first.resumed and first.stage_s is not None
    marker = json.loads(ctx.store().get_bytes("iter-1/_done/demo.json"))  # the keys of the old markers
    assert marker["scored_uri"] == "s3://mem/7" and "_stage_s" in marker and "_resumed" not in marker
    assert marker["judge"]["nan"] != marker["judge"]["nan"]  # NaN stays NaN (json.dumps wrote NaN before)
    again = demo.fn(ctx, 1, 8)
    assert CALLS == [7] and again.resumed and again.scored_uri == "s3://mem/7"
    assert again.stage_s == first.stage_s
    assert demo.fn.__wrapped__(ctx, 1, 9).scored_uri == "s3://mem/9"  # the body alone: no marker read
    assert demo.name == "demo-stage"


def test_markers_written_before_the_records_still_resume(ctx):
    """Markers exactly as the dict-returning stages wrote them: each stage returns them typed, unrun."""
    from tasks.stages import generate_trees, judge_trees, train_policy
    from tasks.warm_start import warm_start

    store = ctx.store()
    ckpt = {"name": "iter-1", "uri": "s3://rao/records/iter-1/checkpoint", "local": "/x/checkpoints/iter-1"}
    old = {
        "iter-1/_done/generate.json": {"trees_uri": "s3://rao/records/iter-1/trees/trees.jsonl", "sha256": "ab",
                                       "num_trees": 4, "crashed": 1, "generation_s": 2.5,
                                       "serving": {"generation_tokens": 12.0}, "_stage_s": 3.25},
        "iter-1/_done/judge.json": {"scored_uri": "s3://u", "judge": {}},  # no timing (tests wrote such)
        "iter-1/_done/train.json": {"checkpoint": ckpt, "steps": 2, "train_s": 1.5, "last_step": {"train/loss": 0.5},
                                    "metrics": [{"train/loss": 0.7}, {"train/loss": 0.5}], "peak_rss_mb": None,
                                    "_stage_s": 1.75},
        "iter-0/_done/warm_start.json": {"checkpoint": {**ckpt, "name": "iter-0"}, "mode": "demos",
                                         "demos_uri": "s3://d", "stats": {"trees": 3}, "demo_s": 1.0, "sft_s": 2.0,
                                         "sft_steps": 3, "_stage_s": 3.5},
    }
    for key, value in old.items():
        store.put_bytes(json.dumps(value).encode(), key)
    gen = generate_trees.fn(ctx, 1, ServedEndpoint(), "")
    assert isinstance(gen, GenerateOutput) and gen.resumed and gen.stage_s == 3.25
    assert (gen.trees_uri, gen.num_trees, gen.crashed, gen.serving) == (old["iter-1/_done/generate.json"]["trees_uri"],
                                                                        4, 1, {"generation_tokens": 12.0})
    judged = judge_trees.fn(ctx, 1, gen.trees_uri)
    assert judged.resumed and judged.stage_s is None and judged.scored_uri == "s3://u"
    tr = train_policy.fn(ctx, 1, "s3://samples", Checkpoint(name="iter-0"))
    assert isinstance(tr, TrainOutput) and tr.checkpoint == Checkpoint(**ckpt) and tr.steps == 2
    assert tr.last_step == {"train/loss": 0.5} and tr.stage_s == 1.75
    ws = warm_start.fn(ctx)  # iteration defaults to "iter-0"
    assert ws.resumed and ws.mode == "demos" and ws.checkpoint.name == "iter-0" and ws.sft_steps == 3


@stage("demo_next", name="demo-next-stage")
def demo_next(ctx: RunContext, iteration: int, judged: JudgeOutput, parent: Checkpoint) -> TrainOutput:
    """A stage taking another stage's record and a checkpoint."""
    return TrainOutput(checkpoint=parent.model_copy(update={"uri": judged.scored_uri}), steps=1)


@pytest.mark.services
def test_stages_pass_records_inside_a_flow_run(ctx, prefect_harness):
    """Under a real Prefect flow run: records go from task to task as they are; a second run resumes both."""
    from prefect import flow

    @flow(name="records-chain")
    def chain(ctx: RunContext) -> TrainOutput:
        return demo_next(ctx, 2, demo(ctx, 2, 5), Checkpoint(name="c"))

    CALLS.clear()
    out = chain(ctx)
    assert isinstance(out, TrainOutput) and not out.resumed and CALLS == [5]
    assert out.checkpoint == Checkpoint(name="c", uri="s3://mem/5") and out.steps == 1
    again = chain(ctx)
    assert again.resumed and again.checkpoint == out.checkpoint and CALLS == [5]


@pytest.mark.services
def test_log_iteration_logs_the_iterations_metrics_and_plots(ctx, tmp_path):
    """The tracking task that replaced the flow body's metric code: tree, judge, sample, training,
    evaluation, timing and serving metrics on the iteration run and the campaign run, per-step training
    metrics, the depth histogram and the learning curve."""
    import mlflow

    from infra.tracking import configure_mlflow, ensure_experiment
    from rao_core.tree import EndReason, ExecutionTree, Node, write_trees
    from infra.stage_records import EvalOutput, ValidateOutput
    from tasks.tracking import log_iteration

    configure_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    exp = ensure_experiment("log-iteration")
    campaign_run, it_run = (client.create_run(exp).info.run_id for _ in range(2))
    ctx = ctx.model_copy(update={"campaign_run_id": campaign_run, "mlflow_experiment_id": exp})
    ctx.config.tracking.log_traces = False

    def tree(i: int, s: float) -> ExecutionTree:
        root = Node(node_id="n0", goal="g", token_ids=[1, 2], assistant_mask=[0, 1], behaviour_logprobs=[0, -1],
                    end_reason=EndReason.FINISHED, success=s, reward=s)
        return ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id="a", group_id="a", rollout_index=i,
                             root_id="n0", nodes=[root])

    write_trees(ctx.local("iter-1/scored.jsonl"), [tree(0, 1.0), tree(1, 0.0)])  # the cached copy is read
    gen = GenerateOutput(trees_uri="s3://unused", generation_s=2.0, serving={"preemptions": 3.0})
    judged = JudgeOutput(scored_uri="s3://unused", judge={"fail_rate": 0.25, "model": "m"})
    val = ValidateOutput(samples_uri="s3://unused", sample_stats={"num_samples": 2, "by_depth": {}})
    tr = TrainOutput(checkpoint=Checkpoint(name="iter-1"), steps=2, last_step={"train/loss": 0.5},
                     metrics=[{"train/loss": 0.7}, {"train/loss": 0.5}], peak_rss_mb=300.0)
    ev = EvalOutput(metrics={"eval/recursive/easy/success": 0.5})
    out = log_iteration.fn(ctx, 1, it_run, gen, judged, val, tr, ev, {"generate": 4.0, "train": 1.0})
    m = out.metrics
    assert out.times == {"generate": 4.0, "train": 1.0} and not out.resumed
    assert m["success/root"] == 0.5 and m["judge/fail_rate"] == 0.25 and "judge/model" not in m
    assert m["samples/num_samples"] == 2 and m["train/loss"] == 0.5 and m["eval/recursive/easy/success"] == 0.5
    assert (m["time/generate_s"], m["time/generation_model_s"], m["time/train_peak_rss_mb"]) == (4.0, 2.0, 300.0)
    assert m["serving/preemptions"] == 3.0
    logged = client.get_run(it_run).data.metrics
    assert logged["success/root"] == 0.5 and client.get_run(campaign_run).data.metrics["time/train_s"] == 1.0
    history = sorted((x.step, x.value) for x in client.get_metric_history(it_run, "train_step/loss"))
    assert history == [(0, 0.7), (1, 0.5)]  # one point per optimizer step, in its own series
    assert [(x.step, x.value) for x in client.get_metric_history(it_run, "train/loss")] == [(1, 0.5)]  # iteration 1
    assert {a.path for a in client.list_artifacts(it_run, "plots")} == {"plots/depth_histogram.png"}
    assert {a.path for a in client.list_artifacts(campaign_run, "plots")} == {"plots/learning_curve.png"}
    # a second call (a resumed campaign) reads the marker: no MLflow point is added
    points = {r: sum(len(client.get_metric_history(r, k)) for k in client.get_run(r).data.metrics)
              for r in (it_run, campaign_run)}
    again = log_iteration.fn(ctx, 1, it_run, gen, judged, val, tr, ev, {"generate": 9.0})
    assert again.resumed and again.metrics == m and again.times == out.times
    assert points == {r: sum(len(client.get_metric_history(r, k)) for k in client.get_run(r).data.metrics)
                      for r in (it_run, campaign_run)}


@pytest.mark.services
def test_log_metrics_logs_each_metric_and_step_once(tmp_path):
    """``tracking.log_metrics`` drops what the run already has at that step: a re-run logs nothing new, a
    new step or a new key is logged, NaN is skipped."""
    import mlflow

    from infra.tracking import configure_mlflow, ensure_experiment
    from tasks.tracking import log_metrics

    configure_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    run = client.create_run(ensure_experiment("once")).info.run_id
    assert log_metrics(run, {"a": 1.0, "b": 2.0, "c": float("nan")}, step=1) == 2
    assert log_metrics(run, {"a": 5.0, "b": 6.0}, step=1) == 0  # the same (metric, step): kept as first logged
    assert log_metrics(run, {"a": 3.0, "d": 4.0}, step=2) == 2
    assert sorted((m.step, m.value) for m in client.get_metric_history(run, "a")) == [(1, 1.0), (2, 3.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(run, "b")] == [(1, 2.0)]
