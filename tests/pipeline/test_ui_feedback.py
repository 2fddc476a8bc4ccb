"""What the user sees of a running campaign: one artifact-key pattern, progress artifacts in the
Prefect UI, no vLLM server left behind by a cancelled or crashed flow, and the campaign form's name."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("campaign, stage, iteration, key", [
    ("smoke", "validation", 1, "smoke-iter-1-validation"),
    ("smoke", "eval", 0, "smoke-iter-0-eval"),
    ("My_Campaign.v2", "eval", 3, "my-campaign-v2-iter-3-eval"),
    ("__Odd..Name__", "generate progress", 12, "odd-name-iter-12-generate-progress"),
    ("nightly", "comparison", None, "nightly-comparison"),
    ("smoke", "warm_start", "iter-0", "smoke-iter-0-warm-start"),
])
def test_artifact_keys_follow_one_pattern_prefect_accepts(campaign, stage, iteration, key):
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.types.names import raise_on_name_alphanumeric_dashes_only

    from infra.stage_io import artifact_key

    got = artifact_key(campaign, stage, iteration)
    assert got == key
    assert raise_on_name_alphanumeric_dashes_only(got) == got  # Prefect's own rule for artifact keys
    assert ArtifactCreate(key=got, type="markdown", data="x").key == got


def test_artifact_key_refuses_an_empty_name():
    from infra.stage_io import artifact_key

    with pytest.raises(ValueError, match="campaign and a stage"):
        artifact_key("__", "eval", 1)


def test_every_stage_artifact_uses_artifact_key():
    """No artifact key is spelled by hand any more (the three hand-spelled shapes there were): every
    ``create_*_artifact`` call and every ``ProgressArtifact`` gets its key from ``artifact_key``."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    keys, progress = [], []
    for path in [*root.glob("tasks/*.py"), *root.glob("flows/*.py")]:
        text = path.read_text()
        keys += [(path.name, m.group(1)) for m in
                 re.finditer(r"create_\w+_artifact\((?:\s*\w+=[^,]+,)*?\s*key=([^,]+),", text)]
        progress += [(path.name, m.group(1)) for m in re.finditer(r"= ProgressArtifact\(([^,]+),", text)]
    assert len(keys) >= 5 and len(progress) == 5, (keys, progress)  # validation, eval, nightly x2; progress of
    # generate, train, evaluate and the warm start's two phases
    assert all(arg.startswith("artifact_key(") or (name, arg) == ("common.py", "self.key") for name, arg in keys), keys
    assert all(arg.startswith("artifact_key(") for _, arg in progress), progress


class _FakeServer:
    """Stands in for infra.serving.VLLMServer in the flow's process: records stop()."""

    def __init__(self, pid: int) -> None:
        self.pid, self.stopped = pid, 0

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped += 1


def _hook_args(run_id: str, state: str = "Cancelling"):
    from types import SimpleNamespace

    return SimpleNamespace(name="rao-campaign"), SimpleNamespace(id=run_id, name="smoke"), SimpleNamespace(name=state)


def test_cancellation_hook_stops_the_server_held_by_the_flow_process(tmp_path, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    from tasks import serve

    fake = _FakeServer(pid=4242)
    monkeypatch.setattr(serve.POOL, "servers", [fake])
    monkeypatch.setattr(serve.POOL, "served", "iter-1")
    assert serve.stop_flow_servers(*_hook_args("run-a")) == [4242]
    assert fake.stopped == 1 and serve.POOL.servers == [] and serve.POOL.served is None
    assert serve.stop_flow_servers(*_hook_args("run-a")) == []  # a second call finds nothing to stop


def test_hook_in_another_process_stops_the_recorded_server_only(tmp_path, monkeypatch):
    """Prefect runs a cancelled run's hooks in the worker's runner when the flow process is gone: the server
    (here a stand-in process in its own session, as vLLM runs) is found through its record and stopped; a
    server of another flow run, and a record whose pid now names another process, are left alone."""
    import subprocess

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    from flows.campaign import FLOW_END_HOOKS, rao_campaign
    from tasks import serve

    assert serve.stop_flow_servers in rao_campaign.on_cancellation_hooks
    assert serve.stop_flow_servers in rao_campaign.on_crashed_hooks
    assert FLOW_END_HOOKS["on_failure"] and serve.stop_flow_servers not in FLOW_END_HOOKS["on_failure"]
    ours = subprocess.Popen(["sleep", "120"], start_new_session=True)
    other = subprocess.Popen(["sleep", "120"], start_new_session=True)
    reused = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        monkeypatch.setattr(serve.POOL, "servers", [])  # this process holds no server
        assert serve.record_server(ours.pid, base_url="http://x/v1", flow_run_ids=["run-b", "root-1"])
        assert serve.record_server(other.pid, flow_run_ids=["run-c"])
        rec = serve.record_server(reused.pid, flow_run_ids=["run-b"])
        import json

        data = json.loads(rec.read_text())
        rec.write_text(json.dumps({**data, "create_time": data["create_time"] - 100}))  # pid now another process
        assert serve.record_server(ours.pid, flow_run_ids=[]) is None  # outside a flow run: nothing recorded

        assert serve.stop_flow_servers(*_hook_args("run-b", "Crashed")) == [ours.pid]
        from infra.process import pid_alive

        assert not pid_alive(ours.pid)  # stopped (and reaped by kill_group: it is this process's child)
        assert other.poll() is None and reused.poll() is None
        assert sorted(p.name for p in serve.server_records_dir().iterdir()) == [f"{other.pid}.json"]
        assert serve.stop_flow_servers(*_hook_args("root-1")) == []  # already stopped, record gone
    finally:
        for p in (ours, other, reused):
            p.kill()
            p.wait()


def _recording_artifact_api(monkeypatch, fail: bool = False) -> list[tuple[str, dict]]:
    """Record the calls ProgressArtifact makes, each checked against the installed Prefect's own signature."""
    import inspect
    import uuid

    from prefect import artifacts

    calls: list[tuple[str, dict]] = []

    def recorder(name):
        real = inspect.signature(getattr(artifacts, name))

        def call(*args, **kwargs):
            calls.append((name, dict(real.bind(*args, **kwargs).arguments)))  # TypeError if misused
            if fail:
                raise RuntimeError("API down")
            return uuid.UUID(int=1)
        return call

    for name in ("create_progress_artifact", "update_progress_artifact"):
        monkeypatch.setattr(artifacts, name, recorder(name))
    return calls


def test_progress_artifact_is_created_then_updated_at_most_every_interval(monkeypatch):
    from infra.stage_io import ProgressArtifact

    calls = _recording_artifact_api(monkeypatch)
    now = [0.0]
    ui = ProgressArtifact("smoke-iter-1-generate-progress", "rollout trees finished", min_interval_s=5.0,
                          enabled=True, clock=lambda: now[0])
    for t, done in [(0.0, 0), (1.0, 1), (4.9, 2), (5.5, 3), (6.0, 4), (7.0, 8)]:
        now[0] = t
        ui(done, 8)
    assert [(n, a["progress"]) for n, a in calls] == [("create_progress_artifact", 0.0),
                                                      ("update_progress_artifact", 37.5),  # 5.5 s: 3/8
                                                      ("update_progress_artifact", 100.0)]  # the last, always
    assert calls[0][1]["key"] == "smoke-iter-1-generate-progress"
    assert calls[-1][1]["description"] == "rollout trees finished: 8/8" and ui.sent == (8, 8)


def test_a_note_shows_until_the_first_count_and_never_after_it_or_the_finish(monkeypatch):
    """ProgressArtifact.note: the phase before a total is known (the warm start's trainer loading) is written at
    0 %; once a count is written, or the artifact finished, a note changes nothing."""
    from infra.stage_io import ProgressArtifact

    calls = _recording_artifact_api(monkeypatch)
    ui = ProgressArtifact("ws-iter-0-warm-start-sft-progress", "SFT optimizer steps", min_interval_s=0.0, enabled=True)
    ui.note("SFT: training process: loading the model (10 s)")
    ui.note("SFT: training process: model and optimizer ready")
    ui(1, 4)
    ui.note("SFT: training process: still working")  # after a count: not written
    ui.finish("done")
    ui.note("SFT: late")  # after the finish: not written
    assert [(a["progress"], a["description"]) for _, a in calls] == [
        (0.0, "SFT: training process: loading the model (10 s)"),
        (0.0, "SFT: training process: model and optimizer ready"),
        (25.0, "SFT optimizer steps: 1/4"), (100.0, "done")]


def test_a_failing_artifact_api_never_fails_the_stage(monkeypatch, caplog):
    from infra.stage_io import ProgressArtifact

    calls = _recording_artifact_api(monkeypatch, fail=True)
    ui = ProgressArtifact("k", "optimizer steps", enabled=True)
    for d in range(4):
        ui(d, 3)  # no exception
    assert len(calls) == 1 and ui.sent is None and not ui.enabled  # tried once, then left alone
    assert "progress artifact k: RuntimeError: API down" in caplog.text


def test_outside_a_flow_run_no_artifact_is_written(monkeypatch):
    from infra.stage_io import ProgressArtifact

    calls = _recording_artifact_api(monkeypatch)
    ui = ProgressArtifact("k", "trees")
    ui(1, 1)
    assert not ui.enabled and calls == []


def test_in_prefect_run_is_true_inside_a_flow_or_task_run_only(prefect_harness):
    """The one "are we in a run?" check of the pipeline: Prefect's run context, set in a flow run and in a task
    run, and in no direct ``.fn()`` call."""
    from prefect import flow, task

    from infra.stage_io import in_prefect_run

    @task
    def in_task() -> bool:
        return in_prefect_run()

    @flow
    def in_flow() -> tuple[bool, bool]:
        return in_prefect_run(), in_task()

    assert in_prefect_run() is False
    assert in_flow() == (True, True)  # the flow's own code, and a task run inside it
    assert in_task.fn() is False and in_prefect_run() is False  # a direct call; no context left behind


class _MemoryStore:
    """Stands in for the campaign's ArtifactStore (S3): objects in a dict."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def exists(self, key: str) -> bool:
        return key in self.objects

    def get_bytes(self, key: str) -> bytes:
        return self.objects[key]

    def put_bytes(self, data: bytes, key: str) -> dict:
        self.objects[key] = data
        return {"uri": f"mem://{key}"}


def _evaluate_stage(monkeypatch, tmp_path):
    """tasks.stages.evaluate with its evaluation and its store replaced; returns (stages, ctx) for a campaign of
    its own (the Prefect harness is shared by the session)."""
    import uuid

    from rao_core.config import CampaignConfig
    from tasks import stages
    from infra.stage_io import RunContext
    from infra.stage_records import EvalOutput

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    store = _MemoryStore()
    monkeypatch.setattr(RunContext, "store", lambda self: store)
    monkeypatch.setattr(stages, "run_evaluation", lambda ctx, served, tok, it: EvalOutput(
        metrics={"eval/recursive/easy/success": 0.5}, rows=[{"mode": "recursive", "success": 0.5}]))
    ctx = RunContext(config=CampaignConfig(name=f"ui-{uuid.uuid4().hex[:8]}"), s3={}, mlflow_uri="")
    return stages, ctx


def test_a_stage_called_outside_a_run_skips_its_artifact_without_a_prefect_warning(prefect_harness, monkeypatch,
                                                                                   tmp_path):
    """A direct ``.fn()`` call (tests, scripts) is in no Prefect run: the evaluate stage skips its table artifact
    instead of writing it through Prefect's deprecated out-of-run path (a FutureWarning per call)."""
    import warnings

    from prefect.artifacts import Artifact

    from infra.stage_io import artifact_key

    stages, ctx = _evaluate_stage(monkeypatch, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = stages.evaluate.fn(ctx, 1, None, "tok")
    prefect_future = [str(w.message) for w in caught
                      if issubclass(w.category, FutureWarning) and "prefect" in str(w.filename)]
    assert prefect_future == []
    assert out.report_uri == "mem://iter-1/eval/report.json" and not out.resumed  # the stage itself ran
    assert Artifact.get(artifact_key(ctx.name, "eval", 1)) is None


def test_a_stage_inside_a_flow_run_still_writes_its_artifact(prefect_harness, monkeypatch, tmp_path):
    from prefect import flow
    from prefect.artifacts import Artifact

    from infra.stage_io import artifact_key

    stages, ctx = _evaluate_stage(monkeypatch, tmp_path)

    @flow
    def one_stage():
        return stages.evaluate(ctx, 1, None, "tok")

    assert one_stage().metrics == {"eval/recursive/easy/success": 0.5}
    art = Artifact.get(artifact_key(ctx.name, "eval", 1))
    assert art is not None and art.type == "table" and "recursive" in str(art.data)


def test_the_evaluate_stage_reports_trees_over_all_modes(monkeypatch, tmp_path, progress_recorder):
    """run_evaluation (evaluate stage, nightly) turns run_trees' per-mode counts into one progress over both
    modes, under the key artifact_key(campaign, 'evaluate-progress', iteration), and logs a line per unit
    (every unit below 20 trees, else each tenth) with the roots solved so far (a piped log has no bar)."""

    from types import SimpleNamespace

    import rao_core.evaluation
    import rao_core.runtime
    from rao_core.config import CampaignConfig
    from tasks import stages
    from infra.stage_io import RunContext

    made: dict[str, list] = {}
    Recorder = progress_recorder(made)
    seen_kw: list[dict] = []

    def fake_eval(config, *, tasks, progress, **kw):
        seen_kw.append(kw)
        for _mode in config.modes:
            for d in range(1, len(tasks) + 1):
                progress(d, len(tasks), SimpleNamespace(root=SimpleNamespace(verifier=float(d == 1))))
        return rao_core.evaluation.EvalReport()

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    monkeypatch.setattr(stages, "ProgressArtifact", Recorder)
    lines: list[str] = []
    monkeypatch.setattr(stages, "run_logger", lambda: SimpleNamespace(info=lines.append, warning=lines.append))
    monkeypatch.setattr(stages, "validation_tasks", lambda ctx, benchmark=None: ["t1", "t2", "t3"])
    monkeypatch.setattr(stages, "get_env", lambda *a, **k: None)
    monkeypatch.setattr(stages, "_policy", lambda ctx, served: None)
    monkeypatch.setattr(rao_core.runtime, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(rao_core.evaluation, "run_evaluation", fake_eval)
    cfg = CampaignConfig(name="smoke-b")
    cfg.eval.modes = ["recursive", "single"]
    cfg.eval.benchmarks = {}  # the training benchmark alone (a suite's progress: below)
    ctx = RunContext(config=cfg, s3={}, mlflow_uri="")
    out = stages.run_evaluation(ctx, None, "tok", 2)
    assert out.metrics == {} and out.rows == []
    assert [kw["seeded"] for kw in seen_kw] == [True]  # trees seeded from eval.seed; sent as served.seeded says
    assert made == {"smoke-b-iter-2-evaluate-progress": [(0, 6), (1, 6), (2, 6), (3, 6), (4, 6), (5, 6), (6, 6)]}
    assert lines == ["iteration 2 evaluate: 6 trees (3 held-out tasks x modes recursive, single); a line at each "
                     "tenth finished", *(f"evaluation trees {d}/6  solved {1 + (d > 3)}" for d in range(1, 7))]
    # the default suite (four benchmarks; iteration 2 is the last, so all of them): one progress over the suite
    cfg.eval.benchmarks = None
    made.clear()
    lines.clear()
    seen_kw.clear()
    stages.run_evaluation(ctx, None, "tok", 2)
    assert len(seen_kw) == 4 and made["smoke-b-iter-2-evaluate-progress"][-1] == (24, 24)
    assert lines[0] == ("iteration 2 evaluate: 24 trees (textcraft: 3 held-out tasks x modes recursive, single; "
                        "oolong: 3 held-out tasks x modes recursive, single; deepdive: 3 held-out tasks x modes "
                        "recursive, single; arte: 3 held-out tasks x modes recursive, single); a line at each tenth "
                        "finished")


def test_the_campaign_forms_name_is_a_plain_text_field_that_says_it_resumes():
    """The form Prefect renders from rao_campaign's parameters: Name is a string field (no ``str | None`` type
    toggle) whose description says that an existing name is resumed; empty (the UI) or None (``rao run``
    without --name) both mean the config's name."""
    from prefect.utilities.callables import parameter_schema

    from flows.campaign import CampaignParams, rao_campaign

    schema = parameter_schema(rao_campaign.fn).model_dump()
    name = schema["definitions"]["CampaignParams"]["properties"]["name"]
    assert name.get("type") == "string" and "anyOf" not in name, name
    assert "RESUMED" in name["description"] and "new name for a new campaign" in name["description"]
    assert CampaignParams(name="").resolve().name == CampaignParams(name=None).resolve().name == "smoke"
    assert CampaignParams(name="fresh-1").resolve().name == "fresh-1"


def test_warm_start_logs_progress_every_tenth(tmp_path, monkeypatch, progress_recorder):
    """`rao run` piped prints no bar: the warm start (minutes on CPU) logs a line per tenth of its 32
    demonstration trees (every 3, and the last) and per SFT step (fewer than 20: each), with the step's loss.
    The UI sees the same phases as two progress artifacts (the Logs tab was the only sign of life for
    ~20 min), the demonstrations' shown at 0 before the first tree, each fed every unit."""
    from pathlib import Path
    from types import SimpleNamespace

    import rao_core.warmstart
    from rao_core.config import CampaignConfig
    from infra.stage_io import RunContext
    import tasks.warm_start
    from tasks.warm_start import warm_start

    class Store:  # what the stage writes, nowhere
        def exists(self, key):
            return False

        def put_bytes(self, data, key):
            return {"uri": f"s3://mem/{key}"}

        put_file = put_bytes

        def put_checkpoint(self, path, key):
            return f"s3://mem/{key}"

        def uri(self, key):
            return f"s3://mem/{key}"

    def run_warm_start(env, model_path, out_dir, *, on_step, on_demo_progress, on_train_progress, on_status, **kw):
        for done in range(1, 33):
            on_demo_progress(done, 32)
        on_status("training process: model and optimizer ready; first optimizer step running (12 s)")
        for step in (1, 2):
            on_step({"train/loss": 1.0 / step})
            on_train_progress(step, 2)
        on_status("training process: saving checkpoint (40 s)")  # after a count: the artifact keeps the count
        Path(out_dir).mkdir(parents=True)
        return SimpleNamespace(demo_wall_s=1.0, sft_wall_s=2.0, stats={}, train_metrics=[])

    lines: list[str] = []
    monkeypatch.setattr(tasks.warm_start, "run_logger", lambda: SimpleNamespace(info=lines.append))  # the run logger
    made: dict[str, list] = {}
    monkeypatch.setattr(tasks.warm_start, "ProgressArtifact", progress_recorder(made))
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    monkeypatch.setattr(RunContext, "store", lambda self: Store())
    monkeypatch.setattr(rao_core.warmstart, "run_warm_start", run_warm_start)
    ctx = RunContext(config=CampaignConfig(name="ws", warm_start={"mode": "demos", "n_tasks": 32}), s3={},
                     mlflow_uri="")
    assert warm_start.fn(ctx).mode == "demos"
    assert lines == [
        f"warm start: 32 expert demonstration trees, then SFT of {ctx.config.model.path}",
        *(f"warm start: demonstration trees {d}/32" for d in (3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 32)),
        "warm start: training process: model and optimizer ready; first optimizer step running (12 s)",
        "warm start: SFT step 1/2, loss 1.000", "warm start: SFT step 2/2, loss 0.500",
        "warm start: training process: saving checkpoint (40 s)",
        "warm start: SFT done (2 s); uploading demonstrations and the checkpoint to s3://mem/iter-0"]
    assert made == {"ws-iter-0-warm-start-demos-progress": [(0, 32), *((d, 32) for d in range(1, 33))],
                    "ws-iter-0-warm-start-sft-progress": [
                        "SFT: training process: model and optimizer ready; first optimizer step running (12 s)",
                        (1, 2), (2, 2)]}


def test_the_end_of_run_table_has_every_stage_and_sums_to_the_wall_time():
    """One table for the whole `rao run`: make's set-up check, start-up, Prefect's API, every
    stage of the flow (warm start, first vLLM start, base evaluation, iterations, retention, ...) and Prefect's
    end; the rows are consecutive intervals, so their sum is the wall time from make's start to the table."""
    from rao_cli import pipeline_cmd
    from rao_core.progress import Timeline

    clock = iter([1000.0, 1001.5, 1030.0, 1290.25, 1420.0, 1456.5, 1458.0, 1700.0, 1703.0, 1710.0]).__next__
    flow = Timeline(clock=clock)  # the flow's laps, as rao_campaign takes them (epoch seconds)
    for stage in ("config and task-pool check", "S3 storage start, completion check", "warm start",
                  "first vLLM start", "base evaluation (iteration 0)", "register iteration 0", "iteration 1",
                  "retention after iteration 1", "vLLM stop"):
        flow.lap(stage)
    summary = {"campaign": "smoke", "iterations": [], "wall_s": round(flow.total, 1), "timeline": flow.to_dict()}
    tl = pipeline_cmd.run_timeline(summary, process_start=990.0, called_at=995.0, returned_at=1712.5, now=1713.0,
                                   make_started_at=988.0)
    assert [r["stage"] for r in tl.rows] == [
        "make run: set-up check (scripts/setup.sh)", "rao start-up: interpreter, imports, config and completion "
        "checks", "Prefect: local API start, flow run created", "config and task-pool check",
        "S3 storage start, completion check", "warm start", "first vLLM start", "base evaluation (iteration 0)",
        "register iteration 0", "iteration 1", "retention after iteration 1", "vLLM stop", "Prefect: flow run end",
        "end-of-run summary"]
    assert [round(r["s"], 2) for r in tl.rows] == [2.0, 5.0, 5.0, 1.5, 28.5, 260.25, 129.75, 36.5, 1.5, 242.0,
                                                   3.0, 7.0, 2.5, 0.5]
    assert sum(r["s"] for r in tl.rows) == tl.total == 1713.0 - 988.0  # the wall time, exactly
    # without make (rao run on its own) the first row is the start-up; a make mark after the start is ignored
    alone = pipeline_cmd.run_timeline(summary, process_start=990.0, called_at=995.0, returned_at=1712.5,
                                      now=1713.0, make_started_at=991.0)
    assert alone.rows[0]["stage"].startswith("rao start-up") and alone.total == 1713.0 - 990.0

    with pipeline_cmd.console.capture() as cap:
        pipeline_cmd.console.print(pipeline_cmd.wall_time_table(tl.rows, tl.total, "t"))
    text = cap.get()
    assert "first vLLM start" in text and "129.8" in text and "17.9%" in text  # 129.75 / 725 s
    assert "total (wall time)" in text and "725.0" in text and "sum of the 14 rows above" in text


def test_an_iterations_row_names_its_stages_and_what_they_leave_out():
    from flows.campaign import _iteration_detail

    times = {"serve": 0.2, "generate": 86.0, "judge": 1.0, "validate": 2.0, "train": 91.0, "serve_new": 5.0,
             "evaluate": 36.0, "register": 2.0}
    assert _iteration_detail(times, 230.2, False) == ("serve 0 gen 86 judge 1 val 2 train 91 swap 5 eval 36 reg 2 "
                                                      "log+other 7")
    assert _iteration_detail({"generate": 86.0}, 3.0, True) == ("done by an earlier run (resumed from its "
                                                                "markers): generate 86")


def test_the_forms_optional_text_fields_are_plain_text_with_empty_meaning_the_configs():
    """The text fields of the campaign, evaluation and experiment forms are strings (no
    "None" toggle to click before typing); empty, or None from the CLI, means the config's value as before."""
    from prefect.utilities.callables import parameter_schema

    from flows.campaign import CampaignParams, rao_campaign
    from flows.evaluate import EvaluateParams, rao_evaluate
    from research.experiment import ExperimentParams, rao_experiment

    for flow_fn, model, fields in ((rao_campaign, "CampaignParams", ("name", "env", "model_path")),
                                   (rao_evaluate, "EvaluateParams", ("campaign",)),
                                   (rao_experiment, "ExperimentParams", ("name",))):
        props = parameter_schema(flow_fn.fn).model_dump()["definitions"][model]["properties"]
        for f in fields:
            assert props[f].get("type") == "string" and "anyOf" not in props[f] and props[f]["default"] == "", (model, f)
    base = CampaignParams().resolve()
    for p in (CampaignParams(env=None, model_path=None), CampaignParams(env="", model_path="")):
        cfg = p.resolve()
        assert (cfg.tasks.env, cfg.model.path) == (base.tasks.env, base.model.path)
    assert EvaluateParams(campaign=None).campaign == "" and ExperimentParams(name=None).name == ""


def test_the_mlflow_hint_links_the_experiment_in_the_model_training_view():
    """MLflow 3.17's UI opens its GenAI view unless the link or its sidebar switch says otherwise (the
    experiment's kind tag is not read then): the end-of-run line gives the link with workflowType."""
    import sys
    from pathlib import Path

    from rao_cli.pipeline_cmd import mlflow_hint

    lines = mlflow_hint({"mlflow_uri": "sqlite:///m.db", "mlflow_run_id": "r1", "mlflow_experiment_id": "7"})
    mlflow = Path(sys.executable).parent / "mlflow"  # absolute: the command works from any folder
    assert mlflow.is_absolute() and mlflow.exists()
    assert lines.splitlines()[0] == f"MLflow:    {mlflow} ui --backend-store-uri sqlite:///m.db   (run r1)"
    assert "http://127.0.0.1:5000/#/experiments/7?workflowType=machine_learning" in lines.splitlines()[1]
    assert "\n" not in mlflow_hint({"mlflow_uri": "u", "mlflow_run_id": "r"})  # an older stored summary
