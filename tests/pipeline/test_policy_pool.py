"""A pool of policy servers: ``serving.replicas`` / ``serving.base_urls``, every tree pinned to
one replica, trees spread by load, a checkpoint switch that reaches every replica, a replica lost mid-run.

Fake OpenAI-compatible servers (:class:`FakeVLLM`, in this process, stdlib HTTP) stand for vLLM: they answer
``/v1/completions`` token-in/token-out, list their models and adapters, take ``/collective_rpc`` reloads and
``/v1/load_lora_adapter``, export ``vllm:request_success_total`` on ``/metrics``, and can die (every request,
on any connection, is then cut without an answer and the port closes). Which tree a request came from is told
by its sampling seed (``request_seed(tree.seed, node, turn)``: unique per request of a seeded tree).

The last test (marked ``vllm``) runs 2 real vLLM replicas of the tiny model with backend ray.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from infra.serving import has_cuda_gpu
from rao_core.config import ConfigError, load_config
from rao_core.paths import tiny_model_path
from rao_core.policies.base import Generation, Policy, PolicyError, PolicyRequest
from rao_core.runtime.agent import request_seed
from rao_core.tree import EndReason, Node

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
TINY = tiny_model_path()
needs_tok = pytest.mark.skipif(not (TINY / "tokenizer_config.json").exists(),
                               reason="tiny model tokenizer not prepared (make setup)")
GPU8 = "configs/gpu-qwen3-4b.yaml"
CELL = "```python\nprint('hello')\n```\n"


class FakeVLLM:
    """A fake vLLM OpenAI server on 127.0.0.1 (random port). ``die_after``: after that many answered completions
    the next one is cut and the server is dead (every later request too, then the port is closed)."""

    def __init__(self, name: str = "policy", die_after: int | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.name, self.die_after = name, die_after
        self.completions: list[dict[str, Any]] = []  # bodies answered
        self.posts: list[str] = []  # other POST paths
        self.adapters: list[str] = []
        self.dead = False
        self.fail_reload = False
        self._lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, status: int, payload: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _cut(self) -> None:  # a dead server: the connection closes without an answer
                self.close_connection = True
                try:
                    self.connection.shutdown(2)
                except OSError:
                    pass

            def do_GET(self) -> None:  # noqa: N802
                if outer.dead:
                    return self._cut()
                if self.path == "/health":
                    return self._send(200, b"{}")
                if self.path == "/fake/posts":  # for a test that runs the fake in another process
                    return self._send(200, json.dumps(outer.posts).encode())
                if self.path.endswith("/models"):
                    ids = [outer.name, *outer.adapters]
                    return self._send(200, json.dumps({"object": "list", "data": [{"id": i} for i in ids]}).encode())
                if self.path == "/metrics":
                    text = f'vllm:request_success_total{{finished_reason="stop"}} {len(outer.completions)}\n'
                    return self._send(200, text.encode(), "text/plain")
                self._send(404, b"{}")

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                with outer._lock:
                    if not outer.dead and outer.die_after is not None and len(outer.completions) >= outer.die_after \
                            and self.path.endswith("/completions"):
                        outer.kill()
                    if outer.dead:
                        return self._cut()
                    if not self.path.endswith("/completions"):
                        outer.posts.append(self.path)
                if self.path == "/collective_rpc" and outer.fail_reload:
                    return self._send(500, b'{"error": "reload failed"}')
                if self.path.endswith("/load_lora_adapter"):
                    outer.adapters.append(body["lora_name"])
                if not self.path.endswith("/completions"):
                    return self._send(200, b"{}")
                with outer._lock:
                    outer.completions.append(body)
                ids = [100 + (ord(c) % 200) for c in CELL]
                out = {"id": "x", "object": "text_completion", "created": 0, "model": body["model"],
                       "choices": [{"index": 0, "text": CELL, "finish_reason": "stop", "token_ids": ids,
                                    "prompt_token_ids": body["prompt"],
                                    "logprobs": {"tokens": list(CELL), "token_logprobs": [-0.5] * len(ids),
                                                 "top_logprobs": None, "text_offset": list(range(len(ids)))}}]}
                self._send(200, json.dumps(out).encode())

        self.host = host
        self.httpd = ThreadingHTTPServer((host, port), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def kill(self) -> None:
        """Die: every request from now on is cut; the listening port closes."""
        self.dead = True

        def close() -> None:
            self.httpd.shutdown()
            self.httpd.server_close()

        threading.Thread(target=close, daemon=True).start()

    def seeds(self) -> set[int]:
        return {b["seed"] for b in self.completions if "seed" in b}


@pytest.fixture
def fakes():
    made: list[FakeVLLM] = []

    def make(**kw) -> FakeVLLM:
        made.append(FakeVLLM(**kw))
        return made[-1]

    yield make
    for f in made:
        if not f.dead:
            f.kill()


def _runtime(**kw):
    from rao_core.runtime import RuntimeConfig

    return RuntimeConfig(**{"max_depth": 0, "max_steps_per_node": 2, "context_window": 2048, "max_new_tokens": 64,
                            "sandbox": SANDBOX, "repl_pool_size": 0, "policy_timeout_s": 30, "tree_timeout_s": 120,
                            **kw})


def _tree_seeds(tree) -> set[int]:
    """The sampling seeds of every request tree ``tree`` made (one per turn of each node)."""
    return {request_seed(tree.seed, n.node_id, k) for n in tree.nodes for k in range(len(n.turns))}


async def _grow(pool, n_tasks: int, G: int, runtime=None):
    from rao_core.envs import get_env
    from rao_core.runtime import load_tokenizer, run_trees

    from rao_core.task_sampling import sample_tasks

    env = get_env("textcraft-synth")

    tasks = sample_tasks(env, seed=3, stream="pool-test", difficulties=["easy"], n=n_tasks, split="train")
    try:
        return await run_trees(env, [(t, G) for t in tasks], pool, runtime or _runtime(),
                               tokenizer=load_tokenizer(str(TINY)), progress=False,
                               seeds=lambda task, g: 1000 * (tasks.index(task) + 1) + g)
    finally:
        await pool.aclose()


# -- configuration ----------------------------------------------------------------------------------------------
def test_serving_replicas_and_base_urls_are_validated_with_one_line_errors():
    cfg = load_config(None)
    assert (cfg.serving.replicas, cfg.serving.base_urls, cfg.serving.pool_size) == (1, [], 1)
    two = load_config(None, ["serving.replicas=2"])
    assert two.serving.pool_size == 2 and two.serving.external_urls == []
    ext = load_config(None, ['serving.base_urls=["http://a:8000/v1", "http://b:8000/v1"]', "serving.switch=none"])
    assert ext.serving.external_urls == ["http://a:8000/v1", "http://b:8000/v1"] and ext.serving.pool_size == 2
    bad = [(["serving.replicas=0"], "serving.replicas = 0: Input should be greater than or equal to 1"),
           (['serving.base_urls=["ftp://a/v1"]'], "'ftp://a/v1' is not an http(s) URL with a host"),
           (['serving.base_urls=["http://a/v1", "http://a/v1"]'], "'http://a/v1' is listed twice"),
           (['serving.base_urls=["http://a/v1"]', "serving.base_url=http://b/v1", "serving.switch=none"],
            "serving.base_url and serving.base_urls are both set"),
           (['serving.base_urls=["http://a/v1"]', "serving.replicas=2", "serving.switch=none"],
            "serving.replicas = 2 with an external server (serving.base_urls)"),
           (['serving.base_urls=["http://a/v1"]'], "serving.base_urls is set with serving.switch 'reload'")]
    for sets, why in bad:
        with pytest.raises(ConfigError) as e:
            load_config(None, sets)
        assert why in str(e.value) and "\n" not in str(e.value), (sets, str(e.value))
    with pytest.raises(ConfigError, match=r"gpus.serve has 4 GPUs but serving.replicas x tensor_parallel_size x "
                                          r"data_parallel_size = 2 x 1 x 4 = 8"):
        load_config(GPU8, ["serving.replicas=2"], check_paths=False)
    assert load_config(GPU8, ["serving.replicas=4", "serving.data_parallel_size=1"], check_paths=False)


def test_the_environment_url_replaces_a_pool(monkeypatch):
    monkeypatch.setenv("RAO_POLICY_BASE_URL", "http://h:1/v1")
    cfg = load_config(None, ["serving.replicas=3"]).with_env_overrides()
    assert (cfg.serving.base_url, cfg.serving.base_urls, cfg.serving.replicas) == ("http://h:1/v1", [], 1)


def test_each_replica_gets_its_share_of_the_gpus_or_cores(tmp_path):
    from infra.process import ServiceError
    from infra.serving import cpu_share, server_from_config

    assert [cpu_share(i, 2, [0, 1, 2, 3, 4]) for i in range(2)] == [[0, 1, 2], [3, 4]]
    with pytest.raises(ServiceError, match="needs at least one core per replica; this process has 2 core"):
        cpu_share(0, 3, [0, 1])
    cfg = load_config(GPU8, ["serving.replicas=2", "serving.data_parallel_size=2"], check_paths=False)
    envs = [server_from_config(cfg, tmp_path, on_gpu=True, replica=i)._env() for i in range(2)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    cpu = load_config(None, ["serving.replicas=2"])
    binds = [server_from_config(cpu, tmp_path, on_gpu=False, replica=i)._env()["VLLM_CPU_OMP_THREADS_BIND"]
             for i in range(2)]
    cores = sorted(__import__("os").sched_getaffinity(0))
    if len(cores) >= 2:
        assert binds == [",".join(map(str, cpu_share(i, 2))) for i in range(2)] and binds[0] != binds[1]
    one = server_from_config(load_config(None), tmp_path, on_gpu=False)  # one replica: every core, as before
    assert one.cpus == [] and "--port" in one._cmd()
    with pytest.raises(ServiceError, match="replica 2 of serving.replicas = 2"):
        server_from_config(cpu, tmp_path, on_gpu=False, replica=2)


def test_the_plan_shows_every_replica():
    from infra.plan import build_plan, format_plan

    cfg = load_config(GPU8, ["serving.replicas=4", "serving.data_parallel_size=1", "execution.backend=ray",
                             "execution.ray_replicas=false"], check_paths=False)
    plan = build_plan(cfg, 8, 80, config_name=GPU8)
    assert plan.problems == []
    text = format_plan(plan)
    for i in range(4):
        assert f"  vLLM replica {i + 1} GPUs {i}: tensor parallel 1 x data parallel 1\n" in text
        assert f"  vLLM replica {i + 1}/4: CUDA_VISIBLE_DEVICES={i} " in text
    assert "policy server  4 replicas (vLLM, GPUs 0 | 1 | 2 | 3, each its own port" in text
    ray_text = format_plan(build_plan(load_config(GPU8, ["serving.replicas=4", "serving.data_parallel_size=1",
                                                         "execution.backend=ray", "execution.ray_replicas=true"],
                                                  check_paths=False), 8, 80, config_name=GPU8))
    assert "policy server  4 replicas (vLLM as Ray actors (scheduling SPREAD over the nodes), no Ray CPU each, " \
           "GPUs 0 | 1 | 2 | 3 of gpus.serve when on the flow's node, each server on its node's IP" in ray_text
    assert "--host NODE_IP --port 8000" in ray_text
    assert "a new tree to the replica with the fewest trees in flight (counted per shard" in text
    assert "pool: each of the 4 replicas gets the checkpoint at the same time" in text


# -- the pool's choices, without HTTP ---------------------------------------------------------------------------
class Named(Policy):
    """Answers with its own name; ``fail``: raise PolicyError caused by ``ConnectionRefusedError``."""

    def __init__(self, name: str) -> None:
        self.name, self.fail, self.seen = name, False, []

    async def generate(self, request: PolicyRequest) -> Generation:
        if self.fail:
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except ConnectionRefusedError as e:
                raise PolicyError(f"{self.name}: connection refused") from e
        self.seen.append(request.tree_id)
        await asyncio.sleep(0)
        return Generation(text=self.name)


def _req(tree: str) -> PolicyRequest:
    return PolicyRequest(node=Node(node_id="0", goal="g"), env="e", prompt_token_ids=[1], max_tokens=1, tree_id=tree)


def test_trees_are_pinned_and_spread_by_trees_in_flight_with_a_deterministic_tie_break():
    from rao_core.policies.pool import PolicyPool

    async def go():
        reps = [Named(f"r{i}") for i in range(3)]
        pool = PolicyPool(reps)
        got = [(await pool.generate(_req(t))).text for t in ("a", "b", "c", "d")]
        assert got == ["r0", "r1", "r2", "r0"] and pool.in_flight() == [2, 1, 1]
        assert [(await pool.generate(_req(t))).text for t in ("b", "a", "d", "c")] == ["r1", "r0", "r0", "r2"]
        assert pool.tree_done("b") == {"replica": 1} and pool.in_flight() == [2, 0, 1]
        assert (await pool.generate(_req("e"))).text == "r1"  # the least loaded, not the next in turn
        assert pool.tree_done("nope") == {} and pool.requests == [4, 3, 2]
        off = PolicyPool([Named(f"r{i}") for i in range(3)], offset=4)  # ties start at replica 4 mod 3 = 1
        assert [(await off.generate(_req(t))).text for t in ("a", "b", "c")] == ["r1", "r2", "r0"]
        single = PolicyPool([Named("only")])
        assert (await single.generate(_req("a"))).text == "only" and single.tree_done("a") == {}  # no meta

    asyncio.run(go())


def test_an_unreachable_replica_is_taken_out_but_never_the_last():
    from rao_core.policies.pool import PolicyPool, replica_unreachable

    async def go():
        reps = [Named("r0"), Named("r1")]
        pool = PolicyPool(reps, urls=["http://a/v1", "http://b/v1"])
        await pool.generate(_req("a"))
        await pool.generate(_req("b"))
        reps[1].fail = True
        with pytest.raises(PolicyError, match="r1: connection refused"):
            await pool.generate(_req("b"))
        assert list(pool.down) == [1]
        reps[1].fail = False  # even if it answers again: out for the pool's life
        with pytest.raises(PolicyError, match=r"policy replica 2/2 \(http://b/v1\) was taken out of the pool"):
            await pool.generate(_req("b"))
        assert (await pool.generate(_req("c"))).text == "r0" and (await pool.generate(_req("d"))).text == "r0"
        reps[0].fail = True  # the last live replica stays in: its trees try again at each request
        for _ in range(2):
            with pytest.raises(PolicyError, match="r0: connection refused"):
                await pool.generate(_req("a"))
        assert list(pool.down) == [1]

    asyncio.run(go())
    assert not replica_unreachable(PolicyError("server returned no choices"))
    try:
        raise PolicyError("x") from TimeoutError()
    except PolicyError as e:
        assert not replica_unreachable(e)


# -- the runtime against fake servers ----------------------------------------------------------------------------
@needs_tok
def test_every_tree_stays_on_one_replica_and_trees_spread_over_both(fakes):
    """8 trees (4 tasks x G 2, two requests each) over 2 fake servers: each tree's requests all reached one
    server, that server is the one its meta names, and each server grew 4 trees."""
    from rao_core.policies.pool import PolicyPool

    a, b = fakes(), fakes()
    pool = PolicyPool.of_endpoints([a.base_url, b.base_url], "policy", max_retries=0)
    trees = asyncio.run(_grow(pool, 4, 2))
    assert len(trees) == 8 and all(t.root.end_reason == EndReason.MAX_STEPS for t in trees)
    assert all(len(t.root.turns) == 2 for t in trees)
    for t in trees:
        on = [i for i, f in enumerate((a, b)) if _tree_seeds(t) <= f.seeds()]
        assert on == [t.meta["replica"]], (t.tree_id, on, t.meta)
        assert not _tree_seeds(t) & (b, a)[t.meta["replica"]].seeds()  # none of its requests on the other
    spread = Counter(t.meta["replica"] for t in trees)
    assert set(spread) == {0, 1} and min(spread.values()) >= 2, spread  # 4/4 when all start before one ends
    assert sum(len(f.completions) for f in (a, b)) == 16


@needs_tok
def test_a_replica_killed_mid_run_ends_its_trees_policy_error_and_the_others_go_on(fakes):
    """Replica 2 dies at its 3rd completion: the trees pinned to it that were in flight end ``policy_error``
    (unscored); one it grew to its end before (on a loaded machine the trees overlap less) keeps its normal end,
    every request of it answered by replica 2; every other tree is grown on replica 1 to its normal end."""
    from rao_core.judge.stage import INFRA_END_REASONS
    from rao_core.policies.pool import PolicyPool

    a, b = fakes(), fakes(die_after=2)
    pool = PolicyPool.of_endpoints([a.base_url, b.base_url], "policy", max_retries=1)
    trees = asyncio.run(_grow(pool, 4, 2, _runtime(max_concurrent_trees=4)))
    assert b.dead and list(pool.down) == [1]
    lost = [t for t in trees if t.meta["replica"] == 1]
    kept = [t for t in trees if t.meta["replica"] == 0]
    cut = [t for t in lost if t.root.end_reason == EndReason.POLICY_ERROR]
    assert cut  # the trees in flight on replica 2 when it died
    assert all(t.root.end_reason == EndReason.MAX_STEPS and _tree_seeds(t) <= b.seeds() for t in lost if t not in cut)
    assert EndReason.POLICY_ERROR in INFRA_END_REASONS  # judging leaves them unscored
    assert len(kept) == 8 - len(lost) >= 5 and all(t.root.end_reason == EndReason.MAX_STEPS for t in kept)
    assert all(_tree_seeds(t) <= a.seeds() for t in kept)


# -- the serve stage: the switch reaches every replica -------------------------------------------------------------
class _FakeProc:
    def __init__(self, fake: FakeVLLM) -> None:
        self.fake, self.pid, self.proc, self.log_path = fake, None, None, "fake.log"

    def alive(self) -> bool:
        return not self.fake.dead

    def stop(self) -> None:
        if not self.fake.dead:
            self.fake.kill()


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """``VLLMServer.start`` starts a :class:`FakeVLLM` (its port becomes the server's); returns the list of
    fakes started, in order."""
    from infra.serving import VLLMServer
    from tasks import serve

    started: list[FakeVLLM] = []

    def start(self):
        fake = FakeVLLM(self.served_model_name)
        started.append(fake)
        self.port, self.process = fake.port, _FakeProc(fake)
        return self

    monkeypatch.setattr(VLLMServer, "start", start)
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    serve.shutdown_server()
    yield started
    serve.shutdown_server()


def _serve_ctx(*sets: str):
    from infra.stage_io import RunContext

    cfg = load_config(None, ["name=pool", *sets])
    return RunContext(config=cfg, s3={"endpoint_url": "http://127.0.0.1:9", "bucket": "rao"}, mlflow_uri="")


def _ckpt(tmp_path: Path, name: str, lora: bool = False):
    from infra.stage_records import Checkpoint

    d = tmp_path / name
    d.mkdir(exist_ok=True)
    if lora:
        (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "iter-0")}))
    else:
        (d / "config.json").write_text(json.dumps({"name": name}))
    return Checkpoint(name=name, local=str(d))


@needs_tok
def test_requests_carry_their_seeds_only_where_the_servers_take_them(fakes):
    """With send_seeds (the default) every request carries its tree's seed for that turn; without it (a vLLM
    on CPU, whose engine dies on a seeded request prefilled in chunks) none does, and the trees keep theirs."""
    from rao_core.policies.pool import PolicyPool

    for send in (True, False):
        f = fakes()
        trees = asyncio.run(_grow(PolicyPool.of_endpoints([f.base_url], "policy", max_retries=0, send_seeds=send),
                                  2, 2))
        assert len(f.completions) == 8 and sorted(t.seed for t in trees) == [1000, 1001, 2000, 2001]
        assert f.seeds() == (set().union(*map(_tree_seeds, trees)) if send else set())


def test_the_switch_reaches_every_replica_before_the_stage_returns(fake_vllm, tmp_path):
    """2 replicas: started together on iter-0; iter-1 reloaded in both (one copy of the weights); a replica that
    died is started again on the served checkpoint while the other reloads; a replica whose reload fails fails
    the stage, naming it."""
    from infra.process import ServiceError
    from tasks import serve

    ctx = _serve_ctx("serving.replicas=2")
    first = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-0"))
    assert first.how == "start" and len(first.urls) == 2 and first.urls[0] != first.urls[1]
    assert [(r.index, r.checkpoint, r.how, r.models) for r in first.replicas] == \
        [(0, "iter-0", "start", ["policy"]), (1, "iter-0", "start", ["policy"])]
    assert first.base_url == first.urls[0] and len(fake_vllm) == 2
    assert first.seeded is has_cuda_gpu()  # serving.request_seeds auto: no per-request seeds to vLLM on CPU
    second = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-1"))
    assert [(r.checkpoint, r.how) for r in second.replicas] == [("iter-1", "reload")] * 2
    assert all(f.posts[:2] == ["/collective_rpc", "/reset_prefix_cache"] for f in fake_vllm)
    assert json.loads((ctx.local("served") / "config.json").read_text()) == {"name": "iter-1"}
    assert serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-1b")).how == "reload"
    def fake(i: int) -> FakeVLLM:  # the fake standing for replica i now (they start in threads: any order)
        return serve.POOL.servers[i].process.fake

    fake(1).kill()  # replica 2 died between iterations
    third = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-2"))
    assert [(r.checkpoint, r.how) for r in third.replicas] == [("iter-2", "reload"), ("iter-2", "start")]
    assert third.how == "reload+start" and len(fake_vllm) == 3 and third.urls[1] == fake_vllm[2].base_url
    assert fake(1) is fake_vllm[2] and fake(0) in fake_vllm[:2]
    fake_vllm[2].fail_reload = True
    with pytest.raises(ServiceError, match=r"checkpoint iter-3 did not reach every policy server replica: replica "
                                           r"2/2 \(http://127.0.0.1:\d+/v1\): ServiceError: vLLM reload_weights "
                                           r"answered 500"):
        serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-3"))
    fake_vllm[2].fail_reload = False
    assert [r.how for r in serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-3")).replicas] == ["reload"] * 2
    assert "replica 2/2: the vLLM server was not started" in serve.server_diagnosis(ctx)  # fakes have no process
    serve.shutdown_server()
    assert all(f.dead for f in fake_vllm)


def test_a_lora_switch_reaches_every_replica_and_each_lists_the_adapter(fake_vllm, tmp_path):
    from tasks import serve

    (tmp_path / "iter-0").mkdir()
    (tmp_path / "iter-0" / "config.json").write_text("{}")
    ctx = _serve_ctx("serving.replicas=2", "serving.switch=lora", "trainer.lora={r: 8}")
    out = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-1", lora=True))  # a resumed campaign: base + adapter
    assert out.model == "iter-1" and [r.how for r in out.replicas] == ["start+lora"] * 2
    out = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-2", lora=True))
    assert out.model == "iter-2" and [(r.how, r.models) for r in out.replicas] == \
        [("lora", ["policy", "iter-1", "iter-2"])] * 2


def test_the_pool_object_serves_in_one_call_and_tells_its_ledger_of_each_start_and_stop(fake_vllm, tmp_path):
    """``infra.serving_pool.ServingPool.serve`` on its own (no Prefect task): the ledger's owners are asked once per
    switch that starts a server, in the caller's thread; each start is noted from its own thread, each stop too."""
    import threading

    from infra.serving_pool import ProcessLedger, ServingPool

    class Ledger(ProcessLedger):
        def __init__(self):
            self.calls: list[tuple] = []

        def owners(self):
            self.calls.append(("owners", threading.current_thread() is threading.main_thread()))
            return ["run-1"]

        def started(self, pid, base_url, owners):
            self.calls.append(("started", base_url, owners, threading.current_thread().name.startswith("rao-switch")))

        def stopped(self, pid):
            self.calls.append(("stopped", pid))

    ledger, cfg = Ledger(), _serve_ctx("serving.replicas=2").config
    pool, work = ServingPool(ledger), tmp_path / "campaign"
    lines: list[str] = []
    first = pool.serve(cfg, "iter-0", Path(_ckpt(tmp_path, "iter-0").local), work_dir=work, say=lines.append)
    assert first.how == "start" and (work / "served" / "config.json").exists()
    assert ledger.calls[0] == ("owners", True)  # the replicas start in threads of their own, in any order
    assert sorted(ledger.calls[1:]) == sorted(("started", u, ["run-1"], True) for u in first.urls)
    ledger.calls.clear()
    assert pool.serve(cfg, "iter-1", lambda: _ckpt(tmp_path, "iter-1").local, work_dir=work).how == "reload"
    assert ledger.calls == []  # nothing started: no owners asked
    pool.servers[1].process.fake.kill()
    third = pool.serve(cfg, "iter-2", Path(_ckpt(tmp_path, "iter-2").local), work_dir=work)
    assert third.how == "reload+start" and ledger.calls == [("stopped", None), ("owners", True),
                                                            ("started", third.urls[1], ["run-1"], True)]
    ledger.calls.clear()
    pool.stop()
    assert ledger.calls == [("stopped", None)] * 2 and pool.servers == [] and pool.served is None


def test_an_external_pool_gets_each_adapter_on_every_replica(fakes, tmp_path, monkeypatch):
    from tasks import serve

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    a, b = fakes(), fakes()
    ctx = _serve_ctx(f'serving.base_urls=["{a.base_url}", "{b.base_url}"]', "serving.switch=lora",
                     "trainer.lora={r: 8}")
    serve.shutdown_server()
    (tmp_path / "iter-0").mkdir()
    (tmp_path / "iter-0" / "config.json").write_text("{}")
    try:
        out = serve.serve_checkpoint.fn(ctx, _ckpt(tmp_path, "iter-1", lora=True))
    finally:
        serve.shutdown_server()
    assert (out.how, out.model, out.urls, out.seeded) == ("external-lora", "iter-1", [a.base_url, b.base_url], True)
    assert a.adapters == b.adapters == ["iter-1"]


@needs_tok
@pytest.mark.services
def test_the_generate_stage_pins_trees_over_the_pool_and_counts_each_replica(fakes, s3_server, tmp_path,
                                                                              monkeypatch):
    """The local backend's generate stage with a served pool of 2 fake replicas: every tree on one replica, both
    used, the serving metrics summed over the replicas with each one's requests."""
    from infra.stage_io import RunContext
    from infra.stage_records import ServedEndpoint
    from tasks.stages import fetch, generate_trees
    from rao_core.tree import read_trees

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    a, b = fakes(), fakes()
    cfg = load_config(None, {"name": "pool-gen", "runtime.sandbox": SANDBOX, "tasks.pool_size": 4,
                             "tasks.tasks_per_iteration": 4, "algo.G": 2, "runtime.max_depth": 0,
                             "runtime.max_steps_per_node": 2, "runtime.context_window": 2048,
                             "runtime.max_new_tokens": 64})
    ctx = RunContext(config=cfg, s3=s3_server.settings().__dict__, mlflow_uri="")
    served = ServedEndpoint(base_url=a.base_url, base_urls=[a.base_url, b.base_url], model="policy")
    out = generate_trees.fn(ctx, 1, served, str(TINY))
    trees = read_trees(fetch(ctx, out.trees_uri, "iter-1/fetched.jsonl"))
    assert out.num_trees == 8 and out.infra_failures == {}
    assert set(Counter(t.meta["replica"] for t in trees)) == {0, 1}
    for t in trees:
        assert _tree_seeds(t) <= (a, b)[t.meta["replica"]].seeds()
    assert (out.serving["requests"], out.serving["replica0_requests"], out.serving["replica1_requests"]) == \
        (16, len(a.completions), len(b.completions))


def _start_ray(ray, runtime_env=None, attempts: int = 3, num_cpus: int = 2) -> None:
    """A local Ray cluster (head and ``num_cpus`` CPUs, 300 MiB object store, no dashboard; ``runtime_env``
    default ``infra.ray_rollouts.worker_runtime_env()``), the one the Ray tests start. Ray gives its raylet a fixed
    30 s to register (ray/_private/node.py), which a loaded 2-core machine can miss: up to ``attempts`` tries.
    The cluster is on 127.0.0.1 only (``infra.services.ray_loopback``), as ``rao services up --ray``'s is."""
    from infra.services import ray_loopback

    ray_loopback()
    if runtime_env is None:
        from infra.ray_rollouts import worker_runtime_env

        runtime_env = worker_runtime_env()
    for k in range(attempts):
        try:
            ray.init(address="local", num_cpus=num_cpus, object_store_memory=300 * 1024 ** 2, include_dashboard=False,
                     log_to_driver=False, runtime_env=runtime_env, logging_level="WARNING")
            return
        except Exception as e:  # noqa: BLE001 - "The current node timed out during startup"
            ray.shutdown()
            if k == attempts - 1 or "timed out during startup" not in str(e):
                raise


# -- a real Ray cluster, fake servers ------------------------------------------------------------------------------
@needs_tok
@pytest.mark.services
@pytest.mark.timeout(900)
def test_ray_shards_pin_their_trees_over_the_pool(fakes, s3_server, tmp_path, monkeypatch):
    """Backend ray, 2 shards, 2 fake replicas: each tree's requests on one replica, both replicas used by
    each shard (ties start at the shard's own replica), the trees those of the local backend."""
    ray = pytest.importorskip("ray")
    from infra.stage_io import RunContext
    from infra.stage_records import ServedEndpoint
    from infra.ray_rollouts import worker_runtime_env
    from tasks.stages import fetch, generate_trees
    from rao_core.tree import read_trees

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    a, b = fakes(), fakes()
    cfg = load_config(None, {"name": "pool-ray", "runtime.sandbox": SANDBOX, "tasks.pool_size": 4,
                             "tasks.tasks_per_iteration": 4, "algo.G": 2, "runtime.max_depth": 0,
                             "runtime.max_steps_per_node": 2, "runtime.context_window": 2048,
                             "runtime.max_new_tokens": 64, "execution.backend": "ray", "execution.shards": 2})
    ctx = RunContext(config=cfg, s3=s3_server.settings().__dict__, mlflow_uri="")
    served = ServedEndpoint(base_url=a.base_url, base_urls=[a.base_url, b.base_url], model="policy")
    _start_ray(ray, worker_runtime_env())
    try:
        out = generate_trees.fn(ctx, 1, served, str(TINY))
    finally:
        ray.shutdown()
    trees = read_trees(fetch(ctx, out.trees_uri, "iter-1/fetched.jsonl"))
    assert out.num_trees == 8 and out.infra_failures == {}
    for t in trees:
        assert _tree_seeds(t) <= (a, b)[t.meta["replica"]].seeds(), t.meta
    per_shard = {s: Counter(t.meta["replica"] for t in trees if t.meta["shard"] == s) for s in ("1/2", "2/2")}
    assert all(set(c) == {0, 1} for c in per_shard.values()), per_shard  # each shard used both replicas
    assert len(a.completions) + len(b.completions) == 16


@pytest.mark.services
@pytest.mark.timeout(300)
def test_a_second_campaign_in_the_process_hands_its_own_key_variable_to_its_shards(monkeypatch):
    """Ray keeps the runtime environment of the process's first ``ray.init``: the cluster here is joined with
    the first campaign's (no ``serving.api_key_env`` variable of its own), then a second campaign names
    ``RAO_TEST_EXT_KEY``. A shard submitted with :func:`infra.ray_rollouts.shard_options` sees that variable;
    a task with the job's environment alone does not (the case the per-task environment is for)."""
    from types import SimpleNamespace

    ray = pytest.importorskip("ray")
    from infra.ray_rollouts import Shard, shard_options, worker_runtime_env

    monkeypatch.delenv("RAO_TEST_EXT_KEY", raising=False)
    _start_ray(ray, worker_runtime_env())  # the first campaign's job (its workers inherit this environment)
    try:
        monkeypatch.setenv("RAO_TEST_EXT_KEY", "ext-secret")  # set after the cluster started: not inherited
        second = SimpleNamespace(config=load_config(None, {"serving.api_key_env": "RAO_TEST_EXT_KEY"}),
                                 name="second")
        shard = Shard(index=0, count=1, groups=[], key="iter-1/trees/shards/shard-1-of-1.jsonl")

        def seen():
            import os

            yield os.environ.get("RAO_TEST_EXT_KEY")

        opts = shard_options(second, shard)
        assert opts["name"] == "second-iter-1-trees-shards-shard-1-of-1.jsonl"
        assert ray.get(next(ray.remote(seen).options(**opts).remote())) == "ext-secret"
        job_only = {k: v for k, v in opts.items() if k != "runtime_env"}
        assert ray.get(next(ray.remote(seen).options(**job_only).remote())) is None
    finally:
        ray.shutdown()


# -- real vLLM: 2 replicas, backend ray, one iteration's serve + generate + switch -------------------------------------
@needs_tok
@pytest.mark.vllm
@pytest.mark.services
@pytest.mark.timeout(2400)
def test_two_real_vllm_replicas_serve_a_ray_generate_stage_and_both_take_the_switch(s3_server, tmp_path,
                                                                                    monkeypatch):
    """One campaign iteration on a local Ray cluster (head, 2 CPUs: the 2 shards' workers) with a pool of 2 vLLM
    replicas of the tiny model, each a Ray actor (0 Ray CPUs: on this 2-core machine the shards and the
    servers share the cores; one core bound per server): serve iter-0, generate (2 shards), judge, validate,
    train, serve iter-1. Checks: the trees are the local backend's (task ids, groups, rollout indices, seeds);
    both replicas served requests (their own /metrics and the trees' pins agree); the judge scored and the
    trainer's samples hold every tree exactly once; the switch to the trained iter-1 (reload) reached both
    replicas, same processes, before it returned. Then replica 2's server is killed: the next generate stage goes
    on with replica 1, the trees pinned to replica 2 ending policy_error (unscored)."""
    import os
    import signal

    ray = pytest.importorskip("ray")
    from infra.ray_serving import RayReplica
    from infra.vllm_metrics import scrape
    from rao_core.samples import read_samples
    from rao_core.task_sampling import rollout_seed
    from rao_core.tree import read_trees
    from tasks import serve
    from infra.stage_io import RunContext
    from infra.stage_records import Checkpoint
    from infra.ray_rollouts import worker_runtime_env
    from tasks.stages import (fetch, generate_trees, iteration_tasks, judge_trees, train_policy,
                              validate_dataset)

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    cfg = load_config(None, {"name": "pool-vllm", "runtime.sandbox": SANDBOX, "tasks.pool_size": 4,
                             "tasks.tasks_per_iteration": 4, "algo.G": 2, "runtime.max_depth": 0,
                             "runtime.max_steps_per_node": 2, "runtime.context_window": 1024,
                             "runtime.max_new_tokens": 32, "runtime.max_infra_failure_share": 1.0,
                             "serving.replicas": 2, "serving.max_model_len": 1024, "serving.kv_cache_gib": 1,
                             "execution.backend": "ray", "execution.shards": 2, "execution.cpus_per_replica": 0,
                             # every tree's node reaches the samples, uniform groups included: this test counts them
                             "algo.filter_zero_variance_groups": False})
    ctx = RunContext(config=cfg, s3=s3_server.settings().__dict__, mlflow_uri="")
    serve.shutdown_server()
    _start_ray(ray, worker_runtime_env())
    try:
        iter0 = Checkpoint(name="iter-0", local=str(TINY))
        served = serve.serve_checkpoint.fn(ctx, iter0)
        assert [r.how for r in served.replicas] == ["start", "start"] and len(set(served.urls)) == 2
        assert all(isinstance(s, RayReplica) and s.actor is not None for s in serve.POOL.servers)
        before = [scrape(u) for u in served.urls]
        out = generate_trees.fn(ctx, 1, served, str(TINY))
        after = [scrape(u) for u in served.urls]
        trees = read_trees(fetch(ctx, out.trees_uri, "iter-1/fetched.jsonl"))
        assert out.num_trees == 8 and out.infra_failures == {}, out.infra_failures
        planned = sorted((t.task_id, g, rollout_seed(cfg.seed, 1, t.task_id, g))
                         for t in iteration_tasks(ctx, 1) for g in range(2))  # the local backend's trees
        assert sorted((t.task_id, t.rollout_index, t.seed) for t in trees) == planned
        done = [a["vllm:request_success_total"] - b.get("vllm:request_success_total", 0) for b, a in zip(before, after)]
        assert all(d > 0 for d in done), done  # both replicas served requests
        assert set(Counter(t.meta["replica"] for t in trees)) == {0, 1}
        assert (out.serving["replica0_requests"], out.serving["replica1_requests"]) == tuple(done)
        judged = judge_trees.fn(ctx, 1, out.trees_uri)
        scored = read_trees(fetch(ctx, judged.scored_uri, "iter-1/scored-read.jsonl"))
        assert sorted(t.tree_id for t in scored) == sorted(t.tree_id for t in trees)  # each tree once
        valid = validate_dataset.fn(ctx, 1, judged.scored_uri)
        samples = read_samples(fetch(ctx, valid.samples_uri, "iter-1/samples-read.jsonl")).samples
        assert sorted(s.tree_id for s in samples) == sorted(t.tree_id for t in scored)  # one node per tree
        trained = train_policy.fn(ctx, 1, valid.samples_uri, iter0)
        switched = serve.serve_checkpoint.fn(ctx, trained.checkpoint)
        assert [(r.checkpoint, r.how, r.base_url) for r in switched.replicas] == \
            [("iter-1", "reload", u) for u in served.urls]  # the switch reached both, same processes
        os.killpg(serve.POOL.servers[1].pid, signal.SIGKILL)  # replica 2 lost
        out2 = generate_trees.fn(ctx, 2, switched, str(TINY))
        trees2 = read_trees(fetch(ctx, out2.trees_uri, "iter-2/fetched.jsonl"))
        lost = [t for t in trees2 if t.meta.get("replica") == 1]
        kept = [t for t in trees2 if t.meta.get("replica") == 0]
        assert out2.num_trees == 8 and lost and kept and len(lost) + len(kept) == 8
        assert all(t.root.end_reason == EndReason.POLICY_ERROR for t in lost)  # unscored
        assert all(t.root.end_reason != EndReason.POLICY_ERROR for t in kept)  # the other replica went on
    finally:
        serve.shutdown_server()
        ray.shutdown()
