"""Policy server replicas placed by Ray: one Ray actor per vLLM replica, holding its process.

With ``execution.backend: ray`` (and ``execution.ray_replicas``) the pool (``infra/serving_pool.py``) builds each
replica as a :class:`RayReplica`: its actor (:class:`ReplicaHost`) asks the cluster for
``execution.cpus_per_replica`` CPUs and, on a cluster with GPUs, tensor x data parallel GPUs, and starts the vLLM
server on the node Ray chose, listening on that node's IP. Everything that speaks HTTP goes to that address
directly; only start, stop, liveness and the diagnosis go through the actor. The actor is owned by the flow's
process; when that process is killed outright, a guard started next to the server (:data:`_GUARD`) stops what is
left of the server's process group (Ray kills only its leader).

Departures and limits: the served folder (``<campaign>/served``) is read by the server from its path on the
driver, so a replica on another node needs that path on shared storage (as the shards need the repository at its
path, ``infra/ray_rollouts.py``); on CPU a replica binds the cores of its share (``infra.serving.cpu_share``) that
its node has, all of them when it has none of them.
Docs: docs/pipeline/ray.md ("A pool of policy servers").
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra.process import ServiceError
from infra.serving import VLLMServer, process_state

# Runs next to a replica's server on its node, detached (it forks once and its parent exits at once, so it is no
# child of the actor's worker process, which Ray may clean up with the worker): waits for the actor's process to
# end, then stops what is left of the server's process group (SIGTERM, SIGKILL 10 s later). When Ray ends an
# actor's worker it also kills the worker's children, i.e. the server's leader, but not the rest of its group
# (vLLM's engine core): so the guard watches the GROUP, not its leader. It signals the group while the leader is
# the process it was (same create time) or is gone; a group id cannot be reused while any member lives, so a
# leaderless group is still the server's. argv: the actor's pid and create time, the server's pid (its group's id)
# and create time.
_GUARD = """
import os, signal, sys, time
if os.fork():
    os._exit(0)
import psutil
actor, actor_t, group, group_t = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
def same(pid, t):
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - t) < 1 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
def ours():
    try:
        os.killpg(group, 0)
        return abs(psutil.Process(group).create_time() - group_t) < 1  # the leader, alive or a zombie
    except psutil.NoSuchProcess:
        return True  # the leader is gone, members of its group are left
    except (ProcessLookupError, PermissionError, psutil.Error):
        return False
while same(actor, actor_t) and ours():
    time.sleep(1)
for sig in (signal.SIGTERM, signal.SIGKILL):
    if not ours():
        break
    os.killpg(group, sig)
    time.sleep(10)
"""


def start_guard(server_pid: int) -> None:
    """Start the guard (:data:`_GUARD`) of the server process ``server_pid`` (its group's leader) for this process
    (the replica's actor): once this process is gone, the server's group is stopped. Returns at once."""
    import psutil

    me, srv = psutil.Process(), psutil.Process(server_pid)
    launcher = subprocess.Popen([sys.executable, "-c", _GUARD, str(me.pid), repr(me.create_time()), str(server_pid),
                                 repr(srv.create_time())], start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    launcher.wait(timeout=30)  # the guard itself runs on, detached


def node_address(node_id: str) -> str:
    """The IP address Ray knows node ``node_id`` by (``ray start --node-ip-address``, else the one Ray found):
    the address the cluster's nodes reach each other at, which a host with several networks may not give as
    its default route's (``ray.util.get_node_ip_address()``, the fallback)."""
    import ray

    for n in ray.nodes():
        if n.get("NodeID") == node_id and n.get("NodeManagerAddress"):
            return n["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


def placement(index: int, num_cpus: float, num_gpus: float) -> Any:
    """Where replica ``index`` is placed: ``"SPREAD"`` when it asks for CPUs or GPUs; when it asks for none
    (``execution.cpus_per_replica: 0`` on a cluster without GPUs) Ray would put it on a random node, whatever
    the others chose (Ray's actor scheduling docs; seen here: both replicas of a 2-node cluster on one node), so
    it goes to the ``index``-th alive node (node ids sorted). The affinity is hard: Ray 2.60 placed zero-resource
    actors with a soft one at random too (4 actors over 2 nodes: 4/0, 0/4, 3/1; hard: 2/2 each time). A node
    lost before the actor is placed leaves it unplaced: the start fails after ``start_timeout_s`` naming it."""
    if num_cpus > 0 or num_gpus > 0:
        return "SPREAD"
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    return NodeAffinitySchedulingStrategy(nodes[index % len(nodes)], soft=False) if nodes else "SPREAD"


class ReplicaHost:
    """The body of a replica's Ray actor: one :class:`infra.serving.VLLMServer` on the actor's node.

    Args:
        server: the replica's server, not started (``infra.serving.server_from_config``); its host becomes the
            node's IP; it uses the GPUs Ray assigned (``CUDA_VISIBLE_DEVICES`` of the actor's process) unless it
            has a ``gpus`` list of its own (``gpus.serve``) and runs on the driver's node.
        driver_node: the Ray node id of the flow's process."""

    def __init__(self, server: VLLMServer, driver_node: str = ""):
        self.server = server
        self.driver_node = driver_node
        self.guarded = False
        self.lines: list[str] = []  # the start's progress lines not yet taken by :meth:`progress`
        self.lock = threading.Lock()

    def ready(self) -> str:
        """The node this actor was placed on (returns once the actor is placed and constructed)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def _guard(self, line: str = "") -> None:
        """Keep the start's progress ``line`` for :meth:`progress`; start the server's guard as soon as its process
        exists (the first progress line of its start)."""
        if line:
            with self.lock:
                self.lines.append(line)
        proc = self.server.process.proc if self.server.process is not None else None
        if not self.guarded and proc is not None:
            start_guard(proc.pid)
            self.guarded = True

    def progress(self) -> list[str]:
        """The progress lines of the server's start (:class:`infra.serving.StartupWatch`: its phases, and a
        heartbeat with the log's last line every 20 s of silence) since the last call; the driver relays them
        while :meth:`start` runs (the actor answers both at once: ``max_concurrency=2``)."""
        with self.lock:
            out, self.lines = self.lines, []
        return out

    def start(self) -> dict[str, Any]:
        """Start the server (wait until healthy), guarded from the moment its process exists; returns ``{"host",
        "port", "pid", "node", "log", "phases"}``. Raises ServiceError as :meth:`VLLMServer.start` does."""
        import ray

        s = self.server
        node = ray.get_runtime_context().get_node_id()
        s.host = node_address(node)
        if s.gpus and node != self.driver_node:  # gpus.serve names the driver node's devices, not this one's
            s.gpus = []
        if s.cpus:  # the cores of its share that this node has (all of them when none)
            s.cpus = [c for c in s.cpus if c in os.sched_getaffinity(0)]
        s.on_progress = self._guard
        s.start()
        self._guard()
        return {"host": s.host, "port": s.port, "pid": s.pid, "node": node,
                "log": str(s.process.log_path) if s.process else "", "phases": dict(s.start_phases)}

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self.server.alive()

    def stop(self) -> None:
        """Stop the server's process group (its guard then ends by itself)."""
        self.server.stop()

    def diagnosis(self) -> str:
        """``the vLLM server (pid P) exited with status -9 (SIGKILL); log F`` and the like
        (:func:`infra.serving.process_state`)."""
        return process_state(self.server)


def check_placement(replicas: int, num_cpus: float, num_gpus: float, cpus_per_shard: float) -> None:
    """Refuse, before anything starts, a pool the Ray cluster (this process is connected to) cannot run:
    no node has ``num_cpus`` CPUs and ``num_gpus`` GPUs for one replica's actor, or the replicas' CPUs would
    leave fewer than ``cpus_per_shard`` for one rollout shard (the shards would wait forever).

    Raises ServiceError naming what was asked and what to change."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not any(r.get("CPU", 0) >= num_cpus and r.get("GPU", 0) >= num_gpus for r in nodes):
        raise ServiceError(f"a policy server replica asks Ray for {num_cpus:g} CPU and {num_gpus:g} GPU, and no node "
                           f"of the cluster has that many (execution.cpus_per_replica; `ray status`)")
    total = sum(r.get("CPU", 0) for r in nodes)
    left = total - replicas * num_cpus
    if left < cpus_per_shard:
        raise ServiceError(f"the Ray cluster has {total:g} CPUs: {replicas} policy server replica(s) x "
                           f"execution.cpus_per_replica {num_cpus:g} would leave {max(left, 0):g}, fewer than one "
                           f"shard's execution.cpus_per_shard {cpus_per_shard:g} (the shards would wait forever): "
                           f"set execution.cpus_per_replica=0, or give Ray more CPUs (rao services up --ray "
                           f"--ray-cpus N, ray start --num-cpus N)")


_ACTOR: Any = None
#: Seconds between two requests for a replica's start progress (:meth:`RayReplica._relay_start`).
RELAY_POLL_S = 2.0


def _actor_class() -> Any:
    """:class:`ReplicaHost` as a Ray actor class (made once; Ray is imported only here)."""
    global _ACTOR
    if _ACTOR is None:
        import ray

        _ACTOR = ray.remote(max_restarts=0, max_concurrency=2)(ReplicaHost)
    return _ACTOR


@dataclass
class RayReplica(VLLMServer):
    """A policy server replica whose process a Ray actor holds, on the node Ray placed it on; used by the serve
    stage like a :class:`VLLMServer` (its HTTP methods, ``reload_weights``, ``load_lora``, ``sleep``,
    ``wake_up``, talk to ``host:port`` directly).

    Extra fields: ``index`` (0-based replica), ``num_cpus`` / ``num_gpus`` (the Ray resources its actor asks
    for), ``actor`` (the handle, once started), ``node`` (the Ray node id), ``remote_pid`` (the server's pid on
    its node), ``log`` (its log on its node)."""

    index: int = 0
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    actor: Any = None
    node: str = ""
    remote_pid: int | None = None
    log: str = ""
    placed_by_ray: bool = True

    @classmethod
    def of(cls, server: VLLMServer, *, index: int, num_cpus: float, num_gpus: float) -> "RayReplica":
        """The replica of ``server`` (not started), placed with ``num_cpus`` CPUs and ``num_gpus`` GPUs. With
        GPUs, the server keeps the devices of its ``gpus.serve`` share when that list is set and its actor runs on
        the flow's node (the trainer's devices are the rest of that node's: Ray's count only places it), else it
        takes those Ray assigns."""
        fields = {k: getattr(server, k) for k in VLLMServer.__dataclass_fields__ if k != "process"}
        if num_gpus:
            fields.update(on_gpu=True)
        return cls(**fields, index=index, num_cpus=num_cpus, num_gpus=num_gpus)

    @property
    def pid(self) -> int | None:
        return self.remote_pid

    def _spec(self) -> VLLMServer:
        """The server the actor starts: this replica's settings (its progress lines stay here: the actor's
        start reports its phases when it returns)."""
        fields = {k: getattr(self, k) for k in VLLMServer.__dataclass_fields__
                  if k not in ("process", "on_progress", "start_phases")}
        return VLLMServer(**fields)

    def actor_options(self) -> dict[str, Any]:
        """The Ray options of this replica's actor: its ``num_cpus`` and ``num_gpus``, its :func:`placement`, and
        this process's :func:`infra.ray_rollouts.worker_runtime_env` as the actor's own runtime environment
        (``RAO_HOME``: where its compile cache and log go; ``RAO_VLLM_PYTHON``: the vLLM environment its server
        starts with). Per actor because Ray keeps the environment of a process's first ``ray.init``: a later
        campaign of the same process with another ``RAO_HOME`` still starts its servers under its own."""
        from infra.ray_rollouts import worker_runtime_env

        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                "scheduling_strategy": placement(self.index, self.num_cpus, self.num_gpus),
                "runtime_env": worker_runtime_env()}

    def start(self) -> "RayReplica":
        """Place the actor (waiting at most ``start_timeout_s`` for a node with the resources: :func:`placement`),
        then start the server there (at most ``start_timeout_s`` + 90 s, the server's own limits plus its
        model listing). Raises ServiceError (the actor ended, its server with it): not placed in time, or the
        server did not start (its log named)."""
        import ray
        from ray.exceptions import GetTimeoutError

        say = self.on_progress or (lambda line: None)
        os.environ.setdefault("RAO_POLICY_API_KEY", self.api_key)  # this process's clients and its children
        say(f"vLLM: placing its Ray actor ({self.num_cpus:g} CPU, {self.num_gpus:g} GPU) and starting the server "
            f"there (its progress follows, relayed from that node)")
        actor = _actor_class().options(**self.actor_options()).remote(self._spec(),
                                                                     ray.get_runtime_context().get_node_id())
        self.actor = actor
        step, limit = "placed", self.start_timeout_s
        try:
            self.node = ray.get(actor.ready.remote(), timeout=limit)
            step, limit = "started", self.start_timeout_s + 90
            info = self._relay_start(actor, limit, say)
        except GetTimeoutError:
            self._end()
            raise ServiceError(f"policy server replica {self.index + 1} was not {step} within {limit:.0f} s"
                               + (f": no node of the Ray cluster had {self.num_cpus:g} CPU and {self.num_gpus:g} GPU "
                                  f"free for it (`ray status`)" if step == "placed" else "")) from None
        except Exception as e:  # noqa: BLE001 - the actor's own error (its ServiceError), one line
            self._end()
            raise ServiceError(_cause(e)) from None
        self.host, self.port, self.remote_pid = info["host"], int(info["port"]), int(info["pid"])
        self.node, self.log, self.start_phases = info["node"], info["log"], dict(info.get("phases") or {})
        say(f"vLLM: ready on Ray node {self.node[:8]} at {self.base_url} ({self.start_phases.get('ready', 0):.0f} s "
            f"to start; log {self.log})")
        return self

    def _relay_start(self, actor: Any, limit: float, say: Callable[[str], None]) -> dict[str, Any]:
        """``actor.start()``'s result, waited for at most ``limit`` seconds, while the start's progress lines
        (:meth:`ReplicaHost.progress`: the same phases and 20 s heartbeat as a local start's) go to ``say`` as
        they come (polled every :data:`RELAY_POLL_S` seconds). Raises GetTimeoutError past ``limit``, or what the
        actor's start raised."""
        import ray
        from ray.exceptions import GetTimeoutError

        ref = actor.start.remote()
        deadline = time.monotonic() + limit
        while True:
            done, _ = ray.wait([ref], timeout=RELAY_POLL_S)
            try:
                lines = ray.get(actor.progress.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - progress is best effort; the start's own result decides
                lines = []
            for line in lines:
                say(line)
            if done:
                return ray.get(ref)
            if time.monotonic() > deadline:
                raise GetTimeoutError(f"the start did not return within {limit:.0f} s")

    def _end(self) -> None:
        """End the actor (its server's guard then stops the server) and forget where it ran."""
        import ray

        if self.actor is not None:
            try:
                ray.kill(self.actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actor, self.remote_pid = None, None
        self.port, self.host = 0, "127.0.0.1"  # a new actor may run on another node: a new port there

    def alive(self) -> bool:
        """Whether the actor and its server process both live (False when the actor cannot be asked)."""
        if self.actor is None:
            return False
        import ray

        try:
            return bool(ray.get(self.actor.alive.remote(), timeout=60))
        except Exception:  # noqa: BLE001 - an actor lost or unreachable: the replica is not alive
            return False

    def stop(self) -> None:
        """Stop the server (through the actor), then end the actor; never raises."""
        if self.actor is None:
            return
        import ray

        try:
            ray.get(self.actor.stop.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - the actor is ended below either way; its guard stops the server
            pass
        self._end()

    def diagnosis(self) -> str:
        """What became of the server (asked of its actor), with the node; never raises."""
        if self.actor is None:
            return "the vLLM server was not started (its Ray actor is gone)"
        import ray

        try:
            state = ray.get(self.actor.diagnosis.remote(), timeout=30)
        except Exception as e:  # noqa: BLE001 - the actor itself was lost
            return f"its Ray actor was lost ({type(e).__name__}); log {self.log or 'unknown'} on node {self.node[:8]}"
        return f"{state} (Ray node {self.node[:8]}, {self.host})"


def _cause(e: BaseException) -> str:
    """One line from an exception ``ray.get`` raised: the actor's own exception's message when Ray carries it
    (``RayTaskError.cause``), else the exception's."""
    return " ".join(str(getattr(e, "cause", None) or e).split())[:300]
