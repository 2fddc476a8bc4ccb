"""Prefect: the local ephemeral API by default, or a ``prefect server start`` for the UI.

- Embedded default: no ``PREFECT_API_URL``; each process runs Prefect's ephemeral API (about 20 s to
  start) with its state in ``$RAO_HOME/prefect`` (``PREFECT_HOME``).
- ``PrefectServer``: ``prefect server start`` on 127.0.0.1 (a free port outside the kernel's ephemeral
  range, or a fixed one) for the UI and
  deployments; processes pointed at it with ``PREFECT_API_URL``; :func:`worker_command` is what to run.
- :func:`deploy`: ``prefect deploy --all`` in the repository root, so each deployment's pull step holds
  the repository's absolute path (``prefect.yaml``) and a worker can run it.
- Real mode: set ``PREFECT_API_URL`` (and ``PREFECT_API_KEY`` for Prefect Cloud).

Both embedded APIs (the ephemeral one and ``PrefectServer``) require Prefect's basic authentication: the server
setting ``PREFECT_SERVER_API_AUTH_STRING`` is the installation's Prefect credential
(:func:`infra.credentials.service_secret`), and the project's own clients send it as ``PREFECT_API_AUTH_STRING``
(:func:`configure_prefect`), only to those APIs: never to a ``PREFECT_API_URL`` of the user's own choosing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.credentials import service_secret, service_secret_file
from infra.process import ManagedProcess, ServiceError, ServiceMixin, pick_ports, port_is_free, start_on_a_fresh_port
from rao_core.paths import REPO_ROOT, rao_home


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


def prefect_auth() -> str:
    """The auth string of the project's embedded Prefect APIs: the installation's Prefect credential."""
    return service_secret("prefect")


def own_api(api_url: str | None) -> bool:
    """Whether ``api_url`` is a Prefect API of this installation: none (the ephemeral API each process starts)
    or the server of ``rao services up --prefect-server`` (recorded in the services' state)."""
    if not api_url:
        return True
    from infra.service_state import load_state

    recorded = (load_state().get("prefect") or {}).get("api_url", "")
    return bool(recorded) and recorded.rstrip("/") == api_url.rstrip("/")


def configure_prefect() -> None:
    """Apply ``prefect_env()`` defaults to this process before ``import prefect``, and the embedded APIs'
    authentication: ``PREFECT_SERVER_API_AUTH_STRING`` (the ephemeral API started here requires it) and, when the
    API is the installation's own (:func:`own_api`), ``PREFECT_API_AUTH_STRING`` for this process's clients and
    its children (a value set by the user is kept). Prefect's settings are read again when Prefect was imported
    already."""
    for k, v in prefect_env().items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("PREFECT_SERVER_API_AUTH_STRING", prefect_auth())
    api = os.environ.get("PREFECT_API_URL")
    if not api:  # the ephemeral API this process starts
        os.environ.setdefault("PREFECT_API_AUTH_STRING", os.environ["PREFECT_SERVER_API_AUTH_STRING"])
    elif own_api(api):
        os.environ.setdefault("PREFECT_API_AUTH_STRING", prefect_auth())
    import sys

    context = sys.modules.get("prefect.context")
    if context is not None and hasattr(context, "refresh_global_settings_context"):
        context.refresh_global_settings_context()


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
        """Start ``prefect server start`` and wait for its health check. A port picked here (``port`` 0) that was
        taken before the server bound it restarts it on a fresh one, at most ``infra.process.PORT_ATTEMPTS``
        starts. Raises ServiceError: a ``port`` set by hand in use, a server that does not come up (its log
        named; :class:`infra.process.PortInUseError` when every start found its port taken)."""
        if self.port and not port_free(self.port):
            raise ServiceError(f"Prefect server: port {self.port} on 127.0.0.1 is in use "
                               "(choose another --prefect-port)")
        return start_on_a_fresh_port("Prefect server", self, self.port)

    def _start_once(self) -> "PrefectServer":
        self.port = self.port or pick_ports(1)[0]
        cmd = [prefect_bin(), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)]
        log_dir = Path(self.log_dir or rao_home() / "services")
        env = {k: v for k, v in prefect_env().items()}
        env["PREFECT_API_URL"] = self.api_url
        env["PREFECT_SERVER_API_AUTH_STRING"] = env["PREFECT_API_AUTH_STRING"] = prefect_auth()
        self.process = ManagedProcess("prefect", cmd, log_dir / f"prefect-{self.port}.log",
                                      health_url=f"{self.api_url}/health", start_timeout_s=180, env=env,
                                      ports=(self.port,))
        self.process.start()
        return self


def port_free(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:``port`` (so a server can bind it): :func:`infra.process.port_is_free`."""
    return port_is_free(port)


def prefect_bin() -> str:
    """The ``prefect`` executable of this environment."""
    return str(Path(sys.executable).parent / "prefect")


def auth_prefix(api_url: str | None) -> str:
    """What a pasted shell command against ``api_url`` needs before ``prefect``: for the installation's own
    server (:func:`own_api`), ``PREFECT_API_AUTH_STRING="$(cat FILE)" `` reading the auth string from its file of
    mode 0600 (:func:`infra.credentials.service_secret_file`), which the command shows by name only; else
    nothing (another API brings its own credentials)."""
    import shlex

    if api_url and own_api(api_url):
        return f'PREFECT_API_AUTH_STRING="$(cat {shlex.quote(str(service_secret_file("prefect")))})" '
    return ""


def worker_command(api_url: str, pool: str = "rao-pool") -> str:
    """A ready-to-paste shell command that starts a process worker on ``pool`` against ``api_url``, with the auth
    string of the installation's own server (:func:`auth_prefix`)."""
    return f"PREFECT_API_URL={api_url} {auth_prefix(api_url)}{prefect_bin()} worker start --pool {pool}"


def check_api(api_url: str | None, timeout_s: float = 5.0) -> str:
    """``api_url`` if a Prefect API answers its health check there; else :class:`ServiceError` naming it
    (no URL at all: how to start a server)."""
    import httpx

    if not api_url:
        raise ServiceError("no Prefect server: run `rao services up --prefect-server` first (or set "
                           "PREFECT_API_URL)")
    try:
        httpx.get(f"{api_url.rstrip('/')}/health", timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as e:
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ServiceError(f"the Prefect API at {api_url} does not answer ({reason}): start it with `rao services "
                           "up --prefect-server` or fix PREFECT_API_URL") from None
    return api_url


def deploy(pool: str = "rao-pool", repo: Path | None = None) -> int:
    """Create work pool ``pool`` and the deployments of ``prefect.yaml`` on it, on the server at
    ``PREFECT_API_URL``; returns ``prefect deploy``'s exit status.

    ``prefect deploy`` runs in the repository root, whose absolute path (or ``repo``, given to the build
    step as ``RAO_REPO``) becomes the deployments' working directory on the worker. The deployments of
    ``prefect.yaml`` name no work pool: ``pool`` reaches them as Prefect's default pool
    (``PREFECT_DEPLOYMENTS_DEFAULT_WORK_POOL_NAME``), since ``prefect deploy --all`` ignores ``--pool``.
    """
    env = {**os.environ, "PREFECT_DEPLOYMENTS_DEFAULT_WORK_POOL_NAME": pool,
           **({"RAO_REPO": str(Path(repo).resolve())} if repo else {})}
    subprocess.run([prefect_bin(), "work-pool", "create", pool, "--type", "process", "--overwrite"], check=False,
                   cwd=REPO_ROOT, env=env)
    return subprocess.run([prefect_bin(), "--no-prompt", "deploy", "--all"], check=False, cwd=REPO_ROOT,
                          env=env).returncode


class RunBusyError(ServiceError):
    """Another live process runs the same campaign (or evaluation): the message names it in one line."""


#: Prefect states of a flow run that has not ended.
LIVE_STATES = ("RUNNING", "PENDING", "PAUSED", "CANCELLING", "SCHEDULED")


def crash_flow_runs(flow_run_id: str, message: str, depth: int = 3) -> list[str]:
    """Set CRASHED (forced, with ``message``) flow run ``flow_run_id`` and its subflow runs down to ``depth``
    levels, those still in a live state (:data:`LIVE_STATES`): runs whose process was killed, which no engine
    will end. Returns the names of the runs marked. Raises the Prefect client's errors."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId
    from prefect.states import Crashed

    marked: list[str] = []
    with get_client(httpx_settings={"timeout": 10.0}, sync_client=True) as client:
        ids = [flow_run_id]
        for _ in range(depth + 1):
            if not ids:
                break
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
            for r in runs:
                if r.state is not None and r.state.type.value in LIVE_STATES:
                    client.set_flow_run_state(r.id, Crashed(message=message), force=True)
                    marked.append(r.name)
            ids = [r.id for r in client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=ids)))]
    return marked


def take_over_run(record_path: Path, what: str) -> str | None:
    """Claim ``what`` (e.g. ``campaign 'smoke'``) for the current Prefect flow run and this process, recorded at
    ``record_path`` (pid, start time, flow run id and name: ``rao_core.process_group.process_record``).

    The run recorded before: when its process still runs (another process than this one), raises
    :class:`RunBusyError` naming it; when it is gone but its flow run (or a subflow run) is still live in Prefect
    (the process was killed: SIGKILL, out of memory), marks them CRASHED (:func:`crash_flow_runs`) and returns
    the line saying so; else None. A Prefect API that fails the marking is said in the returned line, never
    raised."""
    from prefect.runtime import flow_run

    from rao_core.process_group import process_record, read_record, same_process, write_record

    prev = read_record(record_path)
    me = str(flow_run.id or "")
    if prev and same_process(prev) and int(prev["pid"]) != os.getpid():
        raise RunBusyError(f"{what} is already running in process {prev['pid']} (Prefect flow run "
                           f"{prev.get('flow_run_name') or prev.get('flow_run_id')}): stop it first, or wait for it")
    write_record(record_path, process_record(os.getpid(), flow_run_id=me, flow_run_name=flow_run.name or ""))
    old = str((prev or {}).get("flow_run_id") or "")
    if not old or old == me or int(prev.get("pid", 0)) == os.getpid():
        return None
    why = f"its process (pid {prev.get('pid')}) ended without reporting an end (killed)"
    try:
        marked = crash_flow_runs(old, why)
    except Exception as e:  # noqa: BLE001 - the run goes on; the line says what could not be marked
        return (f"the earlier run of {what} (Prefect flow run {prev.get('flow_run_name') or old}) could not be "
                f"marked CRASHED: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
    if not marked:
        return None
    return (f"the earlier run of {what} was killed (pid {prev.get('pid')}): Prefect flow "
            f"run{'s' * (len(marked) > 1)} {', '.join(marked)} marked CRASHED")
