"""The MLflow server of ``rao services up --mlflow-server`` requires the installation's credential: a request
without it (or with another password) is refused with 401, the pipeline's client (its variables recorded with the
server) logs and reads runs and the registry."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest


@pytest.mark.services
def test_the_mlflow_server_refuses_an_unauthenticated_request_and_takes_the_pipelines(tmp_path, monkeypatch):
    from infra.tracking import MLFLOW_USER, MLflowServer

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    srv = MLflowServer().start()
    try:
        api = f"{srv.tracking_uri}/api/2.0/mlflow"
        assert httpx.get(f"{srv.tracking_uri}/health", timeout=30).status_code == 200  # the probe stays open
        for auth in (None, (MLFLOW_USER, "wrong"), ("admin", "password")):
            r = httpx.post(f"{api}/experiments/create", json={"name": "intruder"}, auth=auth, timeout=30)
            assert r.status_code == 401, (auth, r.status_code, r.text[:200])
            assert httpx.get(f"{api}/experiments/search", params={"max_results": 10}, auth=auth,
                             timeout=30).status_code == 401
            assert httpx.get(f"{api}/registered-models/search", auth=auth, timeout=30).status_code == 401
        env = srv.client_env()
        assert env["MLFLOW_TRACKING_USERNAME"] == MLFLOW_USER and env["MLFLOW_TRACKING_PASSWORD"] == srv.password
        code = ("import mlflow\n"
                "with mlflow.start_run() as run:\n"
                "    mlflow.log_metric('reward', 0.5)\n"
                "c = mlflow.MlflowClient()\n"
                "c.create_registered_model('rao-policy')\n"
                "print(c.get_run(run.info.run_id).data.metrics['reward'])\n")
        r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env, "MLFLOW_DISABLE_TELEMETRY": "true"},
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip().splitlines()[-1] == "0.5"
        r = httpx.get(f"{api}/registered-models/search", auth=(MLFLOW_USER, srv.password), timeout=30)
        assert r.status_code == 200 and [m["name"] for m in r.json()["registered_models"]] == ["rao-policy"]
    finally:
        srv.stop()
    assert not srv.alive()
    ini = tmp_path / "home" / "mlflow" / "basic_auth.ini"
    assert ini.stat().st_mode & 0o077 == 0 and srv.password not in ini.read_text()
