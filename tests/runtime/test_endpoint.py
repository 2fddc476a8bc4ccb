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
