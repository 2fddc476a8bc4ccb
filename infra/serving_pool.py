"""The policy server pool as one object: serve a checkpoint under a campaign config, get its endpoints back.

:meth:`ServingPool.serve` is the one call; :func:`plan_switch` is its decision (external servers, local processes
or Ray replicas; a start, a LoRA load, a reload or a restart per replica; each replica's Ray resources).
Docs: docs/pipeline/ray.md ("A pool of policy servers").
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from infra.process import ServiceError, StartTimeout
from infra.ray_rollouts import connect
from infra.ray_serving import RayReplica, check_placement
from infra import serving  # called as serving.X: tests patch infra.serving's functions (tests/pipeline/conftest.py)
from infra.stage_records import ServedEndpoint, ServedReplica
from rao_core.config import CampaignConfig, external_switch_problem
from rao_core.policies.openai_policy import policy_client_key
from rao_core.train.checkpoint import is_lora_checkpoint

#: Which servers serve the policy: ``external`` (``serving.base_url(s)``, nothing started), ``local`` (processes of
#: the flow on its machine) or ``ray`` (Ray actors, ``infra/ray_serving.py``).
ServerKind = Literal["external", "local", "ray"]
#: The jobs of a replica that start its server.
STARTS = ("start", "start+lora", "restart")


def server_kind(cfg: CampaignConfig) -> ServerKind:
    """Which servers serve ``cfg``'s policy: ``external`` when ``serving.base_url`` or ``serving.base_urls`` is set,
    ``ray`` with ``execution.backend: ray`` and ``execution.ray_replicas``, else ``local``."""
    if cfg.serving.external_urls:
        return "external"
    ex = cfg.execution
    return "ray" if ex.backend == "ray" and ex.ray_replicas else "local"


def served_roots(base_url: str, api_key: str | None = None, timeout_s: float = 30.0) -> dict[str, str]:
    """What an OpenAI-compatible server serves: ``{model name: its weights' folder}`` from ``GET
    {base_url}/models`` (vLLM's ``root``: the ``--model`` folder, or a LoRA adapter's path; empty when the server
    does not say). Raises ServiceError when it does not answer with a model list."""
    import httpx

    try:
        r = httpx.get(f"{base_url.rstrip('/')}/models", timeout=timeout_s,
                      headers={"Authorization": f"Bearer {api_key or policy_client_key(base_url)}"})
        r.raise_for_status()
        return {str(m["id"]): str(m.get("root") or "") for m in r.json()["data"]}
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise ServiceError(f"the policy server at {base_url} did not list the models it serves ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})") from None


_WEIGHTS_SHA: dict[tuple[str, int, int], str] = {}  # (file, size, mtime_ns) -> sha256


def _weights_digest(folder: Path) -> list[tuple[str, str]] | None:
    """``[(file name, sha256)]`` of a checkpoint folder's weight files (``*.safetensors``, ``*.bin``), each hashed
    once per (size, mtime); None when the folder is not readable here or holds none."""
    import hashlib

    try:
        files = sorted(f for f in Path(folder).iterdir() if f.suffix in (".safetensors", ".bin") and f.is_file())
    except OSError:
        return None
    out = []
    for f in files:
        st = f.stat()
        key = (str(f.resolve()), st.st_size, st.st_mtime_ns)
        if key not in _WEIGHTS_SHA:
            h = hashlib.sha256()
            with f.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
            _WEIGHTS_SHA[key] = h.hexdigest()
        out.append((f.name, _WEIGHTS_SHA[key]))
    return out or None


def _same_weights(served: str | Path, checkpoint: str | Path) -> bool | None:
    """Whether the folder a server names as its ``root`` holds the weights of checkpoint folder ``checkpoint``:
    the same folder, or weight files of the same names and sha256 (a copy); None when the served folder cannot be
    read here (a server on another machine: not checkable)."""
    if not str(served) or not str(checkpoint):
        return None
    a, b = Path(served).expanduser(), Path(checkpoint).expanduser()
    if a.resolve() == b.resolve():
        return True
    da = _weights_digest(a)
    return None if da is None else da == _weights_digest(b)


def _where_from(url: str) -> str:
    import os

    if os.environ.get("RAO_POLICY_BASE_URL", "").rstrip("/") == url.rstrip("/"):
        return "RAO_POLICY_BASE_URL: the policy server of `rao services up --model`"
    return "serving.base_url(s)"


def check_external_server(cfg: CampaignConfig) -> None:
    """Refuse, before anything starts, a campaign whose rollouts would silently come from another model than its
    checkpoints: external servers (``serving.base_url(s)``, or ``RAO_POLICY_BASE_URL`` set by ``rao services up
    --model M``) with ``serving.switch`` reload or restart cannot load a checkpoint's full weights, so they serve the
    campaign only when the campaign never leaves the weights they already serve: no warm start of its own, no
    iteration, and ``model.path`` the folder they serve (their ``/v1/models`` ``root``). ``switch`` lora (adapters
    through their API) and none (their weights on purpose) pass. Nothing for a campaign that starts its own servers.

    Raises:
        ServiceError: one line naming the server, where its URL came from, the model it serves and why this
            campaign cannot use it, and the ways out.
    """
    s = cfg.serving
    if server_kind(cfg) != "external" or s.switch in ("lora", "none"):
        return
    url = s.external_urls[0]
    roots = served_roots(url, api_key=policy_client_key(url, key_env=s.api_key_env))
    served = ", ".join(f"{m!r} from {r or 'a folder it does not name'}" for m, r in roots.items()) or "no model"
    if cfg.warm_start.mode != "none":
        why = (f"this campaign warm-starts a checkpoint of its own (warm_start.mode {cfg.warm_start.mode}), which that "
               f"server cannot load (serving.switch {s.switch}: full weights)")
    elif cfg.iterations > 0:
        why = (f"its {cfg.iterations} iteration(s) train new checkpoints, which that server cannot load "
               f"(serving.switch {s.switch}: full weights)")
    elif not any(_same_weights(r, cfg.model.path) is not False for r in roots.values()):
        why = f"this campaign's checkpoint is model.path {cfg.model.path}"
    else:
        return
    raise ServiceError(f"the policy server at {url} ({_where_from(url)}) serves {served}, not this campaign's "
                       f"checkpoints: {why}; stop it (`rao services down`) or unset RAO_POLICY_BASE_URL so that the "
                       "campaign starts its own server, or set serving.switch lora (LoRA adapters) or none (sample "
                       "that server's model on purpose)")


def needs_checkpoint_files(cfg: CampaignConfig) -> bool:
    """Whether a switch under ``cfg`` reads the checkpoint's files: always for servers of the pool's own; for
    external servers only with ``serving.switch: lora`` (an adapter goes through their API; full weights never)."""
    return server_kind(cfg) != "external" or cfg.serving.switch == "lora"


@dataclass(frozen=True)
class PoolView:
    """What :func:`plan_switch` needs of the pool: whether each replica's server still runs (empty: none started,
    or every one died), the checkpoint it serves and the LoRA adapter loaded (None: the served folder's model)."""

    alive: tuple[bool, ...] = ()
    served: str | None = None
    lora: str | None = None


@dataclass(frozen=True)
class SwitchPlan:
    """How the pool comes to serve a checkpoint (:func:`plan_switch`).

    Attributes:
        kind: the servers (:data:`ServerKind`).
        jobs: per replica, what it does: ``start``, ``start+lora`` (then the adapter loaded), ``same`` (it serves
            the checkpoint already), ``lora`` (adapter hot-loaded), ``reload`` (the served folder's weights reloaded
            in place), ``restart`` (stopped, started again on the served folder), ``external``, ``external-lora``
            (adapter loaded through the server's ``/v1/load_lora_adapter``).
        adapter: the LoRA adapter the replicas serve afterwards (named as the checkpoint); None: the folder's model.
        weights: the served folder first: ``""`` left alone; ``"fresh"`` emptied, then the checkpoint's weights (a
            LoRA checkpoint: its base model's) copied in; ``"over"`` the checkpoint's files copied over it.
        replace: replicas of a running pool found dead: each gets a new server (a new process, a new port).
        num_cpus / num_gpus: the Ray resources each replica's actor asks for (kind ``ray``).
    """

    kind: ServerKind
    jobs: tuple[str, ...]
    adapter: str | None = None
    weights: Literal["", "fresh", "over"] = ""
    replace: tuple[int, ...] = ()
    num_cpus: float = 0.0
    num_gpus: float = 0.0

    @property
    def starts(self) -> bool:
        """Whether any replica's server starts (a new pool, a replaced replica, a restart)."""
        return any(j in STARTS for j in self.jobs)


def plan_switch(cfg: CampaignConfig, name: str, lora: bool, pool: PoolView = PoolView(), *,
                cluster_gpus: bool = False) -> SwitchPlan:
    """The switch of the pool to checkpoint ``name`` (``lora``: a LoRA adapter, else full weights) under ``cfg``.

    External servers (``serving.base_url(s)``): with ``serving.switch: lora`` a LoRA checkpoint's adapter is
    loaded on each (``external-lora``); otherwise they keep their weights (``external``), which they may only for
    the checkpoint they already serve (``pool.served``, None: this one) unless ``serving.switch`` is ``none``.
    Servers of the pool's own (``serving.replicas``; Ray actors with ``execution.backend: ray``, which ask for
    ``execution.cpus_per_replica`` CPUs and, when ``cluster_gpus``, tensor x data parallel GPUs each): a pool
    with no live replica starts on the checkpoint (a LoRA checkpoint: on its base model, then the adapter); a
    running one keeps a checkpoint it serves (``same``), else switches by ``serving.switch``: ``lora`` loads a
    LoRA checkpoint's adapter, ``reload`` copies the weights over the served folder and reloads them, anything
    else (``restart``, or ``lora`` with full weights) restarts every replica on the copied folder. A dead
    replica of a running pool is started again on the served folder (with the adapter served).

    Raises ServiceError when external servers would need full weights (``rao_core.config.external_switch_problem``:
    refused at config load, met here when the URL came from ``RAO_POLICY_BASE_URL``)."""
    s, kind = cfg.serving, server_kind(cfg)
    if kind == "external":
        n = len(s.external_urls)
        if s.switch == "lora" and lora:
            return SwitchPlan(kind, ("external-lora",) * n, adapter=name)
        if s.switch not in ("lora", "none") and name != (pool.served or name):
            raise ServiceError(external_switch_problem(cfg.model_copy(update={"iterations": 1})))
        return SwitchPlan(kind, ("external",) * n)
    k = s.tensor_parallel_size * s.data_parallel_size
    res = {"num_cpus": cfg.execution.cpus_per_replica, "num_gpus": k if cluster_gpus else 0} if kind == "ray" else {}
    if not any(pool.alive):  # a new pool
        return SwitchPlan(kind, ("start+lora" if lora else "start",) * s.replicas, adapter=name if lora else None,
                          weights="fresh", **res)
    weights: Literal["", "fresh", "over"] = ""
    if pool.served == name:
        how, adapter = "same", pool.lora
    elif s.switch == "lora" and lora:
        how, adapter = "lora", name
    elif s.switch == "reload":
        how, adapter, weights = "reload", None, "over"
    else:
        how, adapter, weights = "restart", None, "over"
    jobs = tuple(how if up else ("start+lora" if adapter else "start") for up in pool.alive)
    return SwitchPlan(kind, jobs, adapter=adapter, weights=weights,
                      replace=tuple(i for i, up in enumerate(pool.alive) if not up), **res)


class ProcessLedger:
    """Where a :class:`ServingPool` notes the server processes it starts on this machine and stops the ordinary
    way, so that another process can stop them (the Prefect task's records: ``tasks.serve``). Notes nothing."""

    def owners(self) -> Any:
        """Called once, in the caller's thread, before a switch starts a server; passed on to :meth:`started`."""
        return None

    def started(self, pid: int | None, base_url: str, owners: Any) -> None:
        """Server ``pid`` (at ``base_url``) of this machine started; called in the start's own thread."""

    def stopped(self, pid: int | None) -> None:
        """Server ``pid`` was stopped (None: not a process of this machine)."""


def lora_base(adapter: Path) -> Path:
    """The base model folder of a LoRA checkpoint (``base_model_name_or_path`` of its adapter_config.json).
    Raises FileNotFoundError when that folder has no config.json."""
    base = Path(json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path") or "")
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"LoRA checkpoint {adapter}: its base model {base} has no config.json")
    return base


def copy_weights(src: Path, dst: Path) -> None:
    """Copy checkpoint files into the served folder, each file replaced atomically."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file():
            tmp = dst / f".{p.name}.tmp"
            shutil.copy2(p, tmp)
            tmp.replace(dst / p.name)


def _where(server: Any) -> str:
    """A replica for a message: its URL once it has a port, else ``not started``."""
    return server.base_url if getattr(server, "port", 0) else "not started"


def _diagnose(server: Any) -> str:
    """``the vLLM server (pid P) exited with status -9 (SIGKILL); log F`` or ``... still runs ...``; a replica
    placed by Ray asks its actor (``infra.ray_serving.RayReplica.diagnosis``)."""
    return server.diagnosis() if hasattr(server, "diagnosis") else serving.process_state(server)


class ServingPool:
    """The policy servers of one flow's process: ``serving.replicas`` vLLM servers (1 by default) started and
    re-pointed at each checkpoint, or the external servers of ``serving.base_url(s)``.

    Every replica serves one folder, ``<work_dir>/served``. Switches (``serving.switch``): ``reload`` copies the
    new weight files over it once and reloads them in every replica in place (dev-mode ``reload_weights``, no
    restart); ``restart`` restarts every replica; ``lora`` hot-loads the adapter under a new name. The replicas
    switch at the same time (a thread each); :meth:`serve` returns once each lists the new model or adapter on
    ``GET /v1/models`` and fails naming those that did not. A replica that died (found at the next switch) is
    started again; during a stage the rollouts' ``rao_core.policies.pool.PolicyPool`` takes an unreachable replica
    out. The replicas are processes of the flow on its machine, or, with ``execution.backend: ray``
    (``execution.ray_replicas``), Ray actors placed where the resources are (``infra/ray_serving.py``).

    Args:
        ledger: notes the processes started and stopped on this machine (default: nothing noted).

    Attributes:
        servers: the replicas' servers, in replica order (empty: none started).
        served: the checkpoint the pool serves (external servers: the one they served first).
        lora: the LoRA adapter loaded (None: the served folder's model).
    """

    def __init__(self, ledger: ProcessLedger | None = None) -> None:
        self.ledger = ledger or ProcessLedger()
        self.servers: list[Any] = []
        self.served: str | None = None
        self.lora: str | None = None
        self._lock = threading.Lock()

    def serve(self, config: CampaignConfig, name: str, folder: Path | Callable[[], Path], *, work_dir: Path,
              say: Callable[[str], None] | None = None) -> ServedEndpoint:
        """Serve checkpoint ``name`` under ``config``: start or re-point the pool (:func:`plan_switch`).

        Args:
            config: the campaign config (``serving``, ``execution``, ``gpus``, ``trainer.lora``).
            name: the checkpoint's name (a LoRA adapter is served under it).
            folder: the checkpoint's local folder, or a function returning it, called once and only when the switch
                reads the files (:func:`needs_checkpoint_files`).
            work_dir: the campaign's local folder: the served copy goes to ``served``, the server logs to ``logs``.
            say: where a start's progress lines go (its phases and a heartbeat, ``replica i/N: `` first in a pool).

        Returns:
            The endpoints (:class:`infra.stage_records.ServedEndpoint`: every replica's URL and report).

        Raises:
            ServiceError: a replica could not be started or switched (one line naming each; the replicas that did
                switch keep running), the Ray cluster cannot hold the replicas, or external servers would need
                full weights.
        """
        if server_kind(config) == "external":
            return self._serve_external(config, name, folder)
        with self._lock:
            return self._switch(config, name, folder, work_dir, say or (lambda line: None))

    def _serve_external(self, config: CampaignConfig, name: str, folder: Path | Callable[[], Path]) -> ServedEndpoint:
        """The external servers take the switch: each gets a LoRA adapter through its API before this returns."""
        cfg = config.serving
        urls = cfg.external_urls
        t0 = time.monotonic()
        with self._lock:
            self.served = self.served or name  # the checkpoint the servers already serve
            src = _local(folder) if needs_checkpoint_files(config) else None
            if src is None and cfg.switch in ("reload", "restart"):  # compared with what the servers serve
                try:
                    src = _local(folder)
                except FileNotFoundError:  # no files here: the served model's name is checked alone
                    src = None
            plan = plan_switch(config, name, src is not None and is_lora_checkpoint(src), PoolView(served=self.served))
            if plan.adapter:
                failed = []
                for i, url in enumerate(urls):
                    try:
                        serving.load_lora_adapter(url, name, src.resolve(),
                                                  api_key=policy_client_key(url, key_env=cfg.api_key_env))
                    except ServiceError as e:
                        failed.append(f"replica {i + 1}/{len(urls)}: {e}" if len(urls) > 1 else str(e))
                if failed:
                    raise ServiceError("; ".join(failed))
            if cfg.switch in ("reload", "restart"):  # at each switch: they serve this checkpoint, never another
                want = cfg.served_model_name  # (an adapter is loaded under the checkpoint's name through their API)
                for url in urls:
                    roots = served_roots(url, api_key=policy_client_key(url, key_env=cfg.api_key_env))
                    ok = want in roots and (src is None or _same_weights(roots[want], src) is not False)
                    if not ok:
                        raise ServiceError(
                            f"the policy server at {url} ({_where_from(url)}) serves "
                            + (", ".join(f"{m!r} from {r or '?'}" for m, r in roots.items()) or "no model")
                            + f", not checkpoint {name} ({want!r}" + (f" from {src}" if src else "") + "); "
                            "refused: rollouts would come from another model")
        how, model = plan.jobs[0], plan.adapter or cfg.served_model_name
        dt = round(time.monotonic() - t0, 3)
        return ServedEndpoint(base_url=urls[0], base_urls=list(urls) if len(urls) > 1 else [], model=model,
                              switch_s=dt, how=how, seeded=cfg.request_seeds is not False, own=None,
                              replicas=[ServedReplica(index=i, base_url=u, checkpoint=name, how=how)
                                        for i, u in enumerate(urls)] if len(urls) > 1 else [])

    def _drop(self, server: Any) -> None:
        """Stop what is left of a replica's server (its process group, a Ray actor) and forget its record."""
        server.stop()
        self.ledger.stopped(server.pid)

    def _switch(self, config: CampaignConfig, name: str, folder: Path | Callable[[], Path], work_dir: Path,
                say: Callable[[str], None]) -> ServedEndpoint:
        """The switch of every replica of the pool's own to ``name`` (the caller holds the lock)."""
        cfg, ex = config.serving, config.execution
        t0 = time.monotonic()
        src = _local(folder)
        lora = is_lora_checkpoint(src)
        served_dir, log_dir = work_dir / "served", work_dir / "logs"
        served_dir.parent.mkdir(parents=True, exist_ok=True)
        alive = tuple(s.alive() for s in self.servers)
        if self.servers and not any(alive):  # all died (killed, crashed): a fresh pool
            for s in self.servers:
                self._drop(s)
            self.servers, self.served, self.lora = [], None, None
            alive = ()
        kind = server_kind(config)
        on_gpu = None  # None: the replicas start here, on GPUs if this host has one (infra.serving.has_cuda_gpu)
        if kind == "ray":
            # a cluster with GPUs: each replica asks for its own
            on_gpu = connect(ex.ray_address, key_env=cfg.api_key_env).get("GPU", 0) > 0
        plan = plan_switch(config, name, lora, PoolView(alive, self.served, self.lora), cluster_gpus=bool(on_gpu))
        if kind == "ray":
            check_placement(cfg.replicas, plan.num_cpus, plan.num_gpus, ex.cpus_per_shard)

        def new(i: int) -> Any:
            if kind == "local":
                return serving.server_from_config(config, served_dir, log_dir=log_dir, replica=i)
            server = serving.server_from_config(config, served_dir, log_dir=log_dir, replica=i, on_gpu=on_gpu)
            return RayReplica.of(server, index=i, num_cpus=plan.num_cpus, num_gpus=plan.num_gpus)

        if plan.weights == "fresh":  # a new pool
            if served_dir.exists():
                shutil.rmtree(served_dir)
            copy_weights(lora_base(src) if lora else src, served_dir)
            self.servers = [new(i) for i in range(len(plan.jobs))]
            self.lora = None  # before they start: stop() stops whatever did
        else:
            for i in plan.replace:  # a lost replica: a new process
                self._drop(self.servers[i])
                self.servers[i] = new(i)
            for i, job in enumerate(plan.jobs):
                if job == "restart":
                    self._drop(self.servers[i])
            if plan.weights == "over":
                copy_weights(src, served_dir)
        servers, adapter = self.servers, plan.adapter
        owners = self.ledger.owners() if plan.starts else None  # here: the starts run in threads of their own

        def run(i: int) -> ServedReplica:
            server, job, t = servers[i], plan.jobs[i], time.monotonic()
            if job in STARTS:
                n = len(servers)
                server.on_progress = say if n == 1 else (lambda line: say(f"replica {i + 1}/{n}: {line}"))
                if not getattr(server, "placed_by_ray", False):  # an actor's server: the actor's guard stops it
                    # recorded as soon as its process exists: a run cancelled during the start (minutes) is
                    # stopped from the record by a hook in another process
                    server.on_spawn = lambda pid: self.ledger.started(pid, server.base_url, owners)
                server.start()
                if not getattr(server, "placed_by_ray", False):  # again, now with its final pid and URL
                    self.ledger.started(server.pid, server.base_url, owners)
            if job == "reload":
                server.reload_weights()
            if job in ("start+lora", "lora"):
                server.load_lora(adapter, src)
            # its own key: a Ray replica listens on its node's address, not on loopback
            models = serving.served_models(server.base_url, api_key=getattr(server, "api_key", None))
            want = adapter or server.model
            if want not in models:
                raise ServiceError(f"serves {models}, not {want!r}")
            return ServedReplica(index=i, base_url=server.base_url, checkpoint=name, how=job,
                                 switch_s=round(time.monotonic() - t, 3), pid=server.pid, models=models)

        reports, failed, timed_out = [], [], False
        pool = ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="rao-switch")
        futures = [pool.submit(run, i) for i in range(len(servers))]
        try:
            for i, f in enumerate(futures):
                try:
                    reports.append(f.result())
                except Exception as e:  # noqa: BLE001 - every replica's failure is named
                    timed_out = timed_out or isinstance(e, StartTimeout)
                    failed.append(f"replica {i + 1}/{len(servers)} ({_where(servers[i])}): {type(e).__name__}: "
                                  + " ".join(str(e).split())[:600])
        except BaseException:  # cancelled (Prefect's TerminationSignal, Ctrl-C) while a replica starts
            _stop_starts(servers, futures)
            raise
        finally:
            pool.shutdown(wait=True)
        if failed:
            self.served = None  # a retry switches every replica again
            error = StartTimeout if timed_out else ServiceError  # a start that timed out: not retried as it is
            raise error(f"checkpoint {name} did not reach every policy server replica: " + "; ".join(failed))
        self.served, self.lora = name, adapter
        hows = sorted({r.how for r in reports})
        started = [servers[r.index].start_phases for r in reports if r.how in STARTS]
        seeded = cfg.request_seeds if cfg.request_seeds is not None else bool(serving.has_cuda_gpu() if on_gpu is None
                                                                              else on_gpu)
        return ServedEndpoint(base_url=reports[0].base_url, base_urls=[r.base_url for r in reports],
                              model=adapter or servers[0].model, switch_s=round(time.monotonic() - t0, 3),
                              how="+".join(hows), replicas=reports, start_phases=dict(started[0]) if started else {},
                              seeded=seeded, own=True)

    def stop(self) -> None:
        """Stop every replica's server, if any (and drop their records); the pool is then empty. A switch in
        progress (a replica starting, minutes) does not delay it: its servers are stopped too, and the switch
        fails."""
        servers = list(self.servers)  # not under the lock: a switch holds it for the whole of a start
        for server in servers:
            pid = None if getattr(server, "placed_by_ray", False) else server.pid  # a record is of this machine
            server.stop()
            self.ledger.stopped(pid)
        if self._lock.acquire(timeout=STOP_WAIT_S):  # the stopped switch returns meanwhile
            self._lock.release()
        self.servers, self.served, self.lora = [], None, None

    @contextlib.contextmanager
    def gpus_released(self, config: CampaignConfig) -> Iterator[None]:
        """While the body runs (the trainer), every live replica sleeps when ``gpus.sleep_while_training`` (level
        1: weights to CPU memory, KV cache freed); they wake afterwards, also on failure."""
        servers = [s for s in self.servers if s.alive()]
        if not config.gpus.sleep_while_training or not servers:
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

    def diagnosis(self, config: CampaignConfig) -> str:
        """What is known of the policy server(s), for an error line: ``the vLLM server (pid P) exited with status
        -9 (SIGKILL); log F``, ``the vLLM server (pid P) still runs; log F``, ``the external policy server URL``
        (``serving.base_url``; ``base_urls``: every URL), or that none was started; for a pool of replicas, one
        such part per replica (``replica 2/2: ...``). Never raises."""
        try:
            s = config.serving
            if s.external_urls:
                if s.base_urls:
                    return f"the external policy servers {', '.join(s.base_urls)} (serving.base_urls)"
                return f"the external policy server {s.base_url} (serving.base_url)"
            servers = self.servers
            if not servers or all(getattr(x, "process", None) is None and not getattr(x, "placed_by_ray", False)
                                  for x in servers):
                return "no vLLM server was started by this process"
            if len(servers) == 1:
                return _diagnose(servers[0])
            return "; ".join(f"replica {i + 1}/{len(servers)}: {_diagnose(x)}" for i, x in enumerate(servers))
        except Exception as e:  # noqa: BLE001 - a diagnosis never hides the failure it explains
            return f"the policy server's state is unknown ({type(e).__name__}: {e})"

    def lost_server_line(self, config: CampaignConfig, what: str, infra: dict[str, int]) -> str | None:
        """The warning of stage ``what`` that passed although some of its trees ended ``policy_error`` (``infra``:
        trees per infrastructure failure) because a replica of this pool died: ``what: N trees ended policy_error
        (under runtime.max_infra_failure_share 25%: the stage goes on): <diagnosis>; the next checkpoint switch
        (...) starts a new one``, a part per dead replica. None when no tree ended ``policy_error`` or every
        server still runs (external servers: not ours to name). Never raises."""
        try:
            n = infra.get("policy_error", 0)
            servers = [] if config.serving.external_urls else list(self.servers)
            if not n or not servers:
                return None
            dead = [(i, x) for i, x in enumerate(servers) if not x.alive()]
            if not dead:
                return None
            parts = [_diagnose(x) if len(servers) == 1 else f"replica {i + 1}/{len(servers)}: {_diagnose(x)}"
                     for i, x in dead]
            limit = config.runtime.max_infra_failure_share
            return (f"{what}: {n} tree{'s' * (n != 1)} ended policy_error (under runtime.max_infra_failure_share "
                    f"{limit:.0%}: the stage goes on): {'; '.join(parts)}; the next checkpoint switch (this "
                    f"iteration's evaluation or the next iteration) starts a new one")
        except Exception:  # noqa: BLE001 - a warning never fails the stage it describes
            return None


#: Seconds :meth:`ServingPool.stop` waits for a switch it interrupted to return before it empties the pool.
STOP_WAIT_S = 60.0


def _stop_starts(servers: list[Any], futures: list[Any], timeout_s: float = STOP_WAIT_S) -> None:
    """Stop ``servers`` until every switch job of ``futures`` has returned (a replica whose process did not exist
    yet at the first stop is stopped as soon as it does), at most ``timeout_s`` seconds."""
    from concurrent.futures import wait

    deadline = time.monotonic() + timeout_s
    while True:
        for server in servers:
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - the others are still stopped
                pass
        if wait(futures, timeout=0.5).not_done == set() or time.monotonic() > deadline:
            return


def _local(folder: Path | Callable[[], Path]) -> Path:
    """The checkpoint's folder: ``folder``, or what it returns when it is a function."""
    return Path(folder() if callable(folder) else folder)
