"""Run :func:`rao_core.train.train` in its own process, through ``accelerate launch``.

:func:`train_in_subprocess` writes the trainer config to JSON and runs ``accelerate launch ... -m rao_cli.main
train`` (:func:`launch_command`), the same command that runs FSDP on GPUs (``--config_file
configs/accelerate/fsdp.yaml``). When the child exits all its memory returns to the OS, so the flow process does
not keep the trainer's peak before vLLM serves the next checkpoint. The child reports steps, progress, phases and
its peak RSS as JSON lines read back while it runs; a failure raises :class:`TrainingProcessError` with the
child's own ``error: ...`` line. :func:`run_training` chooses between this and training in-process.

One trainer per checkpoint folder: the child's pid and start time are recorded next to the folder
(``<out>.train-io/trainer.pid.json``) while it runs, and a launch that finds a recorded trainer still running
(left by a run that was killed, its parent gone) stops its process group first (:func:`stop_stale_trainer`).
Docs: docs/pipeline.md#one-iteration, docs/pipeline/resume-and-faults.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rao_core.paths import REPO_ROOT
from rao_core.process_group import kill_group, process_record, read_record, same_process, write_record
from rao_core.progress import StepProgress
from rao_core.samples import SampleBatch
from rao_core.train.checkpoint import is_checkpoint
from rao_core.train.config import TrainerConfig

__all__ = ["SubprocessTrainResult", "TrainingProcessError", "TrainingRun", "launch_command", "run_training",
           "stop_stale_trainer", "train_in_subprocess", "trainer_record_path"]

STDERR_TAIL_LINES = 8
#: Seconds of SIGTERM a stopped trainer's process group gets before SIGKILL.
STOP_GRACE_S = 30.0


def trainer_record_path(out_dir: str | os.PathLike[str]) -> Path:
    """Where the running trainer of checkpoint folder ``out_dir`` is recorded: ``<out>.train-io/trainer.pid.json``
    (:func:`rao_core.process_group.process_record` of the ``accelerate launch`` process, which leads the trainer's
    process group, plus ``out``)."""
    out = Path(out_dir).resolve()
    return out.with_name(out.name + ".train-io") / "trainer.pid.json"


def stop_stale_trainer(out_dir: str | os.PathLike[str], say: Callable[[str], None] | None = None,
                       timeout_s: float = STOP_GRACE_S) -> int | None:
    """Stop the trainer recorded for ``out_dir`` (:func:`trainer_record_path`) if that very process still runs
    (same pid and start time): its whole process group, SIGTERM then SIGKILL after ``timeout_s`` seconds, with one
    line to ``say`` naming it. A stale record (the process gone, the pid reused) is dropped. Returns the pid
    stopped, or None."""
    path = trainer_record_path(out_dir)
    rec = read_record(path)
    if rec is None:
        return None
    pid = int(rec["pid"]) if same_process(rec) else None
    if pid is not None:
        if say is not None:
            say(f"a training process left by an earlier run (pid {pid}) still writes {rec.get('out', out_dir)}: "
                "stopping its process group before this one starts")
        kill_group(pid, timeout_s=timeout_s)
    path.unlink(missing_ok=True)
    return pid


class TrainingProcessError(RuntimeError):
    """The training child process failed; the message is one line with its error and last stderr lines."""

    def __init__(self, message: str, *, returncode: int, log_path: Path, tail: list[str]):
        super().__init__(message)
        self.returncode = returncode
        self.log_path = log_path
        self.tail = tail


@dataclass
class SubprocessTrainResult:
    """What a training child produced: checkpoint folder, per-step metrics, its peak RSS and wall time."""

    checkpoint: Path
    metrics: list[dict[str, float]] = field(default_factory=list)
    peak_rss_mb: float | None = None  # the child's own max RSS (MiB); None if it did not report it
    wall_s: float = 0.0  # launch to exit, seconds (process start and imports included)
    log_path: Path | None = None


def _cpu_threads() -> int:
    """Torch threads the child should use: ``OMP_NUM_THREADS`` if set, else the CPUs this process may use."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def launch_command(samples: Path, model_path: Path, out_dir: Path, config_path: Path, metrics_path: Path, *,
                   iteration: int, accelerate_config: str | os.PathLike[str] | None = None,
                   max_staleness: int = 0, cpus: Sequence[int] = ()) -> list[str]:
    """The ``accelerate launch ... rao train ...`` argv; with ``cpus`` (``trainer.cpus``) behind ``taskset -c``
    with one torch thread per core::

        python -m accelerate.commands.launch [--config_file F | --num_processes 1 ...] --quiet \\
            -m rao_cli.main train --samples S --model M --out O --config C --iteration I --metrics-out J

    Without ``accelerate_config``, ``--num_cpu_threads_per_process`` is set to the CPUs this process may use:
    ``accelerate launch`` would otherwise set ``OMP_NUM_THREADS=1`` on most CPU machines, and the child would
    train on one core where the in-process trainer uses all of them."""
    cmd = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    cmd += [sys.executable, "-m", "accelerate.commands.launch"]
    if accelerate_config is not None:
        cmd += ["--config_file", str(accelerate_config)]
    else:
        cmd += ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--num_cpu_threads_per_process", str(len(cpus) if cpus else _cpu_threads())]
    cmd += ["--quiet", "-m", "rao_cli.main", "train", "--samples", str(samples), "--model", str(model_path),
            "--out", str(out_dir), "--config", str(config_path), "--iteration", str(iteration),
            "--metrics-out", str(metrics_path)]
    if max_staleness:
        cmd += ["--max-staleness", str(max_staleness)]
    return cmd


def resolve_accelerate_config(path: str | os.PathLike[str] | None) -> Path | None:
    """An accelerate config file as an absolute path: a relative one is looked up in the current folder,
    then in the repository (``configs/accelerate/fsdp.yaml`` works from anywhere).

    Raises:
        FileNotFoundError: the file exists in neither place.
    """
    if not path:
        return None
    p = Path(path)
    for cand in ([p] if p.is_absolute() else [p, REPO_ROOT / p]):
        if cand.is_file():
            return cand.resolve()
    raise FileNotFoundError(f"accelerate config not found: {path} (looked in {Path.cwd()} and {REPO_ROOT})")


def _read_new(path: Path, pos: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines of ``path`` from byte ``pos``; returns them and the new position."""
    if not path.exists():
        return [], pos
    with path.open("rb") as f:
        f.seek(pos)
        data = f.read()
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    return [json.loads(x) for x in data[:end].splitlines() if x.strip()], pos + end


def _failure_message(rc: int, log_path: Path) -> tuple[str, list[str]]:
    lines = [x.rstrip() for x in log_path.read_text(errors="replace").splitlines() if x.strip()] \
        if log_path.exists() else []
    tail = lines[-STDERR_TAIL_LINES:]
    errors = [x for x in lines if x.startswith("error: ")]
    if errors:
        head, rest = errors[-1].removeprefix("error: "), [x for x in tail if x != errors[-1]]
    elif not any(x.startswith("Traceback") for x in lines):
        # No error line and no traceback: the child was killed from outside, usually by the kernel's
        # out-of-memory killer (accelerate launch then exits 1 without a word).
        head = ("the child printed no error: it was killed from outside, most likely out of memory "
                "(see `dmesg`; lower trainer.micro_batch_tokens or free memory held by other processes)")
        rest = tail[-2:]
    else:  # a traceback: its last line that is not a metric line is the exception
        head, rest = [x for x in lines if not x.startswith("{")][-1], tail[:-1]
    msg = f"training process exited with status {rc}: {head}"
    if rest:
        msg += f" (last stderr lines: {' | '.join(rest)})"
    return msg + f"; full log {log_path}", tail


def train_in_subprocess(
    samples: str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    config: TrainerConfig,
    *,
    iteration: int = 0,
    on_step: Callable[[dict[str, float]], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    show_progress: bool | None = None,
    accelerate_config: str | os.PathLike[str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    poll_s: float = 0.5,
    env: dict[str, str] | None = None,
    on_status: Callable[[str], None] | None = None,
    heartbeat_s: float = 20.0,
    max_staleness: int = 0,
) -> SubprocessTrainResult:
    """Train in a child process (:func:`launch_command`); same inputs and checkpoint as :func:`rao_core.train.train`.

    The child writes to the metrics file ``J`` one JSON line per optimizer step (``{"step": {...}}``, read back
    while it runs and handed to ``on_step``), one ``{"progress": {"done": d, "total": t}}`` after each step
    (handed to ``on_progress`` and drawn as a rich bar here when stdout is a terminal: the child's own output goes
    to its log), ``{"phase": "..."}`` as each phase begins (samples read, model loaded, saving: handed to
    ``on_status`` with the seconds since launch, so a log shows no silent minute) and a last line ``{"end":
    {"peak_rss_mb": ...}}`` with its own peak resident memory (``ru_maxrss`` of the main training process; under
    multi-process launches, rank 0's). A failure's one-line message carries the child's own ``error: ...`` line
    (``rao``'s CLI prints exactly one) and the last lines of its stderr.

    Args:
        samples: a samples file (``.jsonl``/``.parquet``) the child reads.
        model_path, out_dir, config, iteration, max_staleness: as for :func:`rao_core.train.train`.
        on_step: called in this process with each step's metrics dict, as the child reports them.
        on_progress: called in this process with ``(steps done, steps planned)`` as the child reports them.
        show_progress: False: no terminal bar; None/True: a rich bar "training steps" when stdout is a
            terminal (:class:`rao_core.progress.StepProgress`).
        accelerate_config: ``accelerate launch --config_file`` (default: ``config.accelerate_config``).
        log_path: the child's stdout+stderr (default ``<out_dir>.train.log``, replaced each run).
        poll_s: how often the metrics file is read while the child runs, seconds.
        env: environment of the child (default: this process's).
        on_status: called in this process with one line per phase the child reports (``training process:
            model and optimizer ready; first optimizer step running (41 s)``) and, when neither a phase nor a
            step came for ``heartbeat_s`` seconds, ``training process: still <phase> (N s)``.
        heartbeat_s: the longest time without a line to ``on_status``, seconds.

    Returns:
        :class:`SubprocessTrainResult`.

    Raises:
        TrainingProcessError: the child exited non-zero (its ``error:`` line and last stderr lines in the
            message), or exited 0 without writing the checkpoint.
    """
    out_dir = Path(out_dir).resolve()
    log = Path(log_path) if log_path is not None else out_dir.with_name(out_dir.name + ".train.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    work = out_dir.with_name(out_dir.name + ".train-io")
    work.mkdir(parents=True, exist_ok=True)
    cfg_path, metrics_path = work / "trainer.json", work / "metrics.jsonl"
    cfg_path.write_text(config.model_dump_json())
    metrics_path.unlink(missing_ok=True)
    acc_cfg = accelerate_config if accelerate_config is not None else config.accelerate_config
    cmd = launch_command(Path(samples).resolve(), Path(model_path).resolve(), out_dir, cfg_path, metrics_path,
                         iteration=iteration, accelerate_config=resolve_accelerate_config(acc_cfg),
                         max_staleness=max_staleness, cpus=config.cpus)
    steps: list[dict[str, float]] = []
    end: dict[str, Any] = {}
    pos = 0
    bar = StepProgress("training steps", 0, on_progress=on_progress, show=show_progress)
    t0 = time.monotonic()
    status = {"phase": "starting (interpreter, torch and accelerate imports)", "at": t0}

    def say(text: str) -> None:
        status["at"] = time.monotonic()
        if on_status is not None:
            on_status(f"training process: {text} ({time.monotonic() - t0:.0f} s)")

    def drain() -> None:
        nonlocal pos
        records, pos = _read_new(metrics_path, pos)
        for r in records:
            if "phase" in r:
                status["phase"] = str(r["phase"])
                say(status["phase"])
            elif "step" in r:
                steps.append(r["step"])
                status["phase"] = f"training, {len(steps)} optimizer step{'s' * (len(steps) > 1)} done"
                if on_step is not None:
                    on_step(r["step"])
            elif "progress" in r:
                bar.set_total(int(r["progress"]["total"]))
                bar.advance(done=int(r["progress"]["done"]))
            elif "end" in r:
                end.update(r["end"])

    stop_stale_trainer(out_dir, say=lambda line: on_status(f"training process: {line}") if on_status else None)
    record = trainer_record_path(out_dir)
    with log.open("w") as logf, bar:
        # its own process group: `accelerate launch` exits on SIGTERM without passing it on, which would leave
        # its trainer child running with no parent; the group holds both
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        write_record(record, process_record(proc.pid, out=str(out_dir)))
        say(f"started (pid {proc.pid}), log {log}")
        try:
            while proc.poll() is None:
                drain()
                if time.monotonic() - status["at"] >= heartbeat_s:
                    say(f"still working: {status['phase']}")
                time.sleep(poll_s)
        except BaseException:  # interrupted (Ctrl-C, task cancelled): do not leave the child training
            kill_group(proc.pid, timeout_s=STOP_GRACE_S)
            raise
        finally:  # a child still running (a failed stop) stays recorded: the next launch stops it
            if proc.poll() is not None:
                record.unlink(missing_ok=True)
        drain()
    wall = time.monotonic() - t0
    rc = proc.returncode
    if rc != 0:
        msg, tail = _failure_message(rc, log)
        raise TrainingProcessError(msg, returncode=rc, log_path=log, tail=tail)
    if not is_checkpoint(out_dir):
        msg, tail = _failure_message(rc, log)
        raise TrainingProcessError(msg.replace(f"exited with status {rc}", "exited 0 without a checkpoint", 1),
                                   returncode=rc, log_path=log, tail=tail)
    peak = end.get("peak_rss_mb")
    return SubprocessTrainResult(checkpoint=out_dir, metrics=steps, peak_rss_mb=float(peak) if peak else None,
                                 wall_s=wall, log_path=log)


@dataclass
class TrainingRun:
    """What :func:`run_training` produced, in either process mode."""

    checkpoint: Path
    metrics: list[dict[str, float]] = field(default_factory=list)  # one dict per optimizer step
    peak_rss_mb: float | None = None  # the child's own peak RSS (``process: subprocess`` only)


def run_training(batch: SampleBatch, model_path: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                 config: TrainerConfig, *, iteration: int = 0,
                 on_step: Callable[[dict[str, float]], None] | None = None,
                 on_progress: Callable[[int, int], None] | None = None,
                 samples_path: str | os.PathLike[str] | None = None,
                 around_child: contextlib.AbstractContextManager | None = None,
                 on_status: Callable[[str], None] | None = None, max_staleness: int = 0) -> TrainingRun:
    """Train ``batch`` from ``model_path`` into ``out_dir`` where ``config.process`` says: the one dispatch
    of the campaign's train stage and of the warm start.

    ``inline``: :func:`rao_core.train.train` in this process. ``subprocess``: :func:`train_in_subprocess`
    (its memory goes back to the OS when it exits) on ``samples_path``, the same samples as a file
    (written to ``<out_dir>.samples.jsonl`` when None); ``around_child`` (e.g. the flow's vLLM server
    asleep) is entered around the child only. ``on_step`` gets each step's metrics, ``on_progress``
    ``(steps done, steps planned)`` after each step, in this process, in either mode; a rich bar of the
    steps is drawn when stdout is a terminal. ``on_status`` gets one line per phase of the trainer (loading,
    first step, saving) and, from a child, a line whenever ``heartbeat_s`` (20) seconds pass without one.
    ``max_staleness``: the asynchronous-RL bound (``algo.max_staleness``), as for :func:`rao_core.train.train`.
    """
    if config.process != "subprocess":
        from rao_core.train import train

        res = train(batch, model_path, out_dir, config, iteration=iteration, on_step=on_step, on_progress=on_progress,
                    on_phase=on_status, max_staleness=max_staleness)
        return TrainingRun(checkpoint=res.checkpoint, metrics=res.metrics)
    if samples_path is None:
        from rao_core.samples import write_samples

        samples_path = Path(out_dir).with_name(Path(out_dir).name + ".samples.jsonl")
        write_samples(samples_path, batch)
    with around_child or contextlib.nullcontext():
        sub = train_in_subprocess(samples_path, model_path, out_dir, config, iteration=iteration, on_step=on_step,
                                  on_progress=on_progress, on_status=on_status, max_staleness=max_staleness)
    return TrainingRun(checkpoint=sub.checkpoint, metrics=sub.metrics, peak_rss_mb=sub.peak_rss_mb)
