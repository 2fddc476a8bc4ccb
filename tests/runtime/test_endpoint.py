"""OpenAIPolicy against a tiny stdlib fake server (and, marked vllm, against real vLLM)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rao_core.policies.openai_policy import OpenAIPolicy
from rao_core.runtime import RuntimeConfig, run_tree
from rao_core.tree import EndReason
from tests.runtime.fakes import FakeEnv, task
from tests.runtime.openai_fakes import completion, send_json
from tests.runtime.test_agent import check_tokens

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _start(die_after: int, *flags: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fake_openai_server.py")), str(port),
                             str(die_after), *flags])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/v1"


async def _tree_from_fake_server(tok, die_after: int, *flags: str, **policy_kw):
    """One tree grown by ``OpenAIPolicy`` against the fake server; returns (tree, seconds run_tree took)."""
    proc, url = _start(die_after, *flags)
    try:
        pol = OpenAIPolicy(url, "fake", **policy_kw)
        t0 = time.perf_counter()
        tree = await run_tree(FakeEnv(), task(), pol, cfg(), tokenizer=tok)
        elapsed = time.perf_counter() - t0
        await pol.aclose()
    finally:
        proc.kill()
        proc.wait()
    return tree, elapsed


def cfg(**kw):
    return RuntimeConfig(max_depth=1, context_window=4096, max_new_tokens=64, sandbox=SANDBOX, repl_pool_size=0,
                         policy_timeout_s=20, **kw)


async def test_endpoint_policy_token_in_token_out(tok):
    tree, _ = await _tree_from_fake_server(tok, 100, max_retries=0)
    root = tree.root
    assert root.end_reason == EndReason.FINISHED and root.result == "done"
    assert root.turns[0].observation == "hello\n"
    assert all(lp == -0.5 for t in root.turns for lp in t.completion_logprobs)
    check_tokens(tree, __import__("rao_core.runtime.chat", fromlist=["ChatTokens"]).ChatTokens(tok))


async def test_missing_logprob_is_a_node_error_not_zero(tok):
    """A generated token without a log-prob must end the node with POLICY_ERROR, never be stored as 0.0
    (a 0.0 behaviour log-prob would give the trainer a ratio of p_theta / 1 on that token)."""
    tree, _ = await _tree_from_fake_server(tok, 100, "null_logprob", max_retries=0)
    root = tree.root
    assert root.end_reason == EndReason.POLICY_ERROR
    assert "log-prob" in root.error and "token 1" in root.error
    assert all(0.0 not in t.completion_logprobs for t in root.turns)


async def test_server_killed_mid_rollout_fails_tree_cleanly(tok):
    # the server answers the first turn, then the process exits
    tree, elapsed = await _tree_from_fake_server(tok, 1, max_retries=2, request_timeout_s=5)
    root = tree.root
    assert len(root.turns) == 1 and root.turns[0].observation == "hello\n"
    assert root.end_reason == EndReason.POLICY_ERROR and "APIConnectionError" in root.error
    assert elapsed < 20  # bounded by retries x request timeout, far below policy_timeout_s + tree timeout


@pytest.mark.vllm
async def test_real_vllm_trees(vllm_tiny, tok):
    from rao_core.runtime import load_tokenizer, run_trees
    from rao_core.runtime.chat import ChatTokens

    tokenizer = load_tokenizer(vllm_tiny.model_path)
    pol = OpenAIPolicy(vllm_tiny.base_url, vllm_tiny.model, temperature=1.0)
    conf = RuntimeConfig(max_depth=1, max_steps_per_node=3, context_window=2048, max_new_tokens=64,
                         sandbox=SANDBOX, tree_timeout_s=300)
    trees = await run_trees(FakeEnv(), [(task(), 4)], pol, conf, tokenizer=tokenizer)
    await pol.aclose()
    chat = ChatTokens(tokenizer)
    for tree in trees:
        assert tree.error is None
        root = tree.root
        assert root.end_reason != EndReason.TOKEN_PREFIX_BREAK, root.error
        assert root.turns and all(len(t.completion_logprobs) == len(t.completion_token_ids) > 0 for t in root.turns)
        assert all(lp <= 0.0 for t in root.turns for lp in t.completion_logprobs)
        check_tokens(tree, chat)


class _DyingServer:
    """An OpenAI-compatible completions server in a thread (stdlib) that dies mid-generation.

    A tree whose goal says ``quick`` is answered ``finish('done')``; a ``slow`` tree first gets a cell
    printing ``xyzzy-42``. The first request of a second turn (its prompt holds that output) finds the
    server dying: once every tree's first turn is answered, it stops listening and drops that request
    unanswered, as a killed vLLM would; later requests are refused.
    """

    def __init__(self, tok, n_trees: int):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.first_turns = threading.Semaphore(0)
        self.answered = 0
        self.dead = threading.Event()
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = tok.decode(body["prompt"])
                if "xyzzy-42" in prompt:  # a second turn: the server dies now
                    with outer.lock:
                        if not outer.dead.is_set():
                            for _ in range(n_trees):  # every first turn answered (or 30 s)
                                outer.first_turns.acquire(timeout=30)
                            outer.dead.set()
                            threading.Thread(target=outer.srv.shutdown).start()
                            outer.srv.server_close()  # stop listening: retries are refused
                    return  # the connection closes without an answer
                text = ("```python\nfinish('done')\n```\n" if "quick" in prompt
                        else "```python\nprint('xyzzy-42')\n```\n")
                ids = tok.encode(text, add_special_tokens=False)
                send_json(self, completion(body["model"], body["prompt"], text, ids, [-0.25] * len(ids),
                                           [tok.decode([i]) for i in ids]))
                outer.answered += 1
                outer.first_turns.release()

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False  # server_close runs inside a handler thread

        self.srv = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        if not self.dead.is_set():
            self.srv.shutdown()
            self.srv.server_close()
        self.thread.join(timeout=10)


async def test_policy_server_dying_mid_generation_fails_only_the_trees_it_was_serving(tok):
    """Drill: vLLM killed mid-generation. The trees waiting on it end POLICY_ERROR within the
    client's bounded retries, no exception escapes ``run_trees``, the judge leaves them unscored (not 0),
    and the trees that had finished are intact and make the iteration's samples."""
    from rao_core.judge import JudgeConfig
    from rao_core.judge.stage import judge_trees
    from rao_core.rewards import assign_rewards
    from rao_core.runtime import run_trees
    from rao_core.samples import build_samples
    from rao_core.tree import unscored

    srv = _DyingServer(tok, n_trees=4)
    conf = cfg(max_steps_per_node=4, tree_timeout_s=120)
    try:
        # as the pipeline builds it (tasks.stages._policy): request timeout = policy_timeout_s, default retries
        pol = OpenAIPolicy(srv.url, "policy", request_timeout_s=conf.policy_timeout_s)
        t0 = time.perf_counter()
        trees = await run_trees(FakeEnv(), [(task("quick: finish", expect="done", task_id="q"), 2),
                                            (task("slow: print first", expect="done", task_id="s"), 2)],
                                pol, conf, tokenizer=tok)
        elapsed = time.perf_counter() - t0
        await pol.aclose()
    finally:
        srv.close()
    assert srv.dead.is_set() and srv.answered == 4
    quick, slow = trees[:2], trees[2:]
    for t in quick:  # finished before the server died: whole
        assert t.error is None and t.root.end_reason == EndReason.FINISHED and t.root.result == "done"
        assert t.root.verifier == 1.0
    for t in slow:
        root = t.root
        assert root.end_reason == EndReason.POLICY_ERROR and "APIConnectionError" in root.error, root.error
        assert len(root.turns) == 1 and root.turns[0].observation == "xyzzy-42\n"  # its first turn is kept
        assert root.verifier == 0.0  # the verifier alone would call it a failure of the policy ...
    assert elapsed < 30  # 3 retries with backoff (0.25 + 0.5 + 1 s), not the 300 s request timeout
    judged, stats = await judge_trees(trees, None, JudgeConfig(enabled=False))
    for t in judged[2:]:  # ... the judge leaves it unscored: not the policy's doing
        assert all(unscored(n.success) and n.judge["rule"] == "infrastructure" for n in t.nodes)
    assert stats.infra_unscored == {"policy_error": 2}
    assert [t.root.success for t in judged[:2]] == [1.0, 1.0]
    batch = build_samples([assign_rewards(t, 0.5) for t in judged])
    assert {s.tree_id for s in batch.samples} == {t.tree_id for t in quick}  # the iteration trains on the rest
    assert batch.stats.dropped_nan_root_trees == 2
