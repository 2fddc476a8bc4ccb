"""Fixtures of the infra tests: one Prefect server for the session, started as the README says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.process import free_port

RAO = [sys.executable, "-m", "rao_cli.main"]


@pytest.fixture(scope="session")
def prefect_up(tmp_path_factory):
    """``rao services up --no-s3 --prefect-server --prefect-port P`` in a fresh RAO_HOME; yields (env, stdout,
    port), ``env`` being the environment of that RAO_HOME (no PREFECT_* or RAO_S3* of the caller)."""
    home = tmp_path_factory.mktemp("rao-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAO_S3"))}
    env.update(RAO_HOME=str(home), PREFECT_HOME=str(home / "prefect"), PREFECT_WORKER_QUERY_SECONDS="2")
    port = free_port()
    r = subprocess.run(RAO + ["services", "up", "--no-s3", "--prefect-server", "--prefect-port", str(port)],
                       env=env, capture_output=True, text=True, timeout=300, cwd=home)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        yield env, r.stdout, port
    finally:
        subprocess.run(RAO + ["services", "down"], env=env, capture_output=True, timeout=120, cwd=home)


@pytest.fixture
def prefect_api(prefect_up):
    """An HTTP client of the session's Prefect server, its base URL the API's (``client.post("deployments/filter",
    ...)``): Prefect's own ``PrefectHttpxSyncClient``, which retries what the server answers as retryable (503
    when its SQLite is busy under load, 502, 429, timeouts) with backoff, as the worker's and the UI's clients do,
    and raises on any other error status. A bare httpx call failed CI once on such a 503. It authenticates as
    Prefect's clients do with ``PREFECT_API_AUTH_STRING``: ``Authorization: Basic base64(auth string)``, the auth
    string being that installation's (``$RAO_HOME/secrets/prefect``, written when the worker command was printed)."""
    import base64

    from prefect.client.base import PrefectHttpxSyncClient

    env, _, port = prefect_up
    auth = Path(env["RAO_HOME"]) / "secrets" / "prefect"
    assert auth.is_file(), f"{auth} missing: `rao services up --prefect-server` printed no worker command"
    headers = {"Authorization": "Basic " + base64.b64encode(auth.read_bytes()).decode()}
    with PrefectHttpxSyncClient(base_url=f"http://127.0.0.1:{port}/api/", timeout=60, headers=headers) as client:
        yield client
