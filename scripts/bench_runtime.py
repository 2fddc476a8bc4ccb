"""Benchmarks of the recursive agent runtime (prints numbers; results go to docs/benchmarks.md "Runtime").

(a) sandbox overhead per cell on a warm REPL (median, target < 10 ms) and REPL start time;
(b) with --base-url: tokens/s of N concurrent trees vs the same server at the same concurrency, in the
    same run: raw on one short prompt, and a raw replay of the trees' own prompts (target trees / replay
    >= 0.8), with the trees' requests-in-flight profile;
(c) wall time of TextCraft hard tasks solved by the oracle with parallel vs forced-sequential children,
    with a simulated policy latency per generation (target >= 2x);
(d) with --base-url and --replay TREES.jsonl: the server's speed on a campaign iteration's recorded
    generation workload (same prompt ids, same completion lengths), to set beside the campaign's own figure;
(e) with --base-url and --sweep NxL,...: the raw server's prefill and decode tok/s by concurrency N and
    prompt length L;
(f) with --base-url and --busy-cell: the raw load alone vs while one sandboxed cell loops, at niceness 0
    and at the sandbox's default.

Usage: python scripts/bench_runtime.py [--base-url URL --model NAME --tokenizer PATH] [--skip-c]
       [--replay var/campaigns/NAME/iter-K/trees.jsonl] [--sweep 32x40,32x500,32x1500] [--busy-cell]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time

from rao_core.policies.openai_policy import policy_client_key


def _auth(base_url: str) -> dict[str, str]:
    """The header the policy server at ``base_url`` requires (the pipeline's servers guard every route)."""
    return {"Authorization": f"Bearer {policy_client_key(base_url)}"}


async def bench_sandbox(mode: str, n_cells: int = 200, n_starts: int = 10) -> None:
    from rao_core.envs.base import ToolError
    from rao_core.runtime.sandbox import Repl, SandboxLimits

    async def no_calls(name, args, kwargs):
        raise ToolError("none")

    starts = []
    for _ in range(n_starts):
        t0 = time.perf_counter()
        r = await Repl(SandboxLimits(mode=mode)).start()
        await r.init([], False, {})
        starts.append(time.perf_counter() - t0)
        await r.close()
    r = await Repl(SandboxLimits(mode=mode)).start()
    await r.init([], False, {})
    per = {}
    for name, code in [("empty", "pass"), ("print", "print('x' * 100)"), ("tool-free loop", "s = sum(range(1000))")]:
        ts = []
        for _ in range(n_cells):
            t0 = time.perf_counter()
            await r.execute(code, no_calls)
            ts.append(time.perf_counter() - t0)
        per[name] = statistics.median(ts) * 1000
    await r.close()
    print(f"(a) sandbox={mode}: REPL start+init median {statistics.median(starts) * 1000:.0f} ms; "
          + "; ".join(f"cell '{k}' median {v:.2f} ms" for k, v in per.items()))


async def bench_textcraft(delay_s: float, n_tasks: int) -> None:
    from rao_core.envs import get_env
    from rao_core.policies.base import Policy
    from rao_core.policies.textcraft_expert import TextCraftExpert
    from rao_core.paths import tiny_model_path
    from rao_core.runtime import RuntimeConfig, load_tokenizer, run_tree

    class Delayed(Policy):
        def __init__(self, inner: Policy, delay: float):
            self.inner, self.delay, self.name = inner, delay, inner.name

        async def generate(self, request):
            await asyncio.sleep(self.delay)
            return await self.inner.generate(request)

    env = get_env("textcraft-synth")
    tasks = env.generate_tasks(n=n_tasks, seed=0, difficulty="hard")
    tok = load_tokenizer(tiny_model_path())
    cfg = RuntimeConfig(max_depth=2, context_window=32768, max_new_tokens=2048, max_children_per_node=8)
    walls = {}
    for label, prob in (("parallel", 1.0), ("sequential", 0.0)):
        pol = Delayed(TextCraftExpert(seed=0, parallel_prob=prob, max_depth=2), delay_s)
        ws, ok, nodes = [], 0, 0
        for t in tasks:
            tree = await run_tree(env, t, pol, cfg, tokenizer=tok)
            ws.append(tree.wall_s)
            ok += tree.root.verifier == 1.0
            nodes += len(tree.nodes)
        walls[label] = sum(ws)
        print(f"(c) {label}: {len(tasks)} hard tasks, total wall {sum(ws):.2f} s, solved {ok}/{len(tasks)}, "
              f"nodes {nodes}, policy delay {delay_s} s/turn")
    print(f"(c) speed-up parallel vs sequential: {walls['sequential'] / walls['parallel']:.2f}x (target >= 2x)")


async def bench_throughput(base_url: str, model: str, tokenizer: str, n: int, max_tokens: int) -> None:
    """(b): three loads on one server, each after a prefix-cache reset, all at ``n`` concurrent streams:
    the raw server on one short prompt (one turn), ``n`` trees of 3 turns (no code cells run: 128 tokens
    of ``ignore_eos`` text never close a fence), and a raw replay of exactly the trees' prompt ids turn by
    turn (same prompts, same turn order per stream, no runtime in between). trees / replay is the
    runtime's own cost; replay / raw is what the trees' longer, multi-turn prompts cost the server."""
    import httpx
    from openai import AsyncOpenAI

    from rao_core.envs.base import ChildSpec, Environment, Episode, Task, ToolSpec
    from rao_core.policies.openai_policy import OpenAIPolicy
    from rao_core.runtime import RuntimeConfig, load_tokenizer, run_trees

    tok = load_tokenizer(tokenizer)
    client = AsyncOpenAI(base_url=base_url, api_key=policy_client_key(base_url), max_retries=0, timeout=600)
    reset_url = base_url.rstrip("/").removesuffix("/v1") + "/reset_prefix_cache"

    async def complete(ids: list[int]) -> int:
        r = await client.completions.create(model=model, prompt=ids, max_tokens=max_tokens, temperature=1.0,
                                            extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    async def timed(coro) -> tuple[object, float]:
        httpx.post(reset_url, timeout=30, headers=_auth(base_url))  # every load starts from an empty prefix cache
        t0 = time.perf_counter()
        out = await coro
        return out, time.perf_counter() - t0

    prompt = tok.apply_chat_template([{"role": "user", "content": "Write Python code that prints numbers."}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    raw_counts, raw_wall = await timed(asyncio.gather(*(complete(ids) for _ in range(n))))
    raw = sum(raw_counts) / raw_wall

    class Echo(Environment):
        name = "bench"

        def tools(self):
            return [ToolSpec(name="noop", signature="noop() -> None", doc="Does nothing.")]

        def new_episode(self, task):
            return Episode(task=task)

        def root_goal(self, task):
            return ChildSpec(goal="Write Python code that prints numbers.")

        def call_tool(self, episode, node, name, args, kwargs):
            return None

    spans: list[tuple[float, float]] = []  # (start, end) of every policy request of the trees

    class Timed(OpenAIPolicy):
        async def generate(self, request):
            t0 = time.perf_counter()
            try:
                return await super().generate(request)
            finally:
                spans.append((t0, time.perf_counter()))

    pol = Timed(base_url, model, temperature=1.0, extra_body={"ignore_eos": True}, stop=())
    cfg = RuntimeConfig(max_depth=0, delegation=False, max_steps_per_node=3, context_window=4096,
                        max_new_tokens=max_tokens, max_concurrent_requests=n, repl_pool_size=4)
    t_trees = time.perf_counter()
    trees, wall = await timed(run_trees(Echo(), [(Task(task_id="b", env="bench"), n)], pol, cfg, tokenizer=tok,
                                        progress=False))
    gen = sum(x.num_completion_tokens for t in trees for x in t.nodes)
    # client-side profile: mean requests in flight over the trees' wall time, first request, turn gaps
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    in_flight, last, area = 0, t_trees, 0.0
    for t, d in events:
        area += in_flight * (t - last)
        last, in_flight = t, in_flight + d
    first = min(a for a, _ in spans) - t_trees
    turns = [t.nodes[0].turns for t in trees]
    prompt_lens = [len(tr.prompt_token_ids) for ts in turns for tr in ts]

    async def replay(ts) -> int:
        return sum([await complete(tr.prompt_token_ids) for tr in ts])

    rep_counts, rep_wall = await timed(asyncio.gather(*(replay(ts) for ts in turns)))
    rep = sum(rep_counts) / rep_wall
    print(f"(b) {n} concurrent, {max_tokens} new tokens per request: raw server, one {len(ids)}-token prompt: "
          f"{raw:.1f} tok/s; {n} trees (3 turns, prompts {min(prompt_lens)}-{max(prompt_lens)} tokens): "
          f"{gen / wall:.1f} tok/s; raw replay of the trees' prompts: {rep:.1f} tok/s")
    print(f"(b) trees / replay {gen / wall / rep:.2f} (the runtime's own cost; target >= 0.8); "
          f"trees / one-prompt raw {gen / wall / raw:.2f}; replay / raw {rep / raw:.2f} (the prompts' cost)")
    cells = [tr.execution_s or 0.0 for ts in turns for tr in ts]
    status = collections.Counter(str(getattr(tr.cell_status, "value", tr.cell_status)) for ts in turns for tr in ts)
    print(f"(b) trees profile: mean requests in flight {area / wall:.1f} of {n}; first request after "
          f"{first * 1000:.0f} ms; wall {wall:.2f} s; cells {len(cells)} ({dict(status)}), execution "
          f"{sum(cells):.1f} s in all, longest {max(cells):.2f} s")
    await pol.aclose()
    await client.close()


async def bench_replay(base_url: str, model: str, trees_path: str) -> None:
    """(d): the server's own speed on a campaign's recorded generation workload. Every node of the
    recorded trees (``trees.jsonl`` of an iteration) becomes one stream that sends its turns' recorded
    prompt ids in order, each asking for exactly the recorded number of tokens (``ignore_eos``); all
    streams run at once (no parent waits for its children, so at least as much concurrency as the
    campaign had). Compare with the iteration's ``tokens/completion_total / time/generate_s``."""
    import httpx
    from openai import AsyncOpenAI

    from rao_core.jsonl import read_jsonl

    trees = read_jsonl(trees_path, dict, "execution tree")
    streams = [[(t["prompt_token_ids"], len(t["completion_token_ids"])) for t in node["turns"]
                if t.get("prompt_token_ids") and t.get("completion_token_ids")]
               for tree in trees for node in tree["nodes"]]
    client = AsyncOpenAI(base_url=base_url, api_key=policy_client_key(base_url), max_retries=0, timeout=900)

    async def stream(turns) -> int:
        n = 0
        for ids, k in turns:
            r = await client.completions.create(model=model, prompt=ids, max_tokens=k, temperature=1.0,
                                                extra_body={"ignore_eos": True})
            n += r.usage.completion_tokens
        return n

    httpx.post(base_url.rstrip("/").removesuffix("/v1") + "/reset_prefix_cache", timeout=30,
               headers=_auth(base_url))
    t0 = time.perf_counter()
    total = sum(await asyncio.gather(*(stream(s) for s in streams)))
    wall = time.perf_counter() - t0
    recorded = max(tree["wall_s"] for tree in trees)
    lens = sorted(len(ids) for s in streams for ids, _ in s)
    print(f"(d) replay of {trees_path}: {len(trees)} trees, {len(streams)} node streams, "
          f"{sum(len(s) for s in streams)} turns, prompts median {lens[len(lens) // 2]} tokens: {total} tokens in "
          f"{wall:.1f} s = {total / wall:.1f} tok/s (the campaign's longest tree took {recorded:.1f} s)")
    await client.close()


async def bench_sweep(base_url: str, model: str, loads: list[tuple[int, int]], max_tokens: int) -> None:
    """(e): the raw server's prefill and decode speed by concurrency and prompt length. For each (n, L):
    n distinct L-token prompts (no shared prefix) sent at once with ``max_tokens=1`` (prefill tok/s), then
    the same prompts again for ``max_tokens`` new tokens (``ignore_eos``; the prompts now come from the
    prefix cache, so this is decode at context L..L+max_tokens)."""
    import httpx
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=policy_client_key(base_url), max_retries=0, timeout=900)

    async def wave(prompts, k) -> tuple[int, float]:
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(client.completions.create(model=model, prompt=p, max_tokens=k, temperature=1.0,
                                                              extra_body={"ignore_eos": True}) for p in prompts))
        return sum(r.usage.completion_tokens for r in rs), time.perf_counter() - t0

    for n, length in loads:
        httpx.post(base_url.rstrip("/").removesuffix("/v1") + "/reset_prefix_cache", timeout=30,
               headers=_auth(base_url))
        prompts = [[(i * 7919 + j * 104729) % 40000 + 100 for j in range(length)] for i in range(n)]
        _, prefill_s = await wave(prompts, 1)
        tokens, decode_s = await wave(prompts, max_tokens)
        print(f"(e) {n} streams x {length}-token prompts: prefill {n * length / prefill_s:.0f} tok/s; decode "
              f"{tokens / decode_s:.0f} tok/s ({max_tokens} new tokens each, prompt cached)", flush=True)
    await client.close()


async def bench_busy_cell(base_url: str, model: str, n: int, max_tokens: int, repeats: int = 5) -> None:
    """(f): what one model-written cell that loops costs the server: the raw load of (b) (n streams of one
    short prompt, ``max_tokens`` new tokens each) alone, then while one sandboxed REPL cell runs
    ``while True: pass`` at niceness 0 (the orchestrator's) and at ``SandboxLimits.nice`` (the default);
    ``repeats`` interleaved rounds, min / median / max tok/s of each."""
    import httpx
    from openai import AsyncOpenAI

    from rao_core.envs.base import ToolError
    from rao_core.runtime.sandbox import Repl, SandboxLimits

    client = AsyncOpenAI(base_url=base_url, api_key=policy_client_key(base_url), max_retries=0, timeout=600)
    reset_url = base_url.rstrip("/").removesuffix("/v1") + "/reset_prefix_cache"

    async def load() -> float:
        httpx.post(reset_url, timeout=30, headers=_auth(base_url))
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(client.completions.create(
            model=model, prompt="Write Python code that prints numbers.", max_tokens=max_tokens,
            temperature=1.0, extra_body={"ignore_eos": True}) for _ in range(n)))
        return sum(r.usage.completion_tokens for r in rs) / (time.perf_counter() - t0)

    async def no_calls(name, args, kwargs):
        raise ToolError("none")

    async def with_busy_cell(nice: int) -> float:
        r = await Repl(SandboxLimits(nice=nice, cell_timeout_s=600)).start()
        await r.init([], False, {})
        cell = asyncio.create_task(r.execute("while True:\n    pass", no_calls))
        await asyncio.sleep(0.5)
        try:
            return await load()
        finally:
            cell.cancel()
            await r.kill()
            await r.close()

    nice = SandboxLimits().nice
    runs: dict[str, list[float]] = {"alone": [], "busy cell, nice 0": [], f"busy cell, nice {nice}": []}
    await load()  # warm-up
    for _ in range(repeats):
        runs["alone"].append(await load())
        runs["busy cell, nice 0"].append(await with_busy_cell(0))
        runs[f"busy cell, nice {nice}"].append(await with_busy_cell(nice))
    for k, v in runs.items():
        print(f"(f) raw {n} x {max_tokens} tokens, {k}: {min(v):.0f} / {statistics.median(v):.0f} / {max(v):.0f} "
              f"tok/s (min / median / max of {repeats})", flush=True)
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sandbox", default="bwrap", choices=["bwrap", "none"])
    ap.add_argument("--base-url", default="")
    ap.add_argument("--model", default="policy")
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--delay", type=float, default=0.5, help="simulated policy latency per turn, seconds")
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--skip-b", action="store_true")
    ap.add_argument("--skip-c", action="store_true")
    ap.add_argument("--sweep", default="", help="(e): loads NxL, comma-separated (e.g. 32x40,32x500,32x1500)")
    ap.add_argument("--busy-cell", action="store_true", help="(f): the raw load with a looping sandboxed cell")
    ap.add_argument("--replay", default="", help="(d): a campaign iteration's trees.jsonl to replay on --base-url")
    args = ap.parse_args()
    asyncio.run(bench_sandbox(args.sandbox))
    if not args.skip_c:
        asyncio.run(bench_textcraft(args.delay, args.tasks))
    if args.base_url:
        from rao_core.paths import tiny_model_path

        if not args.skip_b:
            asyncio.run(bench_throughput(args.base_url, args.model, args.tokenizer or str(tiny_model_path()),
                                         args.concurrency, args.max_tokens))
        if args.replay:
            asyncio.run(bench_replay(args.base_url, args.model, args.replay))
        if args.busy_cell:
            asyncio.run(bench_busy_cell(args.base_url, args.model, args.concurrency, args.max_tokens))
        if args.sweep:
            loads = [tuple(int(x) for x in load.split("x")) for load in args.sweep.split(",")]
            asyncio.run(bench_sweep(args.base_url, args.model, loads, args.max_tokens))
    else:
        print("(b) skipped: pass --base-url of a running vLLM server")


if __name__ == "__main__":
    main()
