"""MLflow tracking: SQLite by default, an ``mlflow server`` when several processes log, or a remote URI.

- Embedded default: ``sqlite:///$RAO_HOME/mlflow/mlflow.db`` with artifacts in ``$RAO_HOME/mlflow/artifacts``
  (MLflow 3.x no longer supports the ``./mlruns`` file store).
- ``MLflowServer``: ``mlflow server`` on 127.0.0.1 over the same SQLite file, for many writers (one SQLite
  file written by many processes locks).
- Real mode: set ``MLFLOW_TRACKING_URI`` (e.g. a team server); it overrides the default.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.process import ServiceMixin, ManagedProcess, free_port
from rao_core.paths import rao_home


def mlflow_dir() -> Path:
    return rao_home() / "mlflow"


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the project's SQLite file."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    mlflow_dir().mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{mlflow_dir() / 'mlflow.db'}"


def configure_mlflow(tracking_uri: str | None = None) -> str:
    """Point the mlflow client at ``tracking_uri`` (or the default) and return it."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def artifact_root() -> str:
    """Default artifact location for experiments created by the project (a local folder)."""
    p = mlflow_dir() / "artifacts"
    p.mkdir(parents=True, exist_ok=True)
    return p.as_uri()


def ensure_experiment(name: str) -> str:
    """Create the experiment if missing (artifacts under ``artifact_root()``); returns its id."""
    import mlflow

    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    uri = mlflow.get_tracking_uri()
    loc = artifact_root() if uri.startswith("sqlite") else None
    return mlflow.create_experiment(name, artifact_location=loc)


@dataclass
class MLflowServer(ServiceMixin):
    """``mlflow server`` bound to 127.0.0.1 (free port), backed by the project's SQLite file."""

    port: int = 0
    backend_uri: str | None = None
    log_dir: Path | None = None
    process: ManagedProcess | None = None

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "MLflowServer":
        self.port = self.port or free_port()
        backend = self.backend_uri or f"sqlite:///{mlflow_dir() / 'mlflow.db'}"
        mlflow_dir().mkdir(parents=True, exist_ok=True)
        cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend-store-uri", backend,
               "--default-artifact-root", artifact_root(), "--workers", "1"]
        log_dir = Path(self.log_dir or rao_home() / "services")
        self.process = ManagedProcess("mlflow", cmd, log_dir / f"mlflow-{self.port}.log",
                                      health_url=f"{self.tracking_uri}/health", start_timeout_s=120,
                                      env={"MLFLOW_DISABLE_TELEMETRY": "true"}).start()
        return self


