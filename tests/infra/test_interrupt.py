"""An interrupted ``rao run`` (Ctrl-C or SIGTERM) stops at once: its child processes are stopped, the
campaign's MLflow runs are marked KILLED and its Prefect flow runs CANCELLED, one ``error:`` line is printed
and the exit status is 130 / 143 (it took ~80 s, printed a traceback and left the MLflow run
RUNNING; later the Prefect flow runs stayed RUNNING)."""

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


# ``rao run``'s own ``on_interrupt`` (``rao_cli.pipeline_cmd._interrupted``) around a stand-in campaign: the flow
# ``rao-campaign`` run ``camp`` and its subflow ``rao-iteration`` run ``camp-iter-1`` (blocked until stopped),
# on Prefect's embedded API; another campaign's run ``other`` is RUNNING on the same API.
PREFECT_SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from prefect import flow, get_client
    from prefect.states import Running
    import rao_cli.pipeline_cmd as pipeline_cmd
    from infra.process import run_interruptible
    from rao_core.config import load_config

    out = Path(sys.argv[1])
    pipeline_cmd.kill_campaign_runs = lambda cfg, since: []  # MLflow: test_kill_campaign_runs_...
    cfg = load_config("configs/cpu-smoke.yaml", overrides=["name=camp"])

    @flow(name="rao-iteration", flow_run_name="camp-iter-1")
    def iteration():
        (out / "started").write_text("")
        time.sleep(600)  # blocked in C (as in a stage's I/O): the engine cannot report the crash meanwhile

    @flow(name="rao-campaign", flow_run_name="camp")
    def campaign():
        iteration()

    with get_client(sync_client=True) as client:
        other = client.create_flow_run(campaign, name="other")
        client.set_flow_run_state(other.id, Running())
    run_interruptible(campaign, pipeline_cmd._interrupted(cfg), grace_s=1.0, stop_timeout_s=2.0)
""")

# The flow runs' states as Prefect's API gives them (a fresh embedded API on the same PREFECT_HOME).
READ_STATES = textwrap.dedent("""
    import json
    from prefect import get_client

    with get_client(sync_client=True) as client:
        print(json.dumps({r.name: r.state.type.value for r in client.read_flow_runs()}))
""")


def test_ctrl_c_of_rao_run_leaves_its_prefect_flow_runs_cancelled(tmp_path):
    """Ctrl-C in a terminal reaches the whole process group, Prefect's embedded API server included, so the
    flow engine cannot report the end: the campaign's flow runs stayed RUNNING in the UI forever. Now the
    interrupt marks them CANCELLED (through a new embedded API on the same database); other runs keep theirs."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "RAO_DEBUG"}
    env.update(PYTHONPATH=str(REPO_ROOT), RAO_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect"),
               PREFECT_LOGGING_LEVEL="WARNING", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    proc = subprocess.Popen([sys.executable, "-c", PREFECT_SCRIPT, str(tmp_path)], env=env, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the script and its Prefect API server
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines()[-1] == ("error: interrupted (SIGINT): campaign 'camp' stopped, no MLflow run was "
                                            "running, Prefect flow runs camp, camp-iter-1 marked CANCELLED; re-run "
                                            "the same command to resume"), err
    r = subprocess.run([sys.executable, "-c", READ_STATES], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"camp": "CANCELLED", "camp-iter-1": "CANCELLED",
                                                             "other": "RUNNING"}


def test_a_result_or_an_error_of_the_work_comes_back_unchanged():
    from infra.process import run_interruptible

    # the handlers in place before (SIG_IGN for SIGINT when the suite runs in the background, as in CI)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert run_interruptible(lambda: 42, lambda s: "never") == 42
    with pytest.raises(ValueError, match="bad config"):
        run_interruptible(lambda: (_ for _ in ()).throw(ValueError("bad config")), lambda s: "never")
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are given back


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


class _SilentServer:
    """An OpenAI-compatible server in a thread that lists its model but never answers a completion: the
    command under test is busy in its evaluation when the signal comes (``posted`` is set)."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        posted = self.posted = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                data = b'{"object": "list", "data": [{"id": "policy", "object": "model"}]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                posted.set()
                time.sleep(120)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

        self.srv = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/v1"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_rao_eval_stops_at_once_on_one_line(tmp_path, sig, code):
    """``rao eval`` runs its work through ``run_interruptible`` (as ``rao run``): a signal during the
    evaluation stops it within seconds with one error: line (before: SIGTERM killed it silently with
    --base-url, or went through sys.exit while vLLM was served)."""
    from rao_core.envs import get_env
    from rao_core.envs.base import write_tasks
    from rao_core.paths import tiny_model_path

    model = tiny_model_path()
    if not (model / "config.json").exists():
        pytest.skip(f"{model} missing (run `make setup`)")
    env = get_env("textcraft-synth")
    tasks = write_tasks(tmp_path / "tasks.jsonl", env.generate_tasks(n=2, seed=0, difficulty="easy"))
    srv = _SilentServer()
    penv = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    penv.pop("RAO_DEBUG", None)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rao_cli.main", "eval", "--model", str(model), "--task-file",
                                 str(tasks), "--base-url", srv.url], env=penv, cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if not srv.posted.wait(600):  # imports and task checks: slow on a busy 2-core machine
            proc.kill()
            pytest.fail(f"rao eval never asked for a completion: {proc.communicate()}")
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert proc.returncode == code, (out, err)
    assert err.strip().splitlines()[-1] == (f"error: interrupted ({signal.Signals(sig).name}): evaluation of "
                                            f"{model} on {tasks} stopped"), err
    assert "Traceback" not in err
    assert took < 20, took  # 5 s grace for the evaluation to unwind, then its children are stopped


def test_kill_evaluation_runs_marks_only_the_evaluation_runs_this_command_started(tmp_path):
    import mlflow

    from infra.tracking import configure_mlflow, ensure_experiment
    from rao_cli.pipeline_cmd import kill_evaluation_runs
    from rao_core.config import load_config

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config("configs/cpu-smoke.yaml", overrides=[f"tracking.tracking_uri={uri}"])
    configure_mlflow(uri)
    exp = ensure_experiment(cfg.tracking.experiment)
    client = mlflow.MlflowClient()

    def run(kind: str, status: str | None = None) -> str:
        rid = client.create_run(exp, tags={"rao.kind": kind}).info.run_id
        if status:
            client.set_terminated(rid, status=status)
        return rid

    earlier = run("evaluation")  # another evaluation, still running: not this command's
    time.sleep(0.02)
    since = int(time.time() * 1000)
    time.sleep(0.02)
    mine, crashed, campaign = run("evaluation"), run("evaluation", "FAILED"), run("campaign")
    assert sorted(kill_evaluation_runs(cfg, since)) == sorted([mine, crashed])
    status = [client.get_run(r).info.status for r in (mine, crashed, earlier, campaign)]
    assert status == ["KILLED", "KILLED", "RUNNING", "RUNNING"]
