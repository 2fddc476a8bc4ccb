"""``rao services up|down|status``: long-lived embedded services shared by several commands.

State lives in ``$RAO_HOME/services/state.json`` (name -> pid, url, log, started). Services started here
keep running after the command exits (each in its own process group) until ``down`` stops the groups.
A name whose endpoint comes from configuration (AWS S3, a remote MLflow, a Prefect server, any
OpenAI-compatible URL) is listed as ``external`` and never started or stopped by the project.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from infra.process import kill_group, pid_alive
from rao_core.paths import rao_home


def state_path() -> Path:
    return rao_home() / "services" / "state.json"


def load_state() -> dict[str, dict[str, Any]]:
    try:
        return json.loads(state_path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def save_state(state: dict[str, dict[str, Any]]) -> None:
    p = state_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, p)


def record(name: str, **info: Any) -> None:
    state = load_state()
    state[name] = {**info, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    save_state(state)


def service_env() -> dict[str, str]:
    """Endpoint variables of the running services, for processes that should use them."""
    env: dict[str, str] = {}
    for name, info in load_state().items():
        if info.get("pid") and not pid_alive(info["pid"]):
            continue
        env.update(info.get("env", {}))
    return env


def apply_service_env() -> dict[str, str]:
    """Export running services' endpoints into this process unless already set (config/env wins)."""
    env = service_env()
    for k, v in env.items():
        os.environ.setdefault(k, v)
    return env


def up(*, s3: bool = True, mlflow_server: bool = False, prefect_server: bool = False, prefect_port: int = 0,
       model: str | None = None, max_model_len: int = 4096) -> dict[str, dict[str, Any]]:
    """Start the requested services that are not already running (the Prefect server on ``prefect_port``,
    0 = a free port); returns the state."""
    state = load_state()

    def running(name: str) -> bool:
        info = state.get(name)
        return bool(info and info.get("pid") and pid_alive(info["pid"]))

    if s3 and not running("s3") and not os.environ.get("RAO_S3_ENDPOINT"):
        from infra.storage import SeaweedFSServer

        srv = SeaweedFSServer().start()
        record("s3", pid=srv.pid, url=srv.endpoint_url, log=str(srv.process.log_path),
               start_s=round(srv.process.start_seconds, 2), env=srv.settings().env())
    if mlflow_server and not running("mlflow"):
        from infra.tracking import MLflowServer

        srv = MLflowServer().start()
        record("mlflow", pid=srv.pid, url=srv.tracking_uri, log=str(srv.process.log_path),
               start_s=round(srv.process.start_seconds, 2), env={"MLFLOW_TRACKING_URI": srv.tracking_uri})
    if prefect_server and not running("prefect"):
        from infra.orchestration import PrefectServer

        srv = PrefectServer(port=prefect_port).start()
        record("prefect", pid=srv.pid, url=srv.ui_url, log=str(srv.process.log_path), api_url=srv.api_url,
               start_s=round(srv.process.start_seconds, 2), env={"PREFECT_API_URL": srv.api_url})
    if model and not running("vllm"):
        from infra.serving import VLLMServer

        srv = VLLMServer(model, max_model_len=max_model_len).start()
        record("vllm", pid=srv.pid, url=srv.base_url, log=str(srv.process.log_path), model=str(model),
               start_s=round(srv.process.start_seconds, 2),
               env={"RAO_POLICY_BASE_URL": srv.base_url, "RAO_POLICY_MODEL": srv.model})
    return load_state()


def prefect_instructions(pool: str = "rao-pool") -> list[str]:
    """How to use the running Prefect server of ``up``: UI, ``PREFECT_API_URL`` and the worker command
    (empty when none runs)."""
    from infra.orchestration import worker_command

    info = load_state().get("prefect") or {}
    if not (info.get("pid") and pid_alive(info["pid"])):
        return []
    api = info.get("api_url") or info.get("env", {}).get("PREFECT_API_URL", "")
    return [f"Prefect UI:       {info.get('url', '')}", f"PREFECT_API_URL:  {api}",
            "deployments:      .venv/bin/rao deploy   (rao commands find the server by themselves)",
            f"worker:           {worker_command(api, pool)}"]


def down() -> list[str]:
    """Stop every service recorded in the state file; returns the names stopped."""
    stopped = []
    for name, info in load_state().items():
        pid = info.get("pid")
        if pid and pid_alive(pid):
            kill_group(pid)
            stopped.append(name)
    save_state({})
    return stopped


def status() -> list[dict[str, Any]]:
    """One row per service: name, state (running/dead/default/external), url, pid, log."""
    rows = []
    state = load_state()
    for name, info in state.items():
        alive = bool(info.get("pid")) and pid_alive(info["pid"])
        rows.append({"name": name, "state": "running" if alive else "dead", "url": info.get("url", ""),
                     "pid": info.get("pid"), "log": info.get("log", "")})
    from infra.tracking import default_tracking_uri

    if "mlflow" not in state:
        uri = default_tracking_uri()
        rows.append({"name": "mlflow", "state": "external" if not uri.startswith("sqlite") else "default",
                     "url": uri, "pid": None, "log": ""})
    if "prefect" not in state:
        api = os.environ.get("PREFECT_API_URL")
        rows.append({"name": "prefect", "state": "external" if api else "default",
                     "url": api or "ephemeral (per process)", "pid": None, "log": ""})
    if "s3" not in state and os.environ.get("RAO_S3_ENDPOINT"):
        rows.append({"name": "s3", "state": "external", "url": os.environ["RAO_S3_ENDPOINT"], "pid": None,
                     "log": ""})
    return rows
