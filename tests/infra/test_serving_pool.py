"""The serving policy of ``infra.serving_pool.plan_switch``, checked without a server.

Which servers serve a checkpoint and how each replica comes to serve it (start, LoRA adapter load, weight reload,
restart; external servers), decided from the config, the checkpoint and the pool's state. The switch itself (fake
vLLM servers) is ``tests/pipeline/test_policy_pool.py``."""

from __future__ import annotations

import pytest

from infra.process import ServiceError
from infra.serving_pool import PoolView, needs_checkpoint_files, plan_switch, server_kind
from rao_core.config import load_config


def _cfg(*sets: str):
    return load_config(None, ["name=plan", *sets])


def test_a_new_pool_starts_on_full_weights_or_on_the_base_then_the_adapter():
    full = plan_switch(_cfg("serving.replicas=2"), "iter-0", lora=False)
    assert (full.kind, full.jobs, full.adapter, full.weights, full.starts) == \
        ("local", ("start", "start"), None, "fresh", True)
    cfg = _cfg("serving.switch=lora", "trainer.lora={r: 8}")
    adapter = plan_switch(cfg, "iter-3", lora=True)
    assert (adapter.jobs, adapter.adapter, adapter.weights) == (("start+lora",), "iter-3", "fresh")
    dead = plan_switch(cfg, "iter-3", lora=True, pool=PoolView(alive=(False,), served="iter-2"))  # all died
    assert dead == adapter


@pytest.mark.parametrize("switch, lora, how, adapter, weights", [
    ("lora", True, "lora", "iter-2", ""),  # a LoRA adapter: loaded, the served folder left alone
    ("reload", False, "reload", None, "over"),  # full weights: copied over the folder, reloaded in place
    ("restart", False, "restart", None, "over"),
    ("lora", False, "restart", None, "over"),  # full weights under switch lora: a restart
])
def test_a_running_pool_switches_by_serving_switch_and_the_checkpoint(switch, lora, how, adapter, weights):
    cfg = _cfg("serving.replicas=2", f"serving.switch={switch}", "trainer.lora={r: 8}")
    plan = plan_switch(cfg, "iter-2", lora, PoolView(alive=(True, True), served="iter-1", lora=None))
    assert (plan.jobs, plan.adapter, plan.weights, plan.replace) == ((how, how), adapter, weights, ())
    assert plan.starts is (how == "restart")


def test_the_served_checkpoint_stays_and_a_dead_replica_is_started_again_with_the_adapter():
    cfg = _cfg("serving.replicas=2", "serving.switch=lora", "trainer.lora={r: 8}")
    same = plan_switch(cfg, "iter-2", True, PoolView(alive=(True, True), served="iter-2", lora="iter-2"))
    assert (same.jobs, same.adapter, same.starts) == (("same", "same"), "iter-2", False)
    lost = plan_switch(cfg, "iter-3", True, PoolView(alive=(True, False), served="iter-2", lora="iter-2"))
    assert (lost.jobs, lost.replace, lost.adapter) == (("lora", "start+lora"), (1,), "iter-3")
    reload = plan_switch(_cfg("serving.replicas=2"), "iter-3", False, PoolView(alive=(False, True), served="iter-2"))
    assert (reload.jobs, reload.replace, reload.weights) == (("start", "reload"), (0,), "over")


def test_the_ray_backend_places_replicas_with_their_resources():
    cfg = _cfg("execution.backend=ray", "serving.replicas=2", "execution.cpus_per_replica=1.5",
               "serving.tensor_parallel_size=2")
    assert server_kind(cfg) == "ray"
    on_gpus = plan_switch(cfg, "iter-0", False, cluster_gpus=True)
    assert (on_gpus.kind, on_gpus.jobs, on_gpus.num_cpus, on_gpus.num_gpus) == ("ray", ("start", "start"), 1.5, 2)
    assert plan_switch(cfg, "iter-0", False).num_gpus == 0  # a cluster without GPUs: none asked for
    off = _cfg("execution.backend=ray", "execution.ray_replicas=false")
    assert server_kind(off) == "local" and plan_switch(off, "iter-0", False).num_cpus == 0  # processes of the flow


def test_external_servers_get_adapters_keep_their_weights_or_refuse_new_full_weights():
    lora = _cfg("serving.base_urls=[\"http://a/v1\", \"http://b/v1\"]", "serving.switch=lora", "trainer.lora={r: 8}")
    assert server_kind(lora) == "external" and needs_checkpoint_files(lora)
    plan = plan_switch(lora, "iter-1", True, PoolView(served="iter-0"))
    assert (plan.jobs, plan.adapter, plan.weights, plan.starts) == (("external-lora",) * 2, "iter-1", "", False)
    assert plan_switch(lora, "iter-1", False, PoolView(served="iter-0")).jobs == ("external",) * 2
    full = _cfg("serving.base_url=http://a/v1", "iterations=0")  # switch reload: allowed without training
    assert not needs_checkpoint_files(full)  # never fetched: its files would go nowhere
    assert plan_switch(full, "iter-0", False, PoolView(served="iter-0")).jobs == ("external",)
    assert plan_switch(full, "iter-0", False).jobs == ("external",)  # the first checkpoint: what it serves
    with pytest.raises(ServiceError, match="new full weights cannot be sent to an external server"):
        plan_switch(full, "iter-1", False, PoolView(served="iter-0"))
    keep = _cfg("serving.base_url=http://a/v1", "serving.switch=none")
    assert plan_switch(keep, "iter-1", False, PoolView(served="iter-0")).jobs == ("external",)
