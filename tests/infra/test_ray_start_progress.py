"""No silent start under the Ray backend: a replica's server starts inside its Ray actor, whose progress lines
(``infra.serving.StartupWatch``: the phases, and a heartbeat with the log's last line after 20 s of silence) are
relayed to the flow's log while the start runs, as a local start's are. Ray's calls are faked here; the real
actors are ``tests/pipeline/test_ray_replicas.py``'s."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Ref:
    def __init__(self, get, ready=lambda: True):
        self.get, self.ready = get, ready


def _fake_ray(monkeypatch, on_wait):
    """``ray.wait`` runs ``on_wait()`` (the server's side moving on) then says whether the ref is ready;
    ``ray.get`` returns the ref's value."""
    ray = pytest.importorskip("ray")

    def wait(refs, timeout=None):
        on_wait()
        return ([r for r in refs if r.ready()], [r for r in refs if not r.ready()])

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref.get())


def _replica_host(tmp_path):
    from infra.ray_serving import ReplicaHost
    from infra.serving import StartupWatch, VLLMServer

    host = ReplicaHost(VLLMServer(tmp_path / "model"))
    log = tmp_path / "vllm-20001.log"
    log.write_text("")
    clock = Clock()
    watch = StartupWatch(log, host._guard, pid=lambda: 4242, clock=clock, heartbeat_s=20.0)
    return host, log, clock, watch


def test_a_replicas_start_is_relayed_with_its_phases_and_the_20_s_heartbeat(tmp_path, monkeypatch):
    from infra.ray_serving import RayReplica

    host, log, clock, watch = _replica_host(tmp_path)
    polls = {"n": 0}

    def server_moves_on():  # each poll of the driver: 10 s of the server's start, its watch polled
        polls["n"] += 1
        if polls["n"] == 2:
            with log.open("a") as f:
                f.write("INFO 12-02 [cpu_model_runner.py:68] Starting to load model /x/served...\n")
        clock.t += 10
        watch.poll()

    _fake_ray(monkeypatch, server_moves_on)
    actor = SimpleNamespace(start=SimpleNamespace(remote=lambda: Ref(lambda: {"port": 20001},
                                                                     ready=lambda: polls["n"] >= 5)),
                            progress=SimpleNamespace(remote=lambda: Ref(host.progress)))
    said: list[str] = []
    info = RayReplica(tmp_path / "model")._relay_start(actor, 600, said.append)
    assert info == {"port": 20001}
    assert said == [
        f"vLLM start: process up (pid 4242), log {log}",
        "vLLM start: loading weights (20 s)",
        "vLLM start: still starting, 40 s, after loading weights; its last log line: INFO "
        "[cpu_model_runner.py:68] Starting to load model /x/served...",
    ]
    assert host.progress() == []  # each line relayed once


def test_a_replica_start_past_its_limit_still_relays_what_it_said(tmp_path, monkeypatch):
    from ray.exceptions import GetTimeoutError

    from infra.ray_serving import RayReplica

    host, log, clock, watch = _replica_host(tmp_path)

    def server_moves_on():
        clock.t += 30
        watch.poll()

    _fake_ray(monkeypatch, server_moves_on)
    actor = SimpleNamespace(start=SimpleNamespace(remote=lambda: Ref(lambda: {}, ready=lambda: False)),
                            progress=SimpleNamespace(remote=lambda: Ref(host.progress)))
    said: list[str] = []
    with pytest.raises(GetTimeoutError):
        RayReplica(tmp_path / "model")._relay_start(actor, 0, said.append)
    assert said == [f"vLLM start: process up (pid 4242), log {log}"]
