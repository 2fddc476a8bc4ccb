"""Prefect task ``serve_checkpoint``: the flow's policy server pool serves a checkpoint.

The pool (``infra.serving_pool.ServingPool``, one per flow process: :data:`POOL`) decides and does the switch; this
module holds it and the Prefect side of its servers' lifetime.

The pool is stopped by :func:`shutdown_server` when the flow ends. A flow run stopped from outside (cancelled from
the UI, its process killed by the worker) ends without reaching that ``finally``: the flows therefore carry
:data:`STOP_SERVER_HOOKS`, whose :func:`stop_flow_servers` stops the servers from the flow's own process or, when
Prefect runs the hook in the worker's process, from the record each start leaves under
``$RAO_HOME/services/flow-runs/``. Docs: docs/pipeline/prefect.md, docs/pipeline/ray.md.
"""

from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import psutil
from prefect import task
from prefect.cache_policies import NONE
from prefect.runtime import flow_run as current_flow_run

from infra.process import StartTimeout, kill_group
from infra.serving_pool import ProcessLedger, ServingPool
from infra.stage_io import RunContext, fetch_dir, run_logger
from infra.stage_records import Checkpoint, ServedEndpoint
from rao_core.jsonl import atomic_path
from rao_core.paths import rao_home
from rao_core.train.checkpoint import is_checkpoint


def checkpoint_local(ctx: RunContext, ckpt: Checkpoint) -> Path:
    """Local folder of checkpoint ``ckpt``: its own folder when complete, else a copy of its S3 prefix
    (``infra.stage_io.fetch_dir``, cached under the campaign's local folder).

    Raises FileNotFoundError when it has neither a complete local folder nor an S3 URI (or nothing lies there)."""
    if ckpt.local and is_checkpoint(ckpt.local):
        return Path(ckpt.local)
    if not ckpt.uri:
        raise FileNotFoundError(f"checkpoint {ckpt.name} has neither a local folder nor an S3 URI")
    return fetch_dir(ctx, ckpt.uri, f"checkpoints/{ckpt.name}")


class FlowRunRecords(ProcessLedger):
    """The pool's ledger: each server it starts on this machine is recorded for the current flow run, its parent
    and its root (:func:`record_server`); each one it stops is forgotten (:func:`forget_server`)."""

    def owners(self) -> list[str]:
        return _flow_run_ids()  # here, in the task's thread: the starts' threads do not see the flow run

    def started(self, pid: int | None, base_url: str, owners: Any) -> None:
        record_server(pid, base_url=base_url, flow_run_ids=owners)

    def stopped(self, pid: int | None) -> None:
        forget_server(pid)


#: The policy server pool of this process (one per flow run), stopped by :func:`shutdown_server`.
POOL = ServingPool(ledger=FlowRunRecords())


def retry_unless_start_timed_out(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition of :func:`serve_checkpoint`: retry a failed switch, except one that failed on a
    server's start time-out (:class:`infra.process.StartTimeout`), whose retry would wait as long again for the
    same start (its error line says so instead)."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - the exception cannot be read: the ordinary retry
        return True
    return not isinstance(exc, StartTimeout)


@task(name="serve-checkpoint", cache_policy=NONE, retries=1, retry_delay_seconds=5,
      retry_condition_fn=retry_unless_start_timed_out)
def serve_checkpoint(ctx: RunContext, ckpt: Checkpoint) -> ServedEndpoint:
    """Start or re-point the flow's policy server pool (``serving.replicas`` vLLM servers, or the external servers
    of ``serving.base_url(s)``) at ``ckpt``: one call to :meth:`infra.serving_pool.ServingPool.serve`, which
    fetches the checkpoint (:func:`checkpoint_local`) only when the switch reads its files.

    Args:
        ctx: the run's context (config, S3, the campaign's local folder).
        ckpt: the checkpoint to serve.

    Returns:
        The endpoints, once every replica reports the checkpoint (``ServedEndpoint``).

    Raises:
        ServiceError: one line naming each replica that could not be started or switched (the replicas that did
            switch keep running: the task's retry, or :func:`shutdown_server`); a Ray cluster that cannot hold the
            replicas; external servers asked for full weights.
        StartTimeout: a server did not answer within ``serving.start_timeout_s``: the line says what it was doing
            (its last start phase and log lines) and that the task is not retried (a second start would wait as
            long).
        FileNotFoundError: the checkpoint has no local folder and no S3 copy.
    """
    try:
        return POOL.serve(ctx.config, ckpt.name, lambda: checkpoint_local(ctx, ckpt), work_dir=ctx.local(),
                          say=run_logger().info)
    except StartTimeout as e:
        raise StartTimeout(f"{e}; not retried: a second start would wait as long again; free the CPU (other "
                           f"processes) or raise serving.start_timeout_s ({ctx.config.serving.start_timeout_s:.0f} s), "
                           "then re-run to resume") from None


def gpus_released(ctx: RunContext) -> AbstractContextManager[None]:
    """While the body runs (the trainer), the flow's vLLM servers (every replica) sleep when
    ``gpus.sleep_while_training``; they wake afterwards, also on failure (``ServingPool.gpus_released``)."""
    return POOL.gpus_released(ctx.config)


def server_diagnosis(ctx: RunContext) -> str:
    """What is known of the policy server(s) this process serves from, for an error line
    (``ServingPool.diagnosis``: exit status and log per replica, the external URLs, or that none was started).
    Never raises."""
    return POOL.diagnosis(ctx.config)


def lost_server_line(ctx: RunContext, what: str, infra: dict[str, int]) -> str | None:
    """The warning of stage ``what`` (``iteration 2 generate``) that passed although some of its trees ended
    ``policy_error`` (``infra``: trees per infrastructure failure, under ``runtime.max_infra_failure_share``)
    because a policy server of this flow died (``ServingPool.lost_server_line``); None when no tree ended
    ``policy_error`` or every server still runs. Never raises."""
    return POOL.lost_server_line(ctx.config, what, infra)


def shutdown_server() -> None:
    """Stop the flow's vLLM servers (every replica), if any (and drop their records)."""
    POOL.stop()


def server_records_dir() -> Path:
    """Folder of the records of running flow-started vLLM servers (``<pid>.json``), ``$RAO_HOME/services/flow-runs``."""
    return rao_home() / "services" / "flow-runs"


def _flow_run_ids() -> list[str]:
    """The current Prefect flow run, its parent and its root (empty outside a flow run): a hook on any of
    them finds the server (the campaign's iterations are subflows; a campaign may run inside the experiment)."""
    ids = [current_flow_run.id]
    try:  # each is an API call; the flow run's own id is enough for the flow that started the server
        ids += [current_flow_run.parent_flow_run_id, current_flow_run.root_flow_run_id]
    except Exception:  # noqa: BLE001 - an unreachable API only narrows the record
        pass
    return list(dict.fromkeys(str(i) for i in ids if i))


def record_server(pid: int | None, *, base_url: str = "", flow_run_ids: list[str] | None = None) -> Path | None:
    """Record a vLLM server the current flow run started, so that :func:`stop_flow_servers` can stop it from
    another process: ``server_records_dir()/<pid>.json`` with the pid, the process's start time (psutil's
    ``create_time``, seconds since the epoch: a pid reused by another process is never stopped), the URL and
    ``flow_run_ids`` (default: the current flow run, its parent and root). Returns the record's path, or None
    outside a flow run or when the process is already gone."""
    ids = flow_run_ids if flow_run_ids is not None else _flow_run_ids()
    if not pid or not ids:
        return None
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
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
        stopped += [server.pid for server in POOL.servers if server.alive()]
        shutdown_server()
        stopped += [p for p in stop_recorded_servers(str(flow_run.id)) if p not in stopped]
        log.info(f"flow run {getattr(flow_run, 'name', flow_run.id)} {getattr(state, 'name', '')}: vLLM servers "
                 f"stopped: {', '.join(map(str, stopped)) or 'none'}")
    except Exception as e:  # noqa: BLE001 - reported, never raised
        log.warning(f"could not stop the flow run's vLLM server: {type(e).__name__}: {e}")
    return stopped


STOP_SERVER_HOOKS = {"on_cancellation": [stop_flow_servers], "on_crashed": [stop_flow_servers]}
