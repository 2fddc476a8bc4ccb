"""An interrupted ``rao run`` (Ctrl-C or SIGTERM) stops at once: its child processes are stopped, the
campaign's MLflow runs are marked KILLED, one ``error:`` line is printed and the exit status is 130 / 143
(issue 16: it took ~80 s, printed a traceback and left the MLflow run RUNNING)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infra.process import pid_alive
from rao_core.paths import REPO_ROOT

# A stand-in for the campaign flow: it starts a service-like child in its own session and a plain child (a
# trainer), writes their pids, then works until stopped. Its ``finally`` block records that it ran.
SCRIPT = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    from infra.process import run_interruptible

    out = Path(sys.argv[1])
    blocked = sys.argv[2] == "blocked"

    def campaign():
        sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
        service = subprocess.Popen(sleep, start_new_session=True)
        trainer = subprocess.Popen(sleep)
        (out / "pids").write_text(f"{service.pid} {trainer.pid}")
        try:
            if blocked:
                time.sleep(600)  # blocked in C: the KeyboardInterrupt cannot land, the grace period runs out
            while True:
                time.sleep(0.05)
        finally:
            (out / "finally").write_text("ran")

    def on_interrupt(signum):
        (out / "marked").write_text(str(signum))
        return "interrupted; re-run the same command to resume"

    run_interruptible(campaign, on_interrupt, grace_s=1.0, stop_timeout_s=2.0)
""")


def _start(tmp_path: Path, mode: str = "loop") -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("RAO_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), mode], env=env, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "pids").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.2)
    return proc, [int(p) for p in (tmp_path / "pids").read_text().split()]


@pytest.mark.parametrize("sig, code, mode", [(signal.SIGTERM, 143, "loop"), (signal.SIGINT, 130, "loop"),
                                             (signal.SIGTERM, 143, "blocked")])
def test_an_interrupted_run_stops_its_children_and_says_so_on_one_line(tmp_path, sig, code, mode):
    proc, children = _start(tmp_path, mode)
    t0 = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == code
    assert err.splitlines() == ["error: interrupted; re-run the same command to resume"] and out == ""
    assert (tmp_path / "marked").read_text() == str(int(sig))  # on_interrupt ran, told which signal
    # loop: the KeyboardInterrupt reached the flow, whose finally ran; blocked: the 1 s grace ran out instead
    assert (tmp_path / "finally").exists() == (mode == "loop")
    time.sleep(0.2)
    assert not [p for p in children if pid_alive(p)]  # the service (own session) and the trainer are gone
    assert took < (5 if mode == "loop" else 8)


def test_a_result_or_an_error_of_the_work_comes_back_unchanged():
    from infra.process import run_interruptible

    assert run_interruptible(lambda: 42, lambda s: "never") == 42
    with pytest.raises(ValueError, match="bad config"):
        run_interruptible(lambda: (_ for _ in ()).throw(ValueError("bad config")), lambda s: "never")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are given back


def test_kill_campaign_runs_marks_only_this_campaigns_live_runs(tmp_path, monkeypatch):
    """RUNNING runs of the campaign (and one a crash hook just marked FAILED) become KILLED; finished runs,
    old failures and other campaigns' runs are left alone."""
    import mlflow

    from infra.tracking import configure_mlflow, ensure_experiment
    from rao_cli.pipeline_cmd import kill_campaign_runs
    from rao_core.config import load_config

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config("configs/cpu-smoke.yaml", overrides=[f"tracking.tracking_uri={uri}", "name=camp"])
    configure_mlflow(uri)
    exp = ensure_experiment(cfg.tracking.experiment)
    client = mlflow.MlflowClient()

    def run(campaign: str, status: str | None) -> str:
        rid = client.create_run(exp, tags={"rao.campaign": campaign}).info.run_id
        if status:
            client.set_terminated(rid, status=status)
        return rid

    campaign_run, iteration_run = run("camp", None), run("camp", None)
    old_failure, finished, other = run("camp", "FAILED"), run("camp", "FINISHED"), run("other", None)
    time.sleep(0.01)
    since = int(time.time() * 1000)
    just_failed = run("camp", "FAILED")
    assert sorted(kill_campaign_runs(cfg, since)) == sorted([campaign_run, iteration_run, just_failed])
    status = {r: client.get_run(r).info.status for r in (campaign_run, iteration_run, just_failed, old_failure,
                                                         finished, other)}
    assert list(status.values()) == ["KILLED", "KILLED", "KILLED", "FAILED", "FINISHED", "RUNNING"]
