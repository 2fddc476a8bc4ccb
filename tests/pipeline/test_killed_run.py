"""A ``rao run`` killed with SIGKILL (no handler runs) leaves nothing running, and its re-run resumes cleanly.

- The orphan guard (``rao_core.process_group.watch_parent``) stops every process the killed run had started (the
  SFT trainer in its own process group included) within seconds.
- A trainer recorded for a checkpoint folder that still runs is stopped before a new one starts on that folder
  (``rao_core.train.launch.stop_stale_trainer``), by its recorded pid and start time, never a reused pid.
- The re-run marks the killed run's Prefect flow run CRASHED (it stayed RUNNING), trains one trainer at a time
  and leaves a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rao_core.process_group import pid_alive, process_record, start_time, write_record
from tests.pipeline.test_campaign import campaign_env  # noqa: F401 - a fixture
from rao_core.train.launch import stop_stale_trainer, trainer_record_path

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _descendants(root: int) -> set[int]:
    from infra.process import descendants

    return set(descendants(root))


def test_a_recorded_trainer_still_running_is_stopped_with_its_group_before_a_new_one_starts(tmp_path):
    out = tmp_path / "checkpoints" / "iter-0"
    # `accelerate launch` leading the group, and the trainer it started
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; c = subprocess.Popen(["
                               "sys.executable, '-c', 'import time; time.sleep(600)']); print(c.pid, flush=True); "
                               "time.sleep(600)"],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    child = int(leader.stdout.readline())
    write_record(trainer_record_path(out), process_record(leader.pid, out=str(out)))
    lines: list[str] = []
    try:
        assert stop_stale_trainer(out, lines.append, timeout_s=5) == leader.pid
        leader.wait(timeout=5)
        assert not pid_alive(child)
        assert lines == [f"a training process left by an earlier run (pid {leader.pid}) still writes {out}: "
                         "stopping its process group before this one starts"]
        assert not trainer_record_path(out).exists()
    finally:
        if leader.poll() is None:
            os.killpg(leader.pid, signal.SIGKILL)


def test_a_record_whose_pid_now_names_another_process_stops_nothing(tmp_path):
    out = tmp_path / "iter-0"
    other = subprocess.Popen(SLEEP, start_new_session=True)
    try:  # the recorded trainer is gone; its pid was reused by a process that started later
        write_record(trainer_record_path(out), {"pid": other.pid, "start_time": start_time(other.pid) - 1,
                                                "host": os.uname().nodename, "out": str(out)})
        assert stop_stale_trainer(out, lambda line: pytest.fail(line)) is None
        assert pid_alive(other.pid) and not trainer_record_path(out).exists()
    finally:
        other.kill()
        other.wait()


GUARDED = """
import subprocess, sys, time
from pathlib import Path
from infra.process import run_interruptible

def work():
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    a = subprocess.Popen(sleep, start_new_session=True)  # a service, or the trainer's group
    b = subprocess.Popen(sleep)  # Prefect's API server: in the run's own group
    Path(sys.argv[1]).write_text(f"{a.pid} {b.pid}")
    time.sleep(600)

run_interruptible(work, lambda signum: 'interrupted')
"""


def test_the_orphan_guard_stops_what_a_run_killed_with_sigkill_had_started(tmp_path):
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", GUARDED, str(pids)], start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        deadline = time.monotonic() + 60
        while not pids.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.5)  # the guard's first look at the children
        children = [int(p) for p in pids.read_text().split()]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while [p for p in children if pid_alive(p)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in children if pid_alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.services
def test_sigkill_during_sft_then_rerun_gives_one_trainer_a_complete_checkpoint_and_a_crashed_flow_run(
        campaign_env, tiny_model_path):
    """The issue's drill: ``kill -9`` of ``rao run`` while the warm start's SFT trains. Before: the trainer went on
    writing ``checkpoints/iter-0`` for minutes, the re-run started a second one on the same folder, and the killed
    flow run stayed RUNNING in Prefect."""
    from rao_core.train.checkpoint import is_checkpoint
    from tests.pipeline.test_campaign import TINY_OVERRIDES

    home = Path(os.environ["RAO_HOME"])
    extra = {"warm_start.mode": "demos", "warm_start.n_tasks": 2, "warm_start.difficulties": ["easy"],
             "warm_start.trainer.max_steps": 2, "eval.enabled": False}
    ov = [f"--set={k}={json.dumps(v)}" for k, v in {**TINY_OVERRIDES, **extra}.items()]
    cmd = [sys.executable, "-m", "rao_cli.main", "run", "--name", "killed", "--iterations", "0",
           f"--set=model.path={json.dumps(str(tiny_model_path))}", *ov]
    out = home / "campaigns" / "killed" / "checkpoints" / "iter-0"
    first_log = open(home.parent / "first-run.log", "w")  # a file: a pipe nobody reads would block the run
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=first_log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (trainers := [p for p in _all_pids() if _is_trainer(p, out)]):
            assert proc.poll() is None, (home.parent / "first-run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the warm start's SFT did not start"
            time.sleep(0.1)
        trainer = trainers[0]
        time.sleep(1.5)  # the orphan guard has seen the trainer
        started = _descendants(proc.pid)
        assert trainer in started
        os.kill(proc.pid, signal.SIGKILL)  # kill -9 of `rao run`: no handler, no finally, no Prefect hook
        proc.wait()
        deadline = time.monotonic() + 30
        while [p for p in started if pid_alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in started if pid_alive(p)]
        assert not left, f"still running after the kill: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    first_log.close()
    rerun_log = home.parent / "rerun.log"
    with open(rerun_log, "w") as f:
        rerun = subprocess.Popen(cmd, env=dict(os.environ), stdout=f, stderr=subprocess.STDOUT)
    most = 0
    while rerun.poll() is None:  # trainers writing the folder at once, sampled
        trainers = [p for p in _all_pids() if _is_trainer(p, out)]
        most = max(most, len(trainers))
        time.sleep(0.2)
    log = rerun_log.read_text()
    assert rerun.returncode == 0, log[-3000:]
    assert most == 1
    assert is_checkpoint(out) and (out / ".complete").exists()
    assert "Prefect flow run killed marked CRASHED" in " ".join(log.split()), log[-3000:]
    r = subprocess.run([sys.executable, "-c", READ_STATES], env=dict(os.environ), capture_output=True, text=True,
                       timeout=300)  # the runs' own API: an embedded one on the same PREFECT_HOME
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["CRASHED", "COMPLETED"]


READ_STATES = """
import json
from infra.orchestration import configure_prefect
configure_prefect()
from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName

with get_client(sync_client=True) as client:
    runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["rao-campaign"])))
    print(json.dumps([r.state.type.value for r in sorted(runs, key=lambda r: r.start_time) if r.name == "killed"]))
"""


def _all_pids() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_trainer(pid: int, out: Path) -> bool:
    """The training process itself (not its ``accelerate launch`` parent) writing checkpoint folder ``out``."""
    cmd = _cmdline(pid)
    return f"--out {out} " in cmd + " " and "rao_cli.main train" in cmd and "accelerate.commands.launch" not in cmd
