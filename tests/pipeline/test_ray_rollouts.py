"""Rollouts beyond one process: the generate stage's groups as shards on a real local Ray
cluster, with a scripted policy (no vLLM).

- shards keep groups whole, and every tree's task and sampling seed do not depend on the shard count;
- the ray backend (1 and 2 shards: one and two workers at once) grows the same trees as the local backend:
  the same task ids, group sizes, rollout indices and seeds, in the same order, and each tree's policy saw
  the same request seeds (the scripted policy finishes with the seed it was sent);
- a worker killed (SIGKILL) mid-shard: Ray retries the shard in another worker process, its object is written
  once, and the stage reads exactly the shards' objects;
- a retried shard overwrites its own object, and only the object of the final result is read;
- the evaluation with backend ray (shards per mode) gives the local backend's rows and metrics.

The Ray cluster is started here (``ray.init``: a head and up to 2 worker processes, 300 MiB object store) and
shut down at the end of the module.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from rao_core.config import ConfigError, load_config
from rao_core.paths import tiny_model_path
from rao_core.policies.base import Generation, Policy, PolicyRequest
from rao_core.runtime.agent import request_seed
from rao_core.task_sampling import rollout_seed
from rao_core.tree import read_trees

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
TINY = tiny_model_path()  # resolved before any test moves RAO_HOME
needs_tok = pytest.mark.skipif(not (TINY / "tokenizer_config.json").exists(),
                               reason="tiny model tokenizer not prepared (make setup)")
REPO = Path(__file__).resolve().parents[2]


# -- scripted policies, importable by the Ray workers (Ray sends the factory by reference) --------------------
class SeedEcho(Policy):
    """Finishes every node at once with the sampling seed of its request (so a root's result is the seed of the
    tree's first request: ``request_seed(tree.seed, "0", 0)``)."""

    name = "seed-echo"

    async def generate(self, request: PolicyRequest) -> Generation:
        return Generation(text=f"```python\nfinish({request.seed!r})\n```", finish_reason="stop")


def seed_echo_policy(ctx, served) -> Policy:
    return SeedEcho()


def kill_marker(campaign: str) -> Path:
    return Path(tempfile.gettempdir()) / f"rao-test-kill-once-{campaign}"


class KillOnce(SeedEcho):
    """:class:`SeedEcho`, except that the third request this process makes (two trees of its shard answered,
    more started: mid-shard) kills the process (SIGKILL: a lost worker), once in the whole test (the first
    process to create ``marker`` writes its pid there, then dies)."""

    def __init__(self, marker: Path):
        self.marker, self.requests = marker, 0

    async def generate(self, request: PolicyRequest) -> Generation:
        self.requests += 1
        if self.requests == 3:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # once, across processes
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return await super().generate(request)


def kill_once_policy(ctx, served) -> Policy:
    return KillOnce(kill_marker(ctx.name))


# -- helpers ------------------------------------------------------------------------------------------------
def _config(name: str, **overrides):
    return load_config(None, {"name": name, "runtime.sandbox": SANDBOX, "tasks.pool_size": 8,
                              "tasks.tasks_per_iteration": 4, "algo.G": 2, "runtime.max_depth": 0,
                              "runtime.max_steps_per_node": 2, "runtime.context_window": 1024,
                              "runtime.max_new_tokens": 64, **overrides})


def _ctx(name: str, s3, tmp_path, monkeypatch, **overrides):
    from infra.stage_io import RunContext

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    return RunContext(config=_config(name, **overrides), s3=s3.settings().__dict__, mlflow_uri="")


def _served():
    from infra.stage_records import ServedEndpoint

    return ServedEndpoint(base_url="http://127.0.0.1:9/v1", model="policy")  # nothing listens: no /metrics


def _identity(trees) -> list[tuple]:
    return [(t.task_id, t.group_id, t.rollout_index, t.seed) for t in trees]


@pytest.fixture(scope="module")
def ray_cluster():
    """A real local Ray cluster: the head (GCS, raylet) and 2 CPUs, so at most 2 worker processes run shards at
    once; 300 MiB object store, no dashboard. Shut down at the end of the module."""
    ray = pytest.importorskip("ray")
    from tests.pipeline.test_policy_pool import _start_ray

    _start_ray(ray)
    try:
        yield ray
    finally:
        ray.shutdown()


# -- no services ----------------------------------------------------------------------------------------------
def test_shards_keep_groups_whole_and_every_tree_keeps_its_task_and_seed():
    from rao_core.envs import Task
    from infra.ray_rollouts import plan_shards

    tasks = [Task(task_id=f"t{i}", env="textcraft-synth") for i in range(5)]
    plans = {n: plan_shards(tasks, 3, seed=7, iteration=2, shards=n) for n in (1, 2, 3, 5, 8)}
    assert {n: [len(s.groups) for s in p] for n, p in plans.items()} == {
        1: [5], 2: [3, 2], 3: [2, 2, 1], 5: [1] * 5, 8: [1] * 5}  # at most one shard per group
    local = [(t.task_id, g, rollout_seed(7, 2, t.task_id, g)) for t in tasks for g in range(3)]
    for n, p in plans.items():
        assert [x for s in p for x in s.planned()] == local, n  # the local backend's trees, in its order
        assert [s.key for s in p] == [f"iter-2/trees/shards/shard-{i + 1}-of-{len(p)}.jsonl" for i in range(len(p))]
        assert all(g.rollouts == 3 for s in p for g in s.groups)  # a group is never split
    seeds = [x[2] for x in local]
    assert len(set(seeds)) == 15 and all(0 <= s < 2 ** 31 for s in seeds)
    assert rollout_seed(7, 2, "t0", 0) == seeds[0] != rollout_seed(7, 3, "t0", 0) != rollout_seed(8, 2, "t0", 0)
    with pytest.raises(ValueError, match="cannot shard 5 tasks x 3 rollouts into 0 shards"):
        plan_shards(tasks, 3, seed=7, iteration=2, shards=0)


def test_evaluation_shards_seed_each_tree_as_the_local_evaluation_does():
    from rao_core.envs import Task
    from rao_core.task_sampling import eval_tree_seed
    from infra.ray_rollouts import plan_eval_shards

    tasks = [Task(task_id=f"t{i}", env="textcraft-synth") for i in range(5)]
    p = plan_eval_shards(tasks, mode="single", shards=2, folder="iter-3", seed=9)
    assert [x for s in p for x in s.planned()] == [(t.task_id, 0, eval_tree_seed(9, "single", t.task_id)) for t in tasks]
    assert [s.key for s in p] == ["iter-3/eval/shards/single-shard-1-of-2.jsonl", "iter-3/eval/shards/single-shard-2-of-2.jsonl"]
    unseeded = plan_eval_shards(tasks, mode="single", shards=2, folder="iter-3")
    assert [x[2] for s in unseeded for x in s.planned()] == [None] * 5
    assert eval_tree_seed(9, "single", "t0") != eval_tree_seed(9, "recursive", "t0")


def test_request_seeds_follow_the_tree_seed_node_and_turn():
    from rao_core.runtime.agent import request_seed

    a = request_seed(12345, "0", 0)
    assert a == request_seed(12345, "0", 0) and 0 <= a < 2 ** 31
    assert len({a, request_seed(12345, "0", 1), request_seed(12345, "0.0", 0), request_seed(12346, "0", 0)}) == 4
    assert request_seed(None, "0", 0) is None


def test_the_endpoint_policy_sends_the_request_seed_to_the_server():
    """``OpenAIPolicy`` puts a request's seed into the completion request's body (vLLM's ``seed``: that request
    samples from its own generator), and sends none for an unseeded request. The HTTP exchange is a mock."""
    import asyncio

    import httpx
    from openai import AsyncOpenAI

    from rao_core.policies.openai_policy import OpenAIPolicy
    from rao_core.tree import Node

    bodies = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        return httpx.Response(200, json={
            "id": "x", "object": "text_completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "token_ids": [5],
                         "logprobs": {"tokens": ["ok"], "token_logprobs": [-0.5], "top_logprobs": None,
                                      "text_offset": [0]}}]})

    async def go():
        policy = OpenAIPolicy("http://server.invalid/v1", "policy")
        policy.client = AsyncOpenAI(base_url="http://server.invalid/v1", api_key="EMPTY", max_retries=0,
                                    http_client=httpx.AsyncClient(transport=httpx.MockTransport(answer)))
        node = Node(node_id="0", goal="g")
        for seed in (1234567, None):
            gen = await policy.generate(PolicyRequest(node=node, env="e", prompt_token_ids=[1, 2], max_tokens=4,
                                                      seed=seed))
            assert (gen.token_ids, gen.logprobs) == ([5], [-0.5])
        await policy.aclose()

    asyncio.run(go())
    assert bodies[0]["seed"] == 1234567 and "seed" not in bodies[1]
    assert bodies[0]["prompt"] == [1, 2] and bodies[0]["return_token_ids"] is True


def test_a_lost_shard_is_named_with_its_worker_and_the_retry():
    """The pipeline's line for a shard whose worker was lost (the drill below checks it on a
    real cluster)."""
    from infra.ray_rollouts import Shard, lost_line

    shard = Shard(index=1, count=4, groups=[], key="iter-1/trees/shards/shard-2-of-4.jsonl")
    crashed = type("WorkerCrashedError", (Exception,), {})()
    assert lost_line("iteration 1 generate", shard, "vm:4242@2dd65369", crashed, 1, 2) == (
        "iteration 1 generate: shard 2/4 lost (its worker vm:4242@2dd65369 died: WorkerCrashedError); redoing it, "
        "retry 1 of 2 (execution.max_retries)")
    assert "(lost before it started on a worker: WorkerCrashedError)" in lost_line("x", shard, "", crashed, 2, 2)


def test_execution_settings_default_to_local_and_refuse_bad_values():
    cfg = load_config(None)
    assert (cfg.execution.backend, cfg.execution.ray_address, cfg.execution.shards, cfg.execution.max_retries) == \
        ("local", "auto", 4, 2)
    for key, value, why in (("execution.backend", "dask", "'local' or 'ray'"), ("execution.shards", "0", "1"),
                            ("execution.ray_address", "", "valid string")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
            load_config(None, [f"{key}={value}"])
        assert "\n" not in str(e.value) and why in str(e.value), str(e.value)


def test_the_local_backend_imports_no_ray():
    """``make run`` (backend local) starts no Ray process: the pipeline's modules do not even import ray."""
    code = ("import sys, flows.campaign, tasks.stages, tasks.serve; from rao_core.config import load_config; "
            "assert load_config('configs/cpu-smoke.yaml', check_paths=False).execution.backend == 'local'; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


# -- S3, no Ray ------------------------------------------------------------------------------------------------
@needs_tok
@pytest.mark.services
def test_a_retried_shard_overwrites_its_object_and_only_the_final_result_is_read(s3_server, tmp_path, monkeypatch):
    from infra.storage import ChecksumError
    from infra.ray_rollouts import ShardError, plan_shards, read_shards, run_shard
    from tasks.stages import iteration_tasks

    ctx = _ctx("shard-overwrite", s3_server, tmp_path, monkeypatch)
    (shard,) = plan_shards(iteration_tasks(ctx, 1)[:2], 2, seed=0, iteration=1, shards=1)
    first = run_shard(ctx, 1, shard, _served(), str(TINY), seed_echo_policy)
    second = run_shard(ctx, 1, shard, _served(), str(TINY), seed_echo_policy)  # the retry: same key
    assert first.uri == second.uri and first.sha256 != second.sha256  # new tree ids and timings
    store = ctx.store()
    assert store.list("iter-1/trees/shards/") == ["iter-1/trees/shards/shard-1-of-1.jsonl"]
    trees = read_shards(ctx, "iteration 1 generate", [shard], [second])
    assert _identity(trees) == [(t, t, g, s) for t, g, s in shard.planned()]
    assert [t.root.result for t in trees] == [request_seed(t.seed, "0", 0) for t in trees]  # seeds reached the policy
    with pytest.raises(ChecksumError, match="checksum mismatch for s3://rao/shard-overwrite/iter-1/trees/shards/"):
        read_shards(ctx, "iteration 1 generate", [shard], [first])  # the object of an earlier attempt is never read as this one's
    lines = store.get_bytes(shard.key).decode().splitlines()
    half = store.put_bytes(("\n".join(lines[:3]) + "\n").encode(), shard.key)  # a shard short of one tree
    with pytest.raises(ShardError, match=r"holds 3 trees, not the 4 planned for shard 1/1 \(missing \[\("):
        read_shards(ctx, "iteration 1 generate", [shard], [second.model_copy(update={"sha256": half["sha256"]})])
    with pytest.raises(ShardError, match="shard 1/1 returned no result"):
        read_shards(ctx, "iteration 1 generate", [shard], [])


# -- a real Ray cluster ----------------------------------------------------------------------------------------
@needs_tok
@pytest.mark.services
@pytest.mark.timeout(900)
def test_the_ray_backend_grows_the_same_trees_as_the_local_backend(ray_cluster, s3_server, tmp_path, monkeypatch):
    """One generate stage with backend local, then ray with 1 shard (one worker) and 2 shards (two workers at
    once): the same trees (task ids, group sizes, rollout indices, seeds, results), the same GenerateOutput
    counts; the ray runs leave exactly their shards' objects."""
    import tasks.stages as stages

    monkeypatch.setattr(stages, "_policy", seed_echo_policy)
    runs = {}
    for name, over in (("eq-local", {}), ("eq-ray-1", {"execution.backend": "ray", "execution.shards": 1}),
                       ("eq-ray-2", {"execution.backend": "ray", "execution.shards": 2})):
        ctx = _ctx(name, s3_server, tmp_path / name, monkeypatch, **over)
        out = stages.generate_trees.fn(ctx, 1, _served(), str(TINY))
        trees = read_trees(stages.fetch(ctx, out.trees_uri, "iter-1/fetched.jsonl"))
        runs[name] = (ctx, out, trees)
    local = runs["eq-local"][2]
    assert len(local) == 8 and Counter(t.task_id for t in local) == {t.task_id: 2 for t in local}
    assert all(t.seed == rollout_seed(0, 1, t.task_id, t.rollout_index) for t in local)
    assert [t.root.result for t in local] == [request_seed(t.seed, "0", 0) for t in local]  # reached the policy
    for name in ("eq-ray-1", "eq-ray-2"):
        ctx, out, trees = runs[name]
        assert _identity(trees) == _identity(local), name
        assert [t.root.result for t in trees] == [t.root.result for t in local], name
        assert (out.num_trees, out.crashed, out.infra_failures) == (8, 0, {}), name
        n = int(name[-1])
        assert ctx.store().list("iter-1/trees/shards/") == [
            f"iter-1/trees/shards/shard-{i}-of-{n}.jsonl" for i in range(1, n + 1)], name
        assert sorted({t.meta["shard"] for t in trees}) == [f"{i}/{n}" for i in range(1, n + 1)]
    assert not any("shard" in t.meta for t in local)


@needs_tok
@pytest.mark.services
@pytest.mark.timeout(900)
def test_the_ray_backend_evaluates_as_the_local_backend(ray_cluster, s3_server, tmp_path, monkeypatch):
    """The evaluation of an iteration (3 validation tasks, recursive and single) with backend ray and 2 shards
    per mode gives the local backend's rows (every field but wall times) and metrics; its trees go through the
    shard objects ``iter-1/eval/shards/<mode>-shard-<i>-of-2.jsonl``."""
    import tasks.stages as stages

    monkeypatch.setattr(stages, "_policy", seed_echo_policy)
    ev = {"eval.n_tasks": 3, "eval.modes": ["recursive", "single"], "eval.benchmarks": {}}
    out = {}
    for name, over in (("ev-local", {}), ("ev-ray", {"execution.backend": "ray", "execution.shards": 2})):
        ctx = _ctx(name, s3_server, tmp_path / name, monkeypatch, **ev, **over)
        out[name] = (ctx, stages.run_evaluation(ctx, _served(), str(TINY), 1))
    def timeless(rows):  # the stored trees carry timings too: compared by their nodes' outcomes
        return [{**{k: v for k, v in r.items() if "wall" not in k and k != "trees"},
                 "trees": sorted((t["task_id"], [(n["node_id"], n["end_reason"], n.get("verifier"))
                                                 for n in t["nodes"]]) for t in r.get("trees", []))} for r in rows]

    local = timeless(out["ev-local"][1].rows)
    assert [(r["mode"], r["n"]) for r in local] == [("recursive", 3), ("single", 3)] and local[0]["trees"]
    assert timeless(out["ev-ray"][1].rows) == local
    metrics = {k: v for k, v in out["ev-local"][1].metrics.items() if "wall" not in k}
    assert {k: v for k, v in out["ev-ray"][1].metrics.items() if "wall" not in k} == metrics
    assert out["ev-ray"][0].store().list("iter-1/eval/shards/") == [
        f"iter-1/eval/shards/{m}-shard-{i}-of-2.jsonl" for m in ("recursive", "single") for i in (1, 2)]
    assert out["ev-local"][0].store().list("iter-1/eval/") == []  # the local backend writes no shard
    from rao_core.task_sampling import eval_tree_seed

    for name, (ctx, res) in out.items():  # both backends seed each tree from eval.seed, its mode and its task
        got = [(r["mode"], t["task_id"], t["seed"]) for r in res.rows for t in r.get("trees", [])]
        assert got and all(s == eval_tree_seed(ctx.config.eval.seed, m, tid) for m, tid, s in got), (name, got)


@needs_tok
@pytest.mark.services
@pytest.mark.timeout(900)
def test_a_worker_killed_mid_shard_is_retried_and_its_trees_written_once(ray_cluster, s3_server, tmp_path,
                                                                        monkeypatch, caplog, capfd):
    """The worker growing one of the 2 shards is SIGKILLed by its policy at its third request (two trees
    answered, the others started: mid-shard, before its object is written): Ray retries the shard in another
    worker process, which regrows all its trees (same seeds) and writes the shard's object; the stage reads
    exactly the 2 shards' objects: 8 trees, each (task, rollout) once, each shard's from one worker, not the
    killed one; the killed attempt's scratch folder (its REPLs' work folders) is gone. The pipeline says so in
    one line naming the shard, the lost worker (pid and node) and the retry, and Ray's own
    "(raylet)" line reaches the piped output without colour codes."""
    import logging
    import re

    import tasks.stages as stages

    name = f"drill-{os.getpid()}"
    ctx = _ctx(name, s3_server, tmp_path, monkeypatch, **{"execution.backend": "ray", "execution.shards": 2,
                                                          "execution.max_retries": 1})
    monkeypatch.setattr(stages, "_policy", kill_once_policy)
    marker = kill_marker(name)
    marker.unlink(missing_ok=True)
    try:
        with caplog.at_level(logging.INFO, logger="rao"):
            out = stages.generate_trees.fn(ctx, 1, _served(), str(TINY))
        killed = int(marker.read_text())  # a worker did die mid-shard
    finally:
        marker.unlink(missing_ok=True)
    trees = read_trees(stages.fetch(ctx, out.trees_uri, "iter-1/fetched.jsonl"))
    pairs = [(t.task_id, t.rollout_index) for t in trees]
    assert out.num_trees == 8 and len(pairs) == len(set(pairs)) == 8 and out.infra_failures == {}
    assert [t.root.result for t in trees] == [request_seed(rollout_seed(0, 1, t.task_id, t.rollout_index), "0", 0)
                                              for t in trees]
    assert ctx.store().list("iter-1/trees/shards/") == ["iter-1/trees/shards/shard-1-of-2.jsonl",
                                                        "iter-1/trees/shards/shard-2-of-2.jsonl"]
    assert not list(Path(tempfile.gettempdir()).glob(f"rao-shard-{name}-*"))  # the lost worker's scratch removed
    workers = {shard: {t.meta["worker"] for t in trees if t.meta["shard"] == shard} for shard in ("1/2", "2/2")}
    assert all(len(w) == 1 for w in workers.values()), workers  # one (final) attempt's trees per shard
    assert all(f":{killed}@" not in w for (w,) in workers.values()), (killed, workers)  # grown elsewhere
    lost = [r.getMessage() for r in caplog.records if " lost (" in r.getMessage()]
    assert len(lost) == 1 and re.fullmatch(
        rf"iteration 1 generate: shard [12]/2 lost \(its worker [^ ]+:{killed}@[0-9a-f]{{8}} died: "
        rf"\w+Error\); redoing it, retry 1 of 1 \(execution.max_retries\)", lost[0]), lost
    out_err = "".join(capfd.readouterr())
    assert "\x1b[" not in out_err, out_err[-2000:]  # Ray's lines, piped: no colour codes
