"""Prefect: the local ephemeral API by default, or a ``prefect server start`` for the UI.

- Embedded default: no ``PREFECT_API_URL``; each process runs Prefect's ephemeral API (about 20 s to
  start) with its state in ``$RAO_HOME/prefect`` (``PREFECT_HOME``).
- ``PrefectServer``: ``prefect server start`` on 127.0.0.1 (free port) for the UI and deployments;
  processes pointed at it with ``PREFECT_API_URL``.
- Real mode: set ``PREFECT_API_URL`` (and ``PREFECT_API_KEY`` for Prefect Cloud).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.process import ServiceMixin, ManagedProcess, free_port
from rao_core.paths import rao_home


def prefect_env() -> dict[str, str]:
    """Variables every Prefect process of the project gets (project-local home, no analytics)."""
    home = rao_home() / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": os.environ.get("PREFECT_LOGGING_LEVEL", "INFO"),  # stage progress in the console
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    }


def configure_prefect() -> None:
    """Apply ``prefect_env()`` defaults to this process before ``import prefect``."""
    for k, v in prefect_env().items():
        os.environ.setdefault(k, v)


@dataclass
class PrefectServer(ServiceMixin):
    """``prefect server start`` on 127.0.0.1 with the UI; ``api_url`` for clients and workers."""

    port: int = 0
    log_dir: Path | None = None
    process: ManagedProcess | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "PrefectServer":
        self.port = self.port or free_port()
        cmd = [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
               "--port", str(self.port)]
        log_dir = Path(self.log_dir or rao_home() / "services")
        env = {k: v for k, v in prefect_env().items()}
        env["PREFECT_API_URL"] = self.api_url
        self.process = ManagedProcess("prefect", cmd, log_dir / f"prefect-{self.port}.log",
                                      health_url=f"{self.api_url}/health", start_timeout_s=180, env=env).start()
        return self


