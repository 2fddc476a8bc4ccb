"""Prefect task ``serve_checkpoint``: start or re-point the vLLM policy server at a checkpoint.

The server is process-wide (one per flow run) and stopped by :func:`shutdown_server` when the flow ends.
A flow run stopped from outside (cancelled from the UI, its process killed by the worker) ends without
reaching that ``finally``: the flows therefore carry :data:`STOP_SERVER_HOOKS`, whose
:func:`stop_flow_servers` stops the server from the flow's own process or, when Prefect runs the hook in
the worker's process, from the record each start leaves under ``$RAO_HOME/services/flow-runs/``.
Switching (``serving.switch``): ``reload`` copies the new weight files over the served folder and
reloads them in place (dev-mode ``reload_weights``, no restart); ``restart`` restarts the server;
``lora`` hot-loads the adapter under a new name. An external ``serving.base_url`` gets each LoRA adapter
through its ``/v1/load_lora_adapter`` route; with ``none`` it keeps its weights; it cannot be given full
weights (refused at config load, and here when the base URL came from RAO_POLICY_BASE_URL).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from rao_core.paths import rao_home
from rao_core.train.checkpoint import is_checkpoint, is_lora_checkpoint
from tasks.common import RunContext, fetch_dir, run_logger
from tasks.records import Checkpoint, ServedEndpoint

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"server": None, "served": None, "lora": None}


def checkpoint_local(ctx: RunContext, ckpt: Checkpoint) -> Path:
    """Local folder of checkpoint ``ckpt``: its own folder when complete, else a copy of its S3 prefix."""
    if ckpt.local and is_checkpoint(ckpt.local):
        return Path(ckpt.local)
    if not ckpt.uri:
        raise FileNotFoundError(f"checkpoint {ckpt.name} has neither a local folder nor an S3 URI")
    return fetch_dir(ctx, ckpt.uri, f"checkpoints/{ckpt.name}")


def _lora_base(adapter: Path) -> Path:
    """The base model folder of a LoRA checkpoint (``base_model_name_or_path`` of its adapter_config.json)."""
    import json

    base = Path(json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path") or "")
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"LoRA checkpoint {adapter}: its base model {base} has no config.json")
    return base


def _copy_weights(src: Path, dst: Path) -> None:
    """Copy checkpoint files into the served folder, each file replaced atomically."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file():
            tmp = dst / f".{p.name}.tmp"
            shutil.copy2(p, tmp)
            tmp.replace(dst / p.name)


@task(name="serve-checkpoint", cache_policy=NONE, retries=1, retry_delay_seconds=5)
def serve_checkpoint(ctx: RunContext, ckpt: Checkpoint) -> ServedEndpoint:
    """Start or re-point the vLLM service at ``ckpt``; returns its URL and served model name."""
    cfg = ctx.config.serving
    if cfg.base_url:
        return _serve_external(ctx, ckpt)
    from infra.serving import VLLMServer, server_from_config

    with _LOCK:
        t0 = time.monotonic()
        src = checkpoint_local(ctx, ckpt)
        server: VLLMServer | None = _STATE["server"]
        if server is not None and not server.alive():  # died (killed, crashed): a fresh one is started
            forget_server(server.pid)
            server, _STATE["server"] = None, None
            _STATE.update(served=None, lora=None)
        if server is not None and _STATE["served"] == ckpt.name:
            return ServedEndpoint(base_url=server.base_url, model=_STATE["lora"] or server.model, how="same")
        served_dir = ctx.local("served")
        lora = is_lora_checkpoint(src)
        how = "start"
        if server is None:  # a LoRA checkpoint (a resumed campaign): start on its base model, then load it
            base = _lora_base(src) if lora else src
            if served_dir.exists():
                shutil.rmtree(served_dir)
            _copy_weights(base, served_dir)
            server = server_from_config(ctx.config, served_dir, log_dir=ctx.local("logs"))
            server.on_progress = run_logger().info  # its phases, from its log: minutes on a CPU
            server.start()
            _STATE["server"] = server
            record_server(server.pid, base_url=server.base_url)
            if lora:
                server.load_lora(ckpt.name, src)
                _STATE["lora"], how = ckpt.name, "start+lora"
        elif cfg.switch == "lora" and lora:
            server.load_lora(ckpt.name, src)
            _STATE["lora"] = ckpt.name
            how = "lora"
        elif cfg.switch == "reload":
            _copy_weights(src, served_dir)
            server.reload_weights()
            how = "reload"
        else:
            old_pid = server.pid
            server.stop()
            forget_server(old_pid)
            _copy_weights(src, served_dir)
            server.on_progress = run_logger().info
            server.start()
            record_server(server.pid, base_url=server.base_url)
            how = "restart"
        _STATE["served"] = ckpt.name
        model = _STATE["lora"] if how in ("lora", "start+lora") else server.model
        phases = dict(server.start_phases) if how in ("start", "start+lora", "restart") else {}
        return ServedEndpoint(base_url=server.base_url, model=model, switch_s=round(time.monotonic() - t0, 3), how=how,
                              start_phases=phases)


def _serve_external(ctx: RunContext, ckpt: Checkpoint) -> ServedEndpoint:
    """An external server (``serving.base_url``): LoRA checkpoints are loaded through its API; full weights
    only for the first checkpoint it is asked for (the one it already serves)."""
    from infra.serving import load_lora_adapter
    from infra.process import ServiceError
    from rao_core.config import external_switch_problem

    cfg = ctx.config.serving
    t0 = time.monotonic()
    with _LOCK:
        _STATE["served"] = _STATE["served"] or ckpt.name  # the checkpoint the server already serves
        model, how = cfg.served_model_name, "external"
        if cfg.switch == "lora":
            src = checkpoint_local(ctx, ckpt)
            if is_lora_checkpoint(src):
                load_lora_adapter(cfg.base_url, ckpt.name, src.resolve())
                model, how = ckpt.name, "external-lora"
        elif cfg.switch != "none" and ckpt.name != _STATE["served"]:
            raise ServiceError(external_switch_problem(ctx.config.model_copy(update={"iterations": 1})))
    return ServedEndpoint(base_url=cfg.base_url, model=model, switch_s=round(time.monotonic() - t0, 3), how=how)


@contextlib.contextmanager
def gpus_released(ctx: RunContext):
    """While the body runs (the trainer), the flow's vLLM server sleeps when ``gpus.sleep_while_training``
    (level 1: weights to CPU memory, KV cache freed); it wakes afterwards, also on failure."""
    server = _STATE["server"]
    if not ctx.config.gpus.sleep_while_training or server is None or not server.alive():
        yield
        return
    server.sleep(level=1)
    try:
        yield
    finally:
        server.wake_up()


def server_diagnosis(ctx: RunContext) -> str:
    """What is known of the policy server this process serves from, for an error line: ``the vLLM server
    (pid P) exited with status -9 (SIGKILL); log F``, ``the vLLM server (pid P) still runs; log F``, ``the
    external policy server URL`` (``serving.base_url``), or that none was started. Never raises."""
    import signal

    try:
        if ctx.config.serving.base_url:
            return f"the external policy server {ctx.config.serving.base_url} (serving.base_url)"
        server = _STATE["server"]
        proc = getattr(server, "process", None)
        if server is None or proc is None or proc.proc is None:
            return "no vLLM server was started by this process"
        rc = proc.proc.poll()
        if rc is None:
            state = "still runs (it failed requests)"
        else:
            name = f" ({signal.Signals(-rc).name})" if rc < 0 and -rc in {s.value for s in signal.Signals} else ""
            state = f"exited with status {rc}{name}"
        return f"the vLLM server (pid {proc.proc.pid}) {state}; log {proc.log_path}"
    except Exception as e:  # noqa: BLE001 - a diagnosis never hides the failure it explains
        return f"the policy server's state is unknown ({type(e).__name__}: {e})"


def shutdown_server() -> None:
    """Stop the flow's vLLM server, if any (and drop its record)."""
    with _LOCK:
        if _STATE["server"] is not None:
            pid = _STATE["server"].pid
            _STATE["server"].stop()
            forget_server(pid)
        _STATE.update(server=None, served=None, lora=None)


def server_records_dir() -> Path:
    """Folder of the records of running flow-started vLLM servers (``<pid>.json``), ``$RAO_HOME/services/flow-runs``."""
    return rao_home() / "services" / "flow-runs"


def _flow_run_ids() -> list[str]:
    """The current Prefect flow run, its parent and its root (empty outside a flow run): a hook on any of
    them finds the server (the campaign's iterations are subflows; a campaign may run inside the experiment)."""
    from prefect.runtime import flow_run

    ids = [flow_run.id]
    try:  # each is an API call; the flow run's own id is enough for the flow that started the server
        ids += [flow_run.parent_flow_run_id, flow_run.root_flow_run_id]
    except Exception:  # noqa: BLE001 - an unreachable API only narrows the record
        pass
    return list(dict.fromkeys(str(i) for i in ids if i))


def record_server(pid: int | None, *, base_url: str = "", flow_run_ids: list[str] | None = None) -> Path | None:
    """Record a vLLM server the current flow run started, so that :func:`stop_flow_servers` can stop it from
    another process: ``server_records_dir()/<pid>.json`` with the pid, the process's start time (psutil's
    ``create_time``, seconds since the epoch: a pid reused by another process is never stopped), the URL and
    ``flow_run_ids`` (default: the current flow run, its parent and root). Returns the record's path, or None
    outside a flow run or when the process is already gone."""
    import psutil

    ids = flow_run_ids if flow_run_ids is not None else _flow_run_ids()
    if not pid or not ids:
        return None
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    from rao_core.jsonl import atomic_path

    path = server_records_dir() / f"{pid}.json"
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps({"pid": pid, "create_time": created, "base_url": base_url,
                                         "flow_run_ids": ids}))
    return path


def forget_server(pid: int | None) -> None:
    """Drop the record of server ``pid`` (it was stopped the ordinary way)."""
    if pid:
        (server_records_dir() / f"{pid}.json").unlink(missing_ok=True)


def stop_recorded_servers(flow_run_id: str) -> list[int]:
    """Stop (process group: SIGTERM, then SIGKILL) every recorded vLLM server of flow run ``flow_run_id``
    that still runs as the process recorded (same pid and start time); drop their records and those of
    servers already gone. Returns the pids stopped."""
    import psutil

    from infra.process import kill_group

    stopped: list[int] = []
    folder = server_records_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if flow_run_id not in rec.get("flow_run_ids", []):
            continue
        pid = int(rec["pid"])
        try:
            same = abs(psutil.Process(pid).create_time() - float(rec["create_time"])) < 1.0
        except psutil.Error:
            same = False
        if same:
            kill_group(pid)
            stopped.append(pid)
        path.unlink(missing_ok=True)
    return stopped


def stop_flow_servers(flow: Any, flow_run: Any, state: Any) -> list[int]:
    """Prefect state hook (``on_cancellation``, ``on_crashed``): stop the vLLM server(s) the flow run started.

    In the flow's own process the live server is stopped (:func:`shutdown_server`); in any process (Prefect
    runs a cancelled or crashed run's hooks in the worker's runner when the flow process is gone) the servers
    recorded for ``flow_run.id`` (:func:`record_server`) are stopped. Never raises: a hook must not hide the
    flow's own state. Returns the pids stopped.
    """
    log = logging.getLogger("rao")
    stopped: list[int] = []
    try:
        server = _STATE["server"]
        if server is not None and server.alive():
            stopped.append(server.pid)
        shutdown_server()
        stopped += [p for p in stop_recorded_servers(str(flow_run.id)) if p not in stopped]
        log.info(f"flow run {getattr(flow_run, 'name', flow_run.id)} {getattr(state, 'name', '')}: vLLM servers "
                 f"stopped: {', '.join(map(str, stopped)) or 'none'}")
    except Exception as e:  # noqa: BLE001 - reported, never raised
        log.warning(f"could not stop the flow run's vLLM server: {type(e).__name__}: {e}")
    return stopped


STOP_SERVER_HOOKS = {"on_cancellation": [stop_flow_servers], "on_crashed": [stop_flow_servers]}
