"""A flow run cancelled (as from the Prefect UI) while its vLLM server starts leaves no server running.

The server here is a stand-in that never answers and ignores SIGTERM, as vLLM does while it compiles; the flow runs
under a Prefect runner (as under a worker), and the test sets the run CANCELLING, as the UI's Cancel does. Before:
the server was recorded only once it answered, and the pool's stop waited for the start to end, so the cancelled
run's hooks stopped nothing and the server went on (parent pid 1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.process import kill_group, pid_alive
from rao_core.paths import REPO_ROOT

pytestmark = [pytest.mark.services]

FAKE_VLLM = """#!/bin/bash
# a vLLM start that never ends: SIGTERM ignored (as while it compiles), never healthy
trap '' TERM
echo "INFO 12-07 10:00:00 [backends.py:1] Compiling a graph for dynamic shape takes 40 s"
echo $$ > "{pidfile}"
while true; do sleep 1; done
"""


def _harness_auth(environ) -> dict[str, str]:
    """``environ`` with the Prefect auth strings this process's settings hold (those the harness API was started
    with), not whatever an earlier test of the session left in ``os.environ`` (a CLI test run in-process sets the
    installation's own): the runner's client then authenticates as this process's does."""
    from prefect.settings import get_current_settings

    env = {k: v for k, v in environ.items() if k not in ("PREFECT_API_AUTH_STRING", "PREFECT_SERVER_API_AUTH_STRING")}
    settings = get_current_settings()
    for key, value in (("PREFECT_API_AUTH_STRING", settings.api.auth_string),
                       ("PREFECT_SERVER_API_AUTH_STRING", settings.server.api.auth_string)):
        if value is not None:
            env[key] = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    return env


def test_a_run_cancelled_while_its_vllm_starts_leaves_no_server(tmp_path, prefect_harness, tiny_model_path):
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Cancelling

    pidfile = tmp_path / "server.pid"
    fake = tmp_path / "python"
    fake.write_text(FAKE_VLLM.format(pidfile=pidfile))
    fake.chmod(0o755)
    env = {**_harness_auth(os.environ), "PREFECT_API_URL": PREFECT_API_URL.value(), "RAO_VLLM_PYTHON": str(fake),
           "RAO_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO_ROOT), "PREFECT_RUNNER_POLL_FREQUENCY": "2",
           "PREFECT_LOGGING_LEVEL": "INFO"}
    log = open(tmp_path / "runner.log", "w")
    runner = subprocess.Popen([sys.executable, "-m", "tests.pipeline.cancel_drill_flow"], env=env, cwd=REPO_ROOT,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = None
    try:
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 180
            while not client.read_deployments():
                assert runner.poll() is None and time.monotonic() < deadline, (tmp_path / "runner.log").read_text()
                time.sleep(1)
            run = run_deployment("rao-cancel-drill/drill", parameters={"model": str(tiny_model_path)}, timeout=0)
            deadline = time.monotonic() + 300
            while not pidfile.exists():
                ended = client.read_flow_run(run.id).state.is_final()
                assert not ended and time.monotonic() < deadline, (tmp_path / "runner.log").read_text()[-3000:]
                time.sleep(0.5)
            server = int(pidfile.read_text())
            time.sleep(1)
            assert pid_alive(server)
            client.set_flow_run_state(run.id, Cancelling(message="cancelled from the UI"))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (pid_alive(server) or client.read_flow_run(run.id).state.type.value
                                                   not in ("CANCELLED", "CRASHED", "FAILED", "COMPLETED")):
                time.sleep(1)
            state = client.read_flow_run(run.id).state
        text = (tmp_path / "runner.log").read_text()
        assert not pid_alive(server), f"the vLLM stand-in (pid {server}) still runs after the cancel\n{text[-3000:]}"
        assert state.type.value == "CANCELLED", text[-3000:]
        assert not list((tmp_path / "home" / "services" / "flow-runs").glob("*.json"))  # its record dropped
    finally:
        kill_group(runner.pid, timeout_s=10)
        if server and pid_alive(server):
            kill_group(server, timeout_s=1)
        log.close()
