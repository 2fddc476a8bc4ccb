"""``rao services up|down|status``: long-lived embedded services shared by several commands.

State lives in ``$RAO_HOME/services/state.json`` (:mod:`infra.service_state`: name -> pid, url, log, started,
and the variables that point a process at the service, credentials included: the file is mode 0600). Services
started here keep running after the command exits (each in its own process group) until ``down`` stops the groups.
A name whose endpoint comes from configuration (AWS S3, a remote MLflow, a Prefect server, any
OpenAI-compatible URL) is listed as ``external`` and never started or stopped by the project.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from infra.credentials import tighten_modes
from infra.process import kill_group, pid_alive
from infra.service_state import load_state, record, save_state, state_path  # noqa: F401 (re-exported)
from rao_core.paths import rao_home


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


#: Ray's object store of ``rao services up --ray`` by default: the shards exchange small records (their trees
#: go through S3), and on a 24 GiB machine that also runs vLLM and the trainer Ray's own default (30 % of the
#: memory, in /dev/shm) would take 7 GiB of it.
RAY_OBJECT_STORE_GIB = 1.0

#: Ray's switch for a one-machine cluster (``ray._private.ray_constants.ENABLE_RAY_CLUSTER``, read when Ray is
#: imported). By default Ray takes "127.0.0.1" or "localhost" to mean "this machine" and replaces it by the host's
#: network address (``services.resolve_ip_for_localhost``) in ``ray start --node-ip-address``, in ``ray.init``'s
#: ``address`` and ``_node_ip_address``: the node is then registered under that address and its servers (GCS,
#: raylet, object manager, workers, client server, agents) listen on every interface, as does a replica's vLLM
#: server (it listens on its node's address). With "0" (Ray's default on macOS and Windows) the address stays
#: 127.0.0.1 and every one of them listens on loopback only; such a cluster takes no second machine.
RAY_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def ray_loopback() -> None:
    """Keep this process's Ray on loopback (:data:`RAY_LOOPBACK_ENV`): set the variable for Ray's import and for
    the processes started from here, and Ray's constant when Ray is imported already (its address handling reads
    the constant at each call)."""
    import sys

    os.environ.update(RAY_LOOPBACK_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def is_loopback_address(address: str) -> bool:
    """Whether a Ray address (``HOST:PORT``; ``auto``: ``RAY_ADDRESS``, else Ray's note of the cluster last
    started on this machine) names this machine's loopback interface."""
    import ipaddress
    import tempfile

    if address in ("auto", ""):
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            note = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "ray_current_cluster"
            try:
                address = note.read_text().strip()
            except OSError:
                return False
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ray_token_path() -> Path:
    """Ray's default token file, ``~/.ray/auth_token``."""
    return Path.home() / ".ray" / "auth_token"


def ensure_ray_token() -> None:
    """Make Ray's token file (:func:`ray_token_path`: 64 random hex digits, as ``ray get-auth-token --generate``
    makes it, but created mode 0600 in a folder of mode 0700) unless a token is at hand (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH`` or that file): ``ray start`` in token mode refuses to start without one. A token
    file found readable by others is made 0600. Raises ServiceError when it cannot be made."""
    import secrets

    from infra.process import ServiceError

    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or ray_token_path())
    try:
        if path.is_file():
            if path.stat().st_mode & 0o077 and path.stat().st_uid == os.getuid():
                os.chmod(path, 0o600)
            return
        if os.environ.get("RAY_AUTH_TOKEN_PATH"):
            return  # the user's path: Ray says what is missing
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    except FileExistsError:
        return
    except OSError as e:
        raise ServiceError(f"could not make Ray's token {path}: {e.strerror or e}") from None


class RayHead:
    """A local Ray head node (``ray start --head --block``) in its own process group, so that stopping the group
    stops every Ray process it started (GCS, raylet, workers). Everything it starts listens on 127.0.0.1 only
    (:data:`RAY_LOOPBACK_ENV`: the node is registered as 127.0.0.1, so its replicas' vLLM servers listen there
    too; a cluster of several machines is started with ``ray start`` by hand, docs/pipeline/ray.md). Token
    authentication is on (``RAY_AUTH_MODE=token``; the token in ``~/.ray/auth_token``, made when missing:
    :func:`ensure_ray_token`), and ``infra.ray_rollouts.connect`` sends it.

    Args:
        num_cpus: CPUs the head offers to shards (None: all of this machine's).
        object_store_gib: the object store's size, GiB (> 0).
        port: the GCS port (0: a free one).
        log_dir: where ``ray-<port>.log`` goes (default ``$RAO_HOME/logs``).
        start_timeout_s: seconds to wait for ``Ray runtime started`` in the log.
    """

    #: The ports of a head besides its GCS port (``ray start`` flags), each given: left to itself Ray binds them
    #: on the kernel's ephemeral ports (or fixed defaults, 10001 for the client server), which others may hold.
    PORT_FLAGS = ("--node-manager-port", "--object-manager-port", "--ray-client-server-port",
                  "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
                  "--metrics-export-port")

    def __init__(self, *, num_cpus: int | None = None, object_store_gib: float = RAY_OBJECT_STORE_GIB,
                 port: int = 0, log_dir: Path | None = None, start_timeout_s: float = 120.0):
        if object_store_gib <= 0 or (num_cpus is not None and num_cpus < 1):
            raise ValueError(f"a Ray head needs num_cpus >= 1 and object_store_gib > 0, got {num_cpus}, "
                             f"{object_store_gib}")
        self.fixed_port = port
        self.num_cpus = num_cpus or os.cpu_count() or 1
        self.object_store_gib = object_store_gib
        self.log_dir = log_dir
        self.start_timeout_s = start_timeout_s
        self.start_seconds = 0.0
        self._make_process()

    def _make_process(self) -> None:
        """Pick the ports (:func:`infra.process.pick_ports`: outside the kernel's ephemeral range; the GCS port
        ``port`` when given) and make the head's process (not started)."""
        import sys

        from infra.process import ManagedProcess, pick_ports

        fresh = pick_ports(len(self.PORT_FLAGS) + 1)
        self.port = self.fixed_port or fresh[0]
        self.address = f"127.0.0.1:{self.port}"
        self.ports = dict(zip(self.PORT_FLAGS, fresh[1:]))
        ray_cli = Path(sys.executable).parent / "ray"
        cmd = [str(ray_cli), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(self.port),
               "--num-cpus", str(self.num_cpus), "--object-store-memory", str(int(self.object_store_gib * 2 ** 30)),
               "--include-dashboard", "false", "--dashboard-host", "127.0.0.1", "--disable-usage-stats"]
        for flag, p in self.ports.items():
            cmd += [flag, str(p)]
        self.process = ManagedProcess(name="ray", cmd=cmd, log_path=Path(self.log_dir or rao_home() / "logs") /
                                      f"ray-{self.port}.log",
                                      env={"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                                           **RAY_LOOPBACK_ENV}, ports=(self.port, *self.ports.values()))

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> "RayHead":
        """Start the head and wait until its log says it runs; a port of it taken before it bound it (its log
        says so) starts it again on fresh ports, at most ``infra.process.PORT_ATTEMPTS`` starts (a GCS ``port``
        set by hand is kept). Raises ServiceError (one line naming the log) when it exits or does not come up
        in time (:class:`infra.process.PortInUseError`, naming the port and what holds it, when every start
        found a port taken)."""
        from infra.process import start_on_fresh_ports

        ensure_ray_token()
        first = [True]

        def once() -> "RayHead":
            if not first[0]:
                self._make_process()
            first[0] = False
            return self._start_once()

        return start_on_fresh_ports("Ray head", once, process=lambda: self.process, repick=lambda: None,
                                    repickable=lambda port: not self.fixed_port or port != self.fixed_port)

    def _start_once(self) -> "RayHead":
        from infra.process import ServiceError

        t0 = time.monotonic()
        p = self.process.start()
        deadline = t0 + self.start_timeout_s
        while True:
            text = p.log_text()
            if "Ray runtime started" in text:
                self.start_seconds = time.monotonic() - t0
                return self
            clash = p.port_clash()
            if clash is not None or not p.alive() or time.monotonic() > deadline:
                why = (f"found port {clash.port} in use" if clash is not None else
                       f"exited with code {p.proc.returncode}" if not p.alive() else
                       f"did not start within {self.start_timeout_s:.0f} s")
                p.stop()
                raise ServiceError(f"the Ray head node {why}; log {p.log_path}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the head's process group: SIGTERM, then SIGKILL after 5 s (``ray start --block`` outlives a
        SIGTERM; its GCS and raylet end at once); then :func:`forget_ray_head`."""
        self.process.stop(timeout_s=5.0)
        forget_ray_head(self.port)


def forget_ray_head(port: int) -> None:
    """Remove Ray's note of the current cluster (``$TMPDIR/ray/ray_current_cluster``, which ``ray start``
    writes and ``ray.init(address="auto")`` reads) when it names the head on ``port``: a stopped head is not
    found again by 'auto', and ``ray.init()`` starts its own cluster again."""
    import tempfile

    note = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        if note.read_text().strip().endswith(f":{port}"):
            note.unlink()
    except OSError:
        pass


def up(*, s3: bool = True, mlflow_server: bool = False, prefect_server: bool = False, prefect_port: int = 0,
       model: str | None = None, max_model_len: int = 4096, ray: bool = False, ray_cpus: int | None = None,
       ray_object_store_gib: float = RAY_OBJECT_STORE_GIB, vllm_dev_mode: bool = False) -> dict[str, dict[str, Any]]:
    """Start the requested services that are not already running (the Prefect server on ``prefect_port``,
    0 = a free port; with ``ray`` a local Ray head node, :class:`RayHead`, whose address goes to processes as
    ``RAY_ADDRESS``, which ``execution.ray_address: auto`` finds); returns the state. The vLLM server of
    ``model`` gets a fresh API key of its own, recorded with its pid and URL (``RAO_POLICY_API_KEY`` beside
    ``RAO_POLICY_BASE_URL``: clients send it to that URL only), and vLLM's development routes only with
    ``vllm_dev_mode``. Every service is started
    owner-only (``infra.credentials.owner_only``: umask 077, so its data, databases and logs are 0600 in 0700
    folders)."""
    from infra.credentials import owner_only

    owner_only()
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

        srv = MLflowServer().start()  # basic authentication: its user and password go to clients with its URL
        record("mlflow", pid=srv.pid, url=srv.tracking_uri, log=str(srv.process.log_path),
               start_s=round(srv.process.start_seconds, 2), env=srv.client_env())
    if prefect_server and not running("prefect"):
        from infra.orchestration import PrefectServer

        srv = PrefectServer(port=prefect_port).start()
        record("prefect", pid=srv.pid, url=srv.ui_url, log=str(srv.process.log_path), api_url=srv.api_url,
               start_s=round(srv.process.start_seconds, 2), env={"PREFECT_API_URL": srv.api_url})
    if ray and not running("ray"):
        head = RayHead(num_cpus=ray_cpus, object_store_gib=ray_object_store_gib).start()
        record("ray", pid=head.pid, url=head.address, log=str(head.process.log_path), cpus=head.num_cpus,
               object_store_gib=ray_object_store_gib, start_s=round(head.start_seconds, 2),
               env={"RAY_ADDRESS": head.address, "RAY_AUTH_MODE": "token", **RAY_LOOPBACK_ENV})
    if model and not running("vllm"):
        import secrets

        from infra.serving import VLLMServer

        # a key of its own (recorded in the owner-only state file): the key of a campaign's servers opens not it
        srv = VLLMServer(model, max_model_len=max_model_len, api_key=secrets.token_hex(32),
                         dev_mode=vllm_dev_mode).start()
        record("vllm", pid=srv.pid, url=srv.base_url, log=str(srv.process.log_path), model=str(model),
               start_s=round(srv.process.start_seconds, 2),
               env={"RAO_POLICY_BASE_URL": srv.base_url, "RAO_POLICY_MODEL": srv.model,
                    "RAO_POLICY_API_KEY": srv.api_key})
    return load_state()


def prefect_instructions(pool: str = "rao-pool") -> list[str]:
    """How to use the running Prefect server of ``up``: UI, ``PREFECT_API_URL`` and the worker command
    (empty when none runs)."""
    from infra.orchestration import worker_command

    info = load_state().get("prefect") or {}
    if not (info.get("pid") and pid_alive(info["pid"])):
        return []
    from infra.credentials import service_secret_file

    api = info.get("api_url") or info.get("env", {}).get("PREFECT_API_URL", "")
    return [f"Prefect UI:       {info.get('url', '')}", f"PREFECT_API_URL:  {api}",
            f"UI password:      the contents of {service_secret_file('prefect')}",
            "deployments:      .venv/bin/rao deploy   (rao commands find the server by themselves)",
            f"worker:           {worker_command(api, pool)}"]


def mlflow_instructions() -> list[str]:
    """How to sign in to the running MLflow server of ``up`` (empty when none runs): its URL, the user and the
    file holding the password (never the password itself)."""
    from infra.tracking import MLFLOW_USER

    info = load_state().get("mlflow") or {}
    if not (info.get("pid") and pid_alive(info["pid"])):
        return []
    from infra.credentials import service_secret_file

    return [f"MLflow UI:        {info.get('url', '')}",
            f"MLflow login:     user {MLFLOW_USER}, password: the contents of {service_secret_file('mlflow')}"]


def down() -> list[str]:
    """Stop every service recorded in the state file; returns the names stopped."""
    stopped = []
    for name, info in load_state().items():
        pid = info.get("pid")
        if pid and pid_alive(pid):
            kill_group(pid, 5.0 if name == "ray" else 15.0)  # `ray start --block` outlives a SIGTERM
            if name == "ray":
                forget_ray_head(int(str(info.get("url", ":0")).rsplit(":", 1)[-1]))
            stopped.append(name)
    save_state({})
    if "s3" in stopped:  # SeaweedFS wrote its volumes' .vif files 0644 as it stopped (infra.storage.SeaweedFSServer.stop)
        tighten_modes(rao_home() / "services")
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
