"""Prefect task ``serve_checkpoint``: start or re-point the vLLM policy server pool at a checkpoint.

The pool (``serving.replicas`` vLLM servers, 1 by default) is process-wide (one per flow run) and
stopped by :func:`shutdown_server` when the flow ends.
A flow run stopped from outside (cancelled from the UI, its process killed by the worker) ends without
reaching that ``finally``: the flows therefore carry :data:`STOP_SERVER_HOOKS`, whose
:func:`stop_flow_servers` stops the server from the flow's own process or, when Prefect runs the hook in
the worker's process, from the record each start leaves under ``$RAO_HOME/services/flow-runs/``.
Switching (``serving.switch``): ``reload`` copies the new weight files over the served folder and
reloads them in place (dev-mode ``reload_weights``, no restart); ``restart`` restarts the server;
``lora`` hot-loads the adapter under a new name. An external ``serving.base_url`` gets each LoRA adapter
through its ``/v1/load_lora_adapter`` route; with ``none`` it keeps its weights; it cannot be given full
weights (refused at config load, and here when the base URL came from RAO_POLICY_BASE_URL).

A pool of replicas: every replica serves the same folder and switches at the same time; the stage returns
only once each of them lists the new model or adapter on ``GET /v1/models``, and fails naming the replicas
that did not. A replica that died (found at the next switch) is started again; during a stage, the rollouts'
``rao_core.policies.pool.PolicyPool`` takes an unreachable replica out and the others go on. The replicas are
processes of the flow on its machine, or, with ``execution.backend: ray`` (``execution.ray_replicas``), Ray
actors placed by Ray where the resources are (``infra/ray_serving.py``); external servers are listed in
``serving.base_urls``.
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
from infra.stage_io import RunContext, fetch_dir, run_logger
from infra.stage_records import Checkpoint, ServedEndpoint, ServedReplica

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"servers": [], "served": None, "lora": None}  # servers: the pool, replica order


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
    """Start or re-point the policy server pool (``serving.replicas`` vLLM servers, or the external servers of
    ``serving.base_url(s)``) at ``ckpt``; returns when every replica reports it (:func:`_switch_pool`).

    Raises ServiceError (one line naming each replica that failed) when a replica cannot be started or
    switched; the replicas that did switch keep running (the task's retry, or :func:`shutdown_server`)."""
    if ctx.config.serving.external_urls:
        return _serve_external(ctx, ckpt)
    with _LOCK:
        return _switch_pool(ctx, ckpt)


def _switch_pool(ctx: RunContext, ckpt: Checkpoint) -> ServedEndpoint:
    """The switch of every replica of the flow's pool to ``ckpt`` (the caller holds ``_LOCK``).

    Every replica serves one folder, ``served`` under the campaign's local folder. A pool not started yet (or
    whose replicas all died) is started on ``ckpt`` (a LoRA checkpoint: on its base model, then the adapter
    loaded); otherwise, by ``serving.switch``: ``lora`` loads the adapter on each replica; ``reload`` copies the
    weights over the served folder once and reloads them in every replica; ``restart`` stops every replica,
    copies, starts them again. A replica that died since the last switch is started again (a new process on a
    new port) on the served folder, with the adapter when one is served. The replicas switch at the same time
    (one thread each); then each must list the served model (and the adapter) on ``GET /v1/models``.
    """
    from concurrent.futures import ThreadPoolExecutor

    from infra.process import ServiceError
    from infra.serving import has_cuda_gpu, served_models, server_from_config

    cfg = ctx.config.serving
    t0 = time.monotonic()
    log = run_logger()  # a start's phases, from the server's log: minutes on a CPU
    src = checkpoint_local(ctx, ckpt)
    lora = is_lora_checkpoint(src)
    served_dir = ctx.local("served")
    servers: list = _STATE["servers"]
    if servers and not any(s.alive() for s in servers):  # all died (killed, crashed): a fresh pool
        for s in servers:
            s.stop()  # what is left of it: its process group, a Ray actor
            forget_server(s.pid)
        servers = []
        _STATE.update(servers=[], served=None, lora=None)

    ex = ctx.config.execution
    on_ray = ex.backend == "ray" and ex.ray_replicas
    gpus = None  # None: the replicas start here, on GPUs if this host has one (infra.serving.has_cuda_gpu)
    if on_ray:
        from infra.ray_serving import RayReplica, check_placement
        from infra.ray_rollouts import connect

        resources = connect(ex.ray_address)
        gpus = resources.get("GPU", 0) > 0  # a cluster with GPUs: each replica asks for its own
        k = cfg.tensor_parallel_size * cfg.data_parallel_size
        check_placement(cfg.replicas, ex.cpus_per_replica, k if gpus else 0, ex.cpus_per_shard)

    def new(i: int):
        if not on_ray:
            return server_from_config(ctx.config, served_dir, log_dir=ctx.local("logs"), replica=i)
        server = server_from_config(ctx.config, served_dir, log_dir=ctx.local("logs"), replica=i, on_gpu=gpus)
        return RayReplica.of(server, index=i, num_cpus=ex.cpus_per_replica, num_gpus=k if gpus else 0)

    jobs: dict[int, str] = {}  # replica -> what it does: start, start+lora, same, lora, reload, restart
    if not servers:
        base = _lora_base(src) if lora else src
        if served_dir.exists():
            shutil.rmtree(served_dir)
        _copy_weights(base, served_dir)
        servers = [new(i) for i in range(cfg.replicas)]
        _STATE.update(servers=servers, lora=None)  # before they start: shutdown_server stops whatever did
        adapter = ckpt.name if lora else None
        jobs = {i: "start+lora" if adapter else "start" for i in range(len(servers))}
    else:
        alive = [i for i, s in enumerate(servers) if s.alive()]
        for i in (i for i in range(len(servers)) if i not in alive):  # a lost replica: a new process
            servers[i].stop()  # what is left of it: its process group, a Ray actor
            forget_server(servers[i].pid)
            servers[i] = new(i)
        if _STATE["served"] == ckpt.name:
            how, adapter = "same", _STATE["lora"]
        elif cfg.switch == "lora" and lora:
            how, adapter = "lora", ckpt.name
        elif cfg.switch == "reload":
            _copy_weights(src, served_dir)
            how, adapter = "reload", None
        else:
            for i in alive:
                servers[i].stop()
                forget_server(servers[i].pid)
            _copy_weights(src, served_dir)
            how, adapter = "restart", None
        jobs = {i: how if i in alive else ("start+lora" if adapter else "start") for i in range(len(servers))}

    starts = any(j in ("start", "start+lora", "restart") for j in jobs.values())
    run_ids = _flow_run_ids() if starts else []  # here: the starts run in threads, which do not see the flow run

    def run(i: int) -> ServedReplica:
        server, job, t = servers[i], jobs[i], time.monotonic()
        if job in ("start", "start+lora", "restart"):
            n = len(servers)
            server.on_progress = log.info if n == 1 else (lambda line: log.info(f"replica {i + 1}/{n}: {line}"))
            server.start()
            if not getattr(server, "placed_by_ray", False):  # an actor's server: the actor's guard stops it
                record_server(server.pid, base_url=server.base_url, flow_run_ids=run_ids)
        if job == "reload":
            server.reload_weights()
        if job in ("start+lora", "lora"):
            server.load_lora(adapter, src)
        models = served_models(server.base_url)
        want = adapter or server.model
        if want not in models:
            raise ServiceError(f"serves {models}, not {want!r}")
        return ServedReplica(index=i, base_url=server.base_url, checkpoint=ckpt.name, how=job,
                             switch_s=round(time.monotonic() - t, 3), pid=server.pid, models=models)

    reports, failed = [], []
    with ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="rao-switch") as pool:
        futures = [pool.submit(run, i) for i in range(len(servers))]
        for i, f in enumerate(futures):
            try:
                reports.append(f.result())
            except Exception as e:  # noqa: BLE001 - every replica's failure is named
                failed.append(f"replica {i + 1}/{len(servers)} ({_where(servers[i])}): {type(e).__name__}: "
                              + " ".join(str(e).split())[:300])
    if failed:
        _STATE["served"] = None  # a retry switches every replica again
        raise ServiceError(f"checkpoint {ckpt.name} did not reach every policy server replica: " + "; ".join(failed))
    _STATE["served"], _STATE["lora"] = ckpt.name, adapter
    hows = sorted({r.how for r in reports})
    started = [servers[r.index].start_phases for r in reports if r.how in ("start", "start+lora", "restart")]
    seeded = cfg.request_seeds if cfg.request_seeds is not None else bool(has_cuda_gpu() if gpus is None else gpus)
    return ServedEndpoint(base_url=reports[0].base_url, base_urls=[r.base_url for r in reports],
                          model=adapter or servers[0].model, switch_s=round(time.monotonic() - t0, 3),
                          how="+".join(hows), replicas=reports, start_phases=dict(started[0]) if started else {},
                          seeded=seeded)


def _where(server) -> str:
    """A replica for a message: its URL once it has a port, else its log folder."""
    return server.base_url if getattr(server, "port", 0) else "not started"


def _serve_external(ctx: RunContext, ckpt: Checkpoint) -> ServedEndpoint:
    """External servers (``serving.base_url`` or the pool ``serving.base_urls``): LoRA checkpoints are loaded
    through each one's API (every replica gets the adapter before this returns); full weights only for the
    first checkpoint they are asked for (the one they already serve). Raises ServiceError naming the replicas
    that did not take the adapter."""
    from infra.serving import load_lora_adapter
    from infra.process import ServiceError
    from rao_core.config import external_switch_problem

    cfg = ctx.config.serving
    urls = cfg.external_urls
    t0 = time.monotonic()
    with _LOCK:
        _STATE["served"] = _STATE["served"] or ckpt.name  # the checkpoint the servers already serve
        model, how = cfg.served_model_name, "external"
        if cfg.switch == "lora":
            src = checkpoint_local(ctx, ckpt)
            if is_lora_checkpoint(src):
                failed = []
                for i, url in enumerate(urls):
                    try:
                        load_lora_adapter(url, ckpt.name, src.resolve())
                    except ServiceError as e:
                        failed.append(f"replica {i + 1}/{len(urls)}: {e}" if len(urls) > 1 else str(e))
                if failed:
                    raise ServiceError("; ".join(failed))
                model, how = ckpt.name, "external-lora"
        elif cfg.switch != "none" and ckpt.name != _STATE["served"]:
            raise ServiceError(external_switch_problem(ctx.config.model_copy(update={"iterations": 1})))
    dt = round(time.monotonic() - t0, 3)
    return ServedEndpoint(base_url=urls[0], base_urls=list(urls) if len(urls) > 1 else [], model=model,
                          switch_s=dt, how=how, seeded=cfg.request_seeds is not False,
                          replicas=[ServedReplica(index=i, base_url=u, checkpoint=ckpt.name, how=how)
                                    for i, u in enumerate(urls)] if len(urls) > 1 else [])


@contextlib.contextmanager
def gpus_released(ctx: RunContext):
    """While the body runs (the trainer), the flow's vLLM servers (every replica) sleep when
    ``gpus.sleep_while_training`` (level 1: weights to CPU memory, KV cache freed); they wake afterwards, also
    on failure."""
    servers = [s for s in _STATE["servers"] if s.alive()]
    if not ctx.config.gpus.sleep_while_training or not servers:
        yield
        return
    asleep = []
    try:
        for server in servers:
            server.sleep(level=1)
            asleep.append(server)
        yield
    finally:
        for server in asleep:
            server.wake_up()


def _diagnose(server) -> str:
    """``the vLLM server (pid P) exited with status -9 (SIGKILL); log F`` or ``... still runs ...``; a replica
    placed by Ray asks its actor (``infra.ray_serving.RayReplica.diagnosis``)."""
    from infra.serving import process_state

    return server.diagnosis() if hasattr(server, "diagnosis") else process_state(server)


def server_diagnosis(ctx: RunContext) -> str:
    """What is known of the policy server(s) this process serves from, for an error line: ``the vLLM server
    (pid P) exited with status -9 (SIGKILL); log F``, ``the vLLM server (pid P) still runs; log F``, ``the
    external policy server URL`` (``serving.base_url``; ``base_urls``: every URL), or that none was started;
    for a pool of replicas, one such part per replica (``replica 2/2: ...``). Never raises."""
    try:
        s = ctx.config.serving
        if s.external_urls:
            if s.base_urls:
                return f"the external policy servers {', '.join(s.base_urls)} (serving.base_urls)"
            return f"the external policy server {s.base_url} (serving.base_url)"
        servers = _STATE["servers"]
        if not servers or all(getattr(x, "process", None) is None and not getattr(x, "placed_by_ray", False)
                              for x in servers):
            return "no vLLM server was started by this process"
        if len(servers) == 1:
            return _diagnose(servers[0])
        return "; ".join(f"replica {i + 1}/{len(servers)}: {_diagnose(x)}" for i, x in enumerate(servers))
    except Exception as e:  # noqa: BLE001 - a diagnosis never hides the failure it explains
        return f"the policy server's state is unknown ({type(e).__name__}: {e})"


def lost_server_line(ctx: RunContext, what: str, infra: dict[str, int]) -> str | None:
    """The warning of stage ``what`` (``iteration 2 generate``) that passed although some of its trees ended
    ``policy_error`` (``infra``: trees per infrastructure failure, under ``runtime.max_infra_failure_share``)
    because a policy server of this flow died: ``iteration 2 generate: 3 trees ended policy_error (under
    runtime.max_infra_failure_share 25%: the stage goes on): the vLLM server (pid P) exited with status -9
    (SIGKILL); log F; the next checkpoint switch (this iteration's evaluation or the next iteration) starts a
    new one``, a part per dead replica (``replica 2/2: ...``). None when no tree ended ``policy_error`` or every
    server still runs (external servers: not ours to name). Never raises."""
    try:
        n = infra.get("policy_error", 0)
        servers = [] if ctx.config.serving.external_urls else list(_STATE["servers"])
        if not n or not servers:
            return None
        dead = [(i, x) for i, x in enumerate(servers) if not x.alive()]
        if not dead:
            return None
        parts = [_diagnose(x) if len(servers) == 1 else f"replica {i + 1}/{len(servers)}: {_diagnose(x)}"
                 for i, x in dead]
        limit = ctx.config.runtime.max_infra_failure_share
        return (f"{what}: {n} tree{'s' * (n != 1)} ended policy_error (under runtime.max_infra_failure_share "
                f"{limit:.0%}: the stage goes on): {'; '.join(parts)}; the next checkpoint switch (this iteration's "
                f"evaluation or the next iteration) starts a new one")
    except Exception:  # noqa: BLE001 - a warning never fails the stage it describes
        return None


def shutdown_server() -> None:
    """Stop the flow's vLLM servers (every replica), if any (and drop their records)."""
    with _LOCK:
        for server in _STATE["servers"]:
            pid = None if getattr(server, "placed_by_ray", False) else server.pid  # a record is of this machine
            server.stop()
            forget_server(pid)
        _STATE.update(servers=[], served=None, lora=None)


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
        stopped += [server.pid for server in _STATE["servers"] if server.alive()]
        shutdown_server()
        stopped += [p for p in stop_recorded_servers(str(flow_run.id)) if p not in stopped]
        log.info(f"flow run {getattr(flow_run, 'name', flow_run.id)} {getattr(state, 'name', '')}: vLLM servers "
                 f"stopped: {', '.join(map(str, stopped)) or 'none'}")
    except Exception as e:  # noqa: BLE001 - reported, never raised
        log.warning(f"could not stop the flow run's vLLM server: {type(e).__name__}: {e}")
    return stopped


STOP_SERVER_HOOKS = {"on_cancellation": [stop_flow_servers], "on_crashed": [stop_flow_servers]}
