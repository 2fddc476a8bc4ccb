"""Policy server replicas placed by Ray (``infra/ray_serving.py``), on a real local Ray cluster.

The replicas' servers are fake vLLM processes (``tests/pipeline/fake_vllm_main.py``, run through a stand-in
python given as ``RAO_VLLM_PYTHON``), started by the replicas' Ray actors in the actors' own processes: the
placement, the switch, a lost server, a lost actor (its guard stops the server) and the clean stop are the
real code paths; only vLLM is not. The real-vLLM pool is ``test_policy_pool``'s last test.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest

from rao_core.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _wait(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.fixture
def ray_pool(tmp_path, monkeypatch):
    """A real local Ray cluster of 4 logical CPUs whose replica actors start fake vLLM servers; yields
    ``(ray, served_root)``. The serve stage's pool is stopped before and after."""
    ray = pytest.importorskip("ray")
    from tasks import serve
    from tests.pipeline.test_policy_pool import _start_ray

    fake_python = tmp_path / "fake-python"
    fake_python.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.pipeline.fake_vllm_main \"$@\"\n")
    fake_python.chmod(fake_python.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("RAO_VLLM_PYTHON", str(fake_python))
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    serve.shutdown_server()
    _start_ray(ray, num_cpus=4)
    try:
        yield ray
    finally:
        serve.shutdown_server()
        ray.shutdown()


def _ctx(*sets: str):
    from infra.stage_io import RunContext

    cfg = load_config(None, ["name=ray-pool", "execution.backend=ray", "serving.replicas=2", *sets])
    return RunContext(config=cfg, s3={"endpoint_url": "http://127.0.0.1:9", "bucket": "rao"}, mlflow_uri="")


def _ckpt(tmp_path: Path, name: str):
    from infra.stage_records import Checkpoint

    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"name": name}))
    return Checkpoint(name=name, local=str(d))


def _fake_record(ctx, port: int) -> dict:
    return json.loads((ctx.local("served").parent / f"fake-{port}.json").read_text())


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _posts(url: str) -> list[str]:
    import httpx

    return httpx.get(url.removesuffix("/v1") + "/fake/posts", timeout=10).json()


@pytest.mark.services
@pytest.mark.timeout(600)
def test_replicas_are_ray_actors_that_take_the_switch_and_are_replaced_when_lost(ray_pool, tmp_path):
    """2 replicas on a local Ray cluster: each a Ray actor (1 CPU reserved) whose process started its server
    on the node's IP; the switch to iter-1 reloads both through their own URLs; a server killed between
    iterations is replaced by a new actor (the old one ended) while the other reloads; an actor killed outright
    takes its server's whole process group down (Ray kills the worker's children, the
    server's leader; the guard, detached from the worker, stops the rest of the group); the pool's stop ends
    every actor and each server's whole process group."""
    ray = ray_pool
    from infra.ray_serving import RayReplica
    from tasks import serve

    ctx = _ctx("execution.cpus_per_replica=1")
    first = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-0"))
    servers = list(serve.POOL.servers)
    assert [r.how for r in first.replicas] == ["start", "start"] and len(set(first.urls)) == 2
    assert all(isinstance(s, RayReplica) and s.actor is not None for s in servers)
    node_ip = ray.util.get_node_ip_address()
    records = [_fake_record(ctx, s.port) for s in servers]
    for s, rec in zip(servers, records):
        assert s.base_url == f"http://{node_ip}:{s.port}/v1" and rec["host"] == node_ip
        assert rec["pid"] == s.pid and rec["ppid"] != os.getpid()  # started by the actor's process, not here
        assert "ray" in " ".join(psutil.Process(rec["ppid"]).cmdline()).lower()
        assert "--host" in rec["argv"] and rec["argv"][rec["argv"].index("--host") + 1] == node_ip
    assert [rec["bind"] for rec in records] == ["0", "1"]  # each its share of this machine's 2 cores
    assert ray.available_resources().get("CPU", 0) == 2.0  # 4 - 1 CPU held by each replica's actor

    second = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-1"))
    assert [(r.checkpoint, r.how, r.base_url) for r in second.replicas] == \
        [("iter-1", "reload", u) for u in first.urls]
    assert all(_posts(u)[:2] == ["/collective_rpc", "/reset_prefix_cache"] for u in first.urls)

    old = servers[1]
    old_actor = old.actor
    os.kill(old.pid, signal.SIGKILL)  # replica 2's server lost; its actor lives on
    assert _wait(lambda: not old.alive())  # (the kill lands at once; the actor's check may run first)
    third = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-2"))
    assert [(r.checkpoint, r.how) for r in third.replicas] == [("iter-2", "reload"), ("iter-2", "start")]
    assert third.urls[0] == first.urls[0] and third.urls[1] != first.urls[1]
    with pytest.raises(ray.exceptions.RayActorError):  # the old actor was ended, not left holding its CPU
        ray.get(old_actor.alive.remote(), timeout=30)
    assert "the vLLM server (pid" in serve.server_diagnosis(ctx) and "Ray node" in serve.server_diagnosis(ctx)

    lost = serve.POOL.servers[0]
    group = [lost.pid, _fake_record(ctx, lost.port)["child"]]  # the server and the child in its group
    assert all(_running(p) for p in group)
    ray.kill(lost.actor)  # an actor lost outright (its node's worker killed): its guard stops the server's group
    assert _wait(lambda: not any(_running(p) for p in group), 40)
    assert not lost.alive()
    groups = [[s.pid, _fake_record(ctx, s.port)["child"]] for s in serve.POOL.servers[1:]]
    assert all(_running(p) for g in groups for p in g)  # each server and the child in its process group
    serve.shutdown_server()
    assert _wait(lambda: not any(_running(p) for g in groups for p in g))  # every group stopped by its actor
    assert _wait(lambda: ray.available_resources().get("CPU", 0) == 4.0)  # every actor ended


@pytest.mark.services
@pytest.mark.timeout(300)
def test_replicas_the_cluster_cannot_hold_or_that_starve_the_shards_fail_at_once(ray_pool, tmp_path):
    from infra.process import ServiceError
    from tasks import serve

    ctx = _ctx("execution.cpus_per_replica=8")
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match=r"^a policy server replica asks Ray for 8 CPU and 0 GPU, and no node of "
                                           r"the cluster has that many \(execution.cpus_per_replica"):
        serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-0"))
    assert time.monotonic() - t0 < 60
    with pytest.raises(ServiceError, match=r"the Ray cluster has 4 CPUs: 2 policy server replica\(s\) x "
                                           r"execution.cpus_per_replica 2 would leave 0, fewer than one shard's"):
        serve.serve_checkpoint.fn(_ctx("execution.cpus_per_replica=2"), _ckpt(tmp_path, "iter-0"))


def test_the_local_backend_and_ray_replicas_off_keep_processes_of_the_flow(tmp_path):
    """No Ray: ``execution.backend local`` (or ``ray_replicas: false``) builds plain VLLMServer processes."""
    from infra.ray_serving import RayReplica
    from infra.serving import VLLMServer, server_from_config

    for sets in ([], ["execution.backend=ray", "execution.ray_replicas=false"]):
        cfg = load_config(None, ["name=x", "serving.replicas=2", *sets])
        server = server_from_config(cfg, tmp_path, replica=1, on_gpu=False)
        assert type(server) is VLLMServer and server.host == "127.0.0.1"
    def replica(*sets: str):
        cfg = load_config(None, ["name=x", "serving.replicas=2", *sets])
        return RayReplica.of(server_from_config(cfg, tmp_path, replica=1, on_gpu=True), index=1, num_cpus=1,
                             num_gpus=1)

    explicit, assigned = replica("gpus.serve=[0,1]"), replica()
    assert explicit.gpus == [1] and assigned.gpus == [] and explicit.on_gpu and assigned.on_gpu
    assert explicit.pid is None and not explicit.alive() and type(explicit._spec()) is VLLMServer
    assert explicit._spec()._env()["CUDA_VISIBLE_DEVICES"] == "1"  # gpus.serve's device, not Ray's
    assert "CUDA_VISIBLE_DEVICES" not in assigned._spec()._env()  # Ray's, from the actor's environment


def test_replicas_that_ask_for_nothing_go_round_robin_over_the_nodes(monkeypatch):
    """A replica with no CPU and no GPU is pinned (hard affinity) to the index-th alive node, ids sorted; one that
    asks for resources is SPREAD."""
    ray = pytest.importorskip("ray")
    from infra.ray_serving import placement

    a, b, c = ("a" * 56, "b" * 56, "c" * 56)  # node ids: 28 bytes in hex
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": b, "Alive": True}, {"NodeID": c, "Alive": False},
                                               {"NodeID": a, "Alive": True}])
    got = [placement(i, 0, 0) for i in range(3)]
    assert [(s.node_id, s.soft) for s in got] == [(a, False), (b, False), (a, False)]
    assert placement(0, 1, 0) == placement(0, 0, 1) == "SPREAD"


def test_a_replica_listens_on_the_address_its_node_was_registered_with(monkeypatch):
    """``ray start --node-ip-address`` is the address the other nodes use: the replica's host is the node's
    registered one, not this host's default address (the fallback for a node Ray does not list)."""
    ray = pytest.importorskip("ray")
    from infra.ray_serving import node_address

    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": "a" * 56, "NodeManagerAddress": "10.1.2.3", "Alive": True}])
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "192.0.2.9")
    assert (node_address("a" * 56), node_address("b" * 56)) == ("10.1.2.3", "192.0.2.9")


def test_a_replicas_actor_carries_this_processs_worker_environment_over_the_jobs(tmp_path, monkeypatch):
    """The actor's options: its resources, its placement, and the worker environment of the moment it starts
    (``RAO_HOME``, ``RAO_VLLM_PYTHON`` set after the process joined Ray reach the actor, whose server reads
    them), since Ray keeps the environment of the process's first ``ray.init``."""
    pytest.importorskip("ray")
    from infra.ray_serving import RayReplica
    from infra.serving import server_from_config

    cfg = load_config(None, ["name=x", "serving.replicas=2"])
    replica = RayReplica.of(server_from_config(cfg, tmp_path, replica=1, on_gpu=False), index=1, num_cpus=2,
                            num_gpus=0)
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "second-home"))
    monkeypatch.setenv("RAO_VLLM_PYTHON", str(tmp_path / "second-python"))
    opts = replica.actor_options()
    assert (opts["num_cpus"], opts["num_gpus"], opts["scheduling_strategy"]) == (2, 0, "SPREAD")
    env = opts["runtime_env"]["env_vars"]
    assert env["RAO_HOME"] == str(tmp_path / "second-home")
    assert env["RAO_VLLM_PYTHON"] == str(tmp_path / "second-python")
    assert str(REPO) in env["PYTHONPATH"].split(os.pathsep)
