"""The Prefect workflow of the README: ``rao services up --prefect-server`` prints
the API URL and the worker command, ``rao deploy`` makes deployments whose pull step is the repository's
absolute path, and the printed worker runs a deployment from there (not from its own folder)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rao_core.paths import REPO_ROOT
from tests.infra.prefect_worker import printed_worker, wait_for_flow_run

pytestmark = pytest.mark.services
RAO = [sys.executable, "-m", "rao_cli.main"]


def test_services_up_prints_the_api_url_and_a_worker_command(prefect_up):
    env, out, port = prefect_up
    api = f"http://127.0.0.1:{port}/api"
    assert f"PREFECT_API_URL:  {api}" in out
    auth = Path(env["RAO_HOME"]) / "secrets" / "prefect"  # read by the shell: the auth string is not shown
    worker = (f'PREFECT_API_URL={api} PREFECT_API_AUTH_STRING="$(cat {auth})" '
              f"{Path(sys.executable).parent / 'prefect'} worker start --pool rao-pool")
    assert f"worker:           {worker}" in out
    assert auth.read_text() not in out
    assert httpx.get(f"{api}/health", timeout=10).json() is True


def test_a_fixed_port_in_use_is_one_clear_error(tmp_path):
    from infra.orchestration import PrefectServer
    from infra.process import ServiceError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServiceError, match=f"port {port} on 127.0.0.1 is in use"):
            PrefectServer(port=port, log_dir=tmp_path).start()


def test_deploy_records_the_repository_path_and_a_worker_runs_from_it(prefect_up, prefect_api, tmp_path):
    env, _, port = prefect_up
    api = f"http://127.0.0.1:{port}/api"
    r = subprocess.run(RAO + ["deploy"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"start a worker: PREFECT_API_URL={api} " in r.stdout
    deps = {d["name"]: d for d in prefect_api.post("deployments/filter", json={}).json()}
    assert set(deps) == {"campaign", "nightly-evaluation"}
    for d in deps.values():  # the absolute path, filled in at deploy time: no template left for the worker
        assert d["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO_ROOT)}}]
    assert deps["nightly-evaluation"]["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert {d["work_pool_name"] for d in deps.values()} == {"rao-pool"}

    # The printed worker, started in another folder, runs the campaign deployment from the repository:
    # a missing config file makes the flow itself fail (FAILED with its message), where a worker that
    # cannot find the code crashes (CRASHED) before the flow starts.
    resp = prefect_api.post(f"deployments/{deps['campaign']['id']}/create_flow_run",  # retries a busy server's 503
                            json={"parameters": {"params": {"config": "configs/no-such-config.yaml"}}})
    assert resp.status_code == 201, f"create_flow_run: {resp.status_code} {resp.text[:2000]}"
    fr = resp.json()
    line = re.search(r"start a worker: (.*)", r.stdout).group(1)
    assert 'PREFECT_API_AUTH_STRING="$(cat ' in line
    with printed_worker(line, env, tmp_path) as worker_log:
        run = wait_for_flow_run(prefect_api, fr["id"], timeout_s=300)
    log = worker_log.read_text()[-3000:]
    assert run["state"]["type"] == "FAILED", log
    assert "no-such-config.yaml" in run["state"]["message"], run["state"]["message"]
    assert run["name"] == "campaign"  # the form's config could not be read: the fallback name


def test_deploy_puts_every_deployment_on_the_pool_it_names(prefect_up, prefect_api, tmp_path):
    """``rao deploy --pool P`` creates P and puts both deployments on it (``prefect deploy --all`` ignores its
    own ``--pool``), and prints the worker command for P."""
    env, _, port = prefect_up
    r = subprocess.run(RAO + ["deploy", "--pool", "gpu-pool"], env=env, capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"start a worker: .* worker start --pool gpu-pool$", r.stdout, re.M), r.stdout[-500:]
    deps = {d["name"]: d for d in prefect_api.post("deployments/filter", json={}).json()}
    assert {d["work_pool_name"] for d in deps.values()} == {"gpu-pool"}, deps
    pools = {w["name"]: w for w in prefect_api.post("work_pools/filter", json={}).json()}
    assert pools["gpu-pool"]["type"] == "process"
