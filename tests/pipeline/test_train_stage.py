"""The campaign's train stage in its own process (``trainer.process: subprocess``, rao_core.train.launch).

On the tiny model, without S3 (a fake store) and without Prefect (the stage function itself): the child
trains the same update as the in-process trainer, its per-step metrics and peak RSS come back, and a
failure in it surfaces as one line with the child's own error. Also: the generate stage's serving metrics
(vLLM /metrics read before and after, differenced).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rao_core.samples import Sample, write_samples




class _FakeStore:
    """What the train stage needs of the artifact store: nothing is uploaded."""

    def put_checkpoint(self, path, key):
        return f"s3://fake/{key}"

    def uri(self, key):
        return f"s3://fake/{key}"


def _samples(bad: bool = False) -> list[Sample]:
    out = []
    for i in (0, 1):
        ids = [1, 5, 9, 700 + i, 701, 702 + i]
        if bad and i == 1:
            ids[-1] = 10**6  # outside the vocabulary: the child's validation rejects it
        out.append(Sample(tree_id=f"t{i}", node_id="r", group_id="g", depth=0, token_ids=ids,
                          assistant_mask=[0, 0, 0, 1, 1, 1], behaviour_logprobs=[0, 0, 0, -10.0, -10.0, -10.0],
                          success=float(i), reward=float(i), baseline=1.0 - i, advantage=2.0 * i - 1.0))
    return out


def _run_stage(tmp_path: Path, monkeypatch, tiny: Path, process: str, bad: bool = False):
    from rao_core.config import CampaignConfig
    from rao_core.train import TrainerConfig
    from tasks import stages
    from infra.stage_io import RunContext
    from infra.stage_records import Checkpoint

    monkeypatch.setenv("RAO_HOME", str(tmp_path / f"home-{process}"))
    monkeypatch.setattr(RunContext, "store", lambda self: _FakeStore())
    cfg = CampaignConfig(name="stage", trainer=TrainerConfig(loss_type="reinforce", lr=1e-3, micro_batch_size=1,
                                                             process=process))
    ctx = RunContext(config=cfg, s3={}, mlflow_uri="")
    write_samples(ctx.local("iter-1/samples.jsonl"), _samples(bad))
    parent = Checkpoint(name="iter-0", local=str(tiny))
    return stages.train_policy.fn.__wrapped__(ctx, 1, "s3://fake/iter-1/samples/samples.jsonl", parent)


def test_subprocess_train_stage_matches_inline(tmp_path, monkeypatch, tiny):
    sub = _run_stage(tmp_path, monkeypatch, tiny, "subprocess")
    inline = _run_stage(tmp_path, monkeypatch, tiny, "inline")
    ck = Path(sub.checkpoint.local)
    assert (ck / "model.safetensors").exists() and (ck / "optimizer" / "state.pt").exists()
    man = json.loads((ck / "rao-checkpoint.json").read_text())
    assert man["iteration"] == 1 and man["config"]["process"] == "subprocess"
    # the child's per-step metrics came back and equal the in-process run's (same update)
    assert sub.steps == inline.steps == 1 and len(sub.metrics) == 1
    a, b = sub.last_step, inline.last_step
    assert a["train/tokens"] == 6 and a["train/samples"] == 2
    for k in ("train/loss", "train/pg_loss", "train/kl_mismatch"):
        assert a[k] == pytest.approx(b[k], abs=1e-6), k
    assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-5)
    # the child's own peak RSS: a torch + transformers process holds > 100 MB; inline has none to report
    assert sub.peak_rss_mb > 100 and inline.peak_rss_mb is None
    log = ck.with_name(ck.name + ".train.log").read_text()
    assert '"train/loss"' in log and "checkpoint:" in log


def test_subprocess_failure_reports_the_child_error(tmp_path, monkeypatch, tiny):
    from rao_core.train.launch import TrainingProcessError

    with pytest.raises(TrainingProcessError) as ei:
        _run_stage(tmp_path, monkeypatch, tiny, "subprocess", bad=True)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("training process exited with status 1: ")
    assert "bad training sample" in msg and "out of vocabulary" in msg  # the child's `error:` line
    assert ei.value.returncode == 1 and ei.value.log_path.exists()
    assert not (tmp_path / "home-subprocess/campaigns/stage/checkpoints/iter-1").exists()


def test_launch_command(tmp_path, monkeypatch):
    from rao_core.train.launch import launch_command

    p = tmp_path
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    cmd = launch_command(p / "s", p / "m", p / "o", p / "c.json", p / "m.jsonl", iteration=4)
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"]
    # accelerate launch would set OMP_NUM_THREADS=1 on CPU: the thread count is passed explicitly
    assert cmd[cmd.index("--num_cpu_threads_per_process") + 1] == "3"
    tail = cmd[cmd.index("-m", 3):]
    assert tail[:3] == ["-m", "rao_cli.main", "train"] and tail[tail.index("--iteration") + 1] == "4"
    fsdp = launch_command(p / "s", p / "m", p / "o", p / "c.json", p / "m.jsonl", iteration=0,
                          accelerate_config="configs/accelerate/fsdp.yaml")
    assert "--config_file" in fsdp and "--num_processes" not in fsdp and "--num_cpu_threads_per_process" not in fsdp


def test_generate_stage_reports_serving_metrics(tmp_path, monkeypatch, tiny):
    """The generate stage reads /metrics before and after the rollouts and returns the difference
    (rollouts and /metrics faked: the two recorded snapshots of tests/infra/fixtures)."""
    import asyncio

    import infra.vllm_metrics as vm
    import rao_core.runtime as rt
    from rao_core.config import CampaignConfig
    from tasks import stages
    from infra.stage_io import RunContext
    from infra.stage_records import ServedEndpoint

    fix = Path(__file__).parents[1] / "infra" / "fixtures"
    texts = iter([(fix / "vllm_metrics_before.txt").read_text(), (fix / "vllm_metrics_after.txt").read_text()])
    urls = []

    def fake_scrape(base_url, timeout_s=5.0):
        urls.append(base_url)
        return vm.parse_metrics(next(texts))

    async def no_trees(env, items, policy, config, *, tokenizer, progress=None, seeds=None):
        await asyncio.sleep(0.05)
        return []

    class Store(_FakeStore):
        def put_file(self, path, key):
            return {"uri": f"s3://fake/{key}", "sha256": "0"}

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(RunContext, "store", lambda self: Store())
    monkeypatch.setattr(vm, "scrape", fake_scrape)
    monkeypatch.setattr(rt, "run_trees", no_trees)
    ctx = RunContext(config=CampaignConfig(name="gen"), s3={}, mlflow_uri="")
    served = ServedEndpoint(base_url="http://127.0.0.1:9/v1", model="m")
    out = stages.generate_trees.fn.__wrapped__(ctx, 1, served, str(tiny))
    s = out.serving
    assert urls == [served.base_url] * 2
    assert s["generation_tokens"] == 12000 and s["prefix_cache_hit_rate"] == pytest.approx(0.75)
    assert s["preemptions"] == 5 and s["queue_time_mean_s"] == pytest.approx(0.5)
    assert s["generation_tokens_per_s"] == pytest.approx(12000 / out.generation_s, rel=0.05)


def test_killed_child_is_reported_as_killed_not_as_its_last_metric_line(tmp_path):
    """An OOM-killed child leaves only metric lines: the message must not present one as the error."""
    from rao_core.train.launch import _failure_message

    log = tmp_path / "train.log"
    log.write_text('Loading weights: 100%\n{"train/step": 1.0, "train/loss": 0.66}\n')
    msg, _ = _failure_message(1, log)
    assert "killed from outside" in msg and "out of memory" in msg
    assert not msg.split(": ", 1)[1].startswith("{")
    log.write_text('{"train/step": 1.0}\nTraceback (most recent call last):\nValueError: boom\n')
    msg, _ = _failure_message(1, log)
    assert "ValueError: boom" in msg and "killed from outside" not in msg


def test_the_training_child_reports_its_phases_and_a_line_when_it_is_silent(tmp_path, monkeypatch):
    """No silent minute while the trainer loads: each phase the child writes becomes a line,
    and a child that writes nothing for ``heartbeat_s`` gets a "still ..." line naming its last phase. The child
    is a small script standing in for ``rao train`` (same protocol: JSON lines in the metrics file)."""
    import sys
    import textwrap

    from rao_core.train import TrainerConfig
    from rao_core.train import launch

    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent('''
        import json, pathlib, sys, time
        out, metrics = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
        def rec(obj):
            with metrics.open("a") as f:
                f.write(json.dumps(obj) + "\\n")
        time.sleep(0.8)                               # the imports: nothing written yet
        rec({"phase": "started, 2 samples read"})
        rec({"phase": "model and optimizer ready; first optimizer step running"})
        time.sleep(0.8)                               # one long step
        rec({"step": {"train/loss": 1.0}})
        rec({"progress": {"done": 1, "total": 1}})
        rec({"phase": "saving checkpoint"})
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_text("")
        rec({"end": {"peak_rss_mb": 1.0}})
    '''))
    monkeypatch.setattr(launch, "launch_command", lambda samples, model, out, cfg, metrics, **kw:
                        [sys.executable, str(child), str(out), str(metrics)])
    monkeypatch.setattr(launch, "is_checkpoint", lambda path: (Path(path) / "config.json").exists())
    lines: list[str] = []
    res = launch.train_in_subprocess(tmp_path / "s.jsonl", tmp_path, tmp_path / "out", TrainerConfig(),
                                     on_status=lines.append, heartbeat_s=0.5, poll_s=0.05, show_progress=False)
    assert res.metrics == [{"train/loss": 1.0}]
    text = [line.rsplit(" (", 1)[0] for line in lines]  # without the seconds
    assert text[0].startswith("training process: started (pid ") and text[0].endswith(".train.log")
    assert text[1] == "training process: still working: starting (interpreter, torch and accelerate imports)"
    i = text.index("training process: started, 2 samples read")
    assert text[i + 1] == "training process: model and optimizer ready; first optimizer step running"
    assert "training process: still working: model and optimizer ready; first optimizer step running" in text[i + 2:]
    assert text[-1] == "training process: saving checkpoint"
    assert all(line.endswith(" s)") for line in lines)


def test_an_iteration_without_update_says_so_in_its_train_progress_artifact(tmp_path, monkeypatch, progress_recorder):
    """Every advantage 0 -> no optimizer step; the train-progress artifact still appears,
    complete, saying "no update" (it used to be missing, as if the stage had not run)."""
    from tasks import stages

    made: dict[str, list] = {}
    Recorder = progress_recorder(made)
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "config.json").write_text("{}")
    monkeypatch.setattr(stages, "ProgressArtifact", Recorder)
    monkeypatch.setattr(stages, "checkpoint_local", lambda ctx, ckpt: parent)
    zero = [s.model_copy(update={"advantage": 0.0}) for s in _samples()]
    out = _run_zero_stage(tmp_path, monkeypatch, zero)
    assert out.steps == 0 and (Path(out.checkpoint.local) / "config.json").exists()
    assert made == {"stage-iter-1-train-progress": [
        "no update: every advantage of the 2 samples is 0 (no group carried signal), 0 optimizer steps; the "
        "parent's weights were copied as this iteration's checkpoint"]}


def _run_zero_stage(tmp_path: Path, monkeypatch, samples):
    from rao_core.config import CampaignConfig
    from tasks import stages
    from infra.stage_io import RunContext
    from infra.stage_records import Checkpoint

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(RunContext, "store", lambda self: _FakeStore())
    ctx = RunContext(config=CampaignConfig(name="stage"), s3={}, mlflow_uri="")
    write_samples(ctx.local("iter-1/samples.jsonl"), samples)
    return stages.train_policy.fn.__wrapped__(ctx, 1, "s3://fake/iter-1/samples/samples.jsonl",
                                              Checkpoint(name="iter-0", local=str(tmp_path / "parent")))


def test_the_train_stage_logs_its_optimizer_steps_with_the_loss(tmp_path, monkeypatch, progress_recorder):
    """A piped `rao run` draws no bar: an RL iteration's train stage logs a line per tenth of its optimizer steps
    (fewer than 20: each) with that step's loss, as the warm start's SFT does, and feeds every step to its
    train-progress artifact (the newcomer saw minutes without a line between an iteration's samples and its
    checkpoint)."""
    from types import SimpleNamespace

    import rao_core.train.launch
    from tasks import stages

    made: dict[str, list] = {}
    Recorder = progress_recorder(made)

    def run_training(batch, model, out_dir, cfg, *, on_step, on_progress, **kw):
        for step in (1, 2, 3):
            on_step({"train/loss": 0.5 / step})
            on_progress(step, 3)
        Path(out_dir).mkdir(parents=True)
        return SimpleNamespace(peak_rss_mb=None)

    lines: list[str] = []
    logger = SimpleNamespace(info=lines.append, warning=lines.append)
    parent = tmp_path / "parent"
    parent.mkdir()
    monkeypatch.setattr(stages, "ProgressArtifact", Recorder)
    monkeypatch.setattr(stages, "run_logger", lambda: logger)
    monkeypatch.setattr(stages, "checkpoint_local", lambda ctx, ckpt: parent)
    monkeypatch.setattr(rao_core.train.launch, "run_training", run_training)
    out = _run_zero_stage(tmp_path, monkeypatch, _samples())
    assert out.steps == 3
    assert [ln for ln in lines if "optimizer step" in ln] == [
        "iteration 1 train: update 1 optimizer step per batch",  # the update budget, said before the steps
        "iteration 1 train: optimizer step 1/3, loss 0.5000", "iteration 1 train: optimizer step 2/3, loss 0.2500",
        "iteration 1 train: optimizer step 3/3, loss 0.1667"]
    assert made == {"stage-iter-1-train-progress": [(1, 3), (2, 3), (3, 3)]}
