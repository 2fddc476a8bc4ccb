"""The judging stage: give every node of every execution tree its success signal s (Eq. 1).

Source per node, the first that applies (arXiv:2605.06639, section 2): 0. rules [project choice]: a tree whose
ROOT ended by :data:`INFRA_END_REASONS` is unscored (``infra_failures``), a sub-agent that did not finish gets
s = 0 (``unfinished_is_failure``); 1. the exact ``verifier`` value, else s = 0 for a sub-agent that forwarded its
own goal to its only child (rule ``forwarded``, :func:`forwards_its_goal`); 2. the LLM ``judge`` (NaN when its
answer cannot be read); 3. the root ``proxy`` (the paper's fallback; for every sub-agent with ``child_source:
root_proxy``, an ablation); 4. ``none``: NaN. :func:`judge_trees` never mutates its input: it returns deep copies
with ``success``, ``success_source`` and ``judge`` filled on every node.

Departure from the paper (gpt-5-mini as judge): any OpenAI-compatible endpoint (default the project's vLLM), a
persistent cache, a per-iteration budget, and the unfinished and forwarded rules, all configurable.
Docs: docs/judging.md#sources-per-node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import openai

from rao_core.judge.budget import JudgeStats
from rao_core.judge.client import JudgeOutcome, Judger
from rao_core.judge.config import JudgeConfig
from rao_core.judge.prompting import (NO_CELLS, JudgePrompt, clip, load_prompt, render_result, summarize_cells,
                                     summarize_subtasks)
from rao_core.tree import EndReason, ExecutionTree, Node, unscored, verifier_value

NAN = float("nan")
#: Root end reasons that say nothing about the policy: the server, the sandbox or the wall clock failed.
INFRA_END_REASONS = frozenset({EndReason.POLICY_ERROR, EndReason.SANDBOX_ERROR, EndReason.TOKEN_PREFIX_BREAK,
                               EndReason.TREE_TIMEOUT})


def _normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


def forwards_its_goal(node: Node, tree: ExecutionTree) -> bool:
    """Rule 1b: ``node`` launched exactly one sub-agent and gave it the node's own goal (whitespace and case
    normalised)."""
    children = tree.children_of(node.node_id)
    return len(children) == 1 and _normalised(children[0].goal) == _normalised(node.goal)


def tree_fields(node: Node, tree: ExecutionTree, config: JudgeConfig) -> dict[str, str]:
    """The prompt fields that need the tree: ``parent_goal`` and ``subtasks`` (goals of the node's children)."""
    parent = ("(none: this agent is the root)" if node.parent_id is None
              else clip(tree.node(node.parent_id).goal, config.max_goal_chars))
    return {"parent_goal": parent,
            "subtasks": summarize_subtasks(tree.children_of(node.node_id), config.max_goal_chars)}


def judge_inputs(node: Node, prompt: JudgePrompt, config: JudgeConfig, *,
                 tree: ExecutionTree | None = None) -> tuple[list[dict[str, str]], str, str, str]:
    """Render the judge's chat messages for ``node``: returns (messages, goal, result, cells) texts.

    ``tree`` fills ``parent_goal`` and ``subtasks`` (without it they read "(not shown)"). The returned
    ``goal`` is the cache key's goal: the node's goal, followed by the tree fields the prompt uses, so a
    verdict is never reused for another parent or other sub-tasks.
    """
    goal = clip(node.goal, config.max_goal_chars)
    result = render_result(node, config.max_result_chars)
    cells = summarize_cells(node, config.max_summary_chars) if config.include_cells else NO_CELLS
    extra = tree_fields(node, tree, config) if tree is not None else {}
    messages = prompt.render(goal=goal, result=result, cells=cells, **extra)
    key_goal = goal + "".join(f"\n[{k}]\n{v}" for k, v in sorted(extra.items()) if k in prompt.placeholders)
    return messages, key_goal, result, cells


def _judge_record(out: JudgeOutcome, config: JudgeConfig, prompt: JudgePrompt) -> dict[str, Any]:
    return {"verdict": out.verdict, "reason": out.reason, "raw": out.raw, "model": config.model,
            "prompt_version": prompt.version, "cached": out.cached, "attempts": out.attempts,
            "parsed_by": out.how, "status": out.status, "error": out.error}


def _wants_judge(node: Node, tree: ExecutionTree, env_name: str, config: JudgeConfig) -> bool:
    return (config.active and (config.judge_envs is None or env_name in config.judge_envs)
            and (node.node_id != tree.root_id or config.judge_roots))


def _set(node: Node, success: float, source: str, judge: dict[str, Any] | None = None) -> None:
    node.success = success
    node.success_source = source
    node.judge = judge


_said_off = False


def say_judge_off(config: JudgeConfig) -> bool:
    """Print :meth:`JudgeConfig.off_line` on stderr (once per process) when the judge is enabled without an
    endpoint, so a judge that is off says so and how to set it; returns whether it is off for that reason."""
    import sys

    global _said_off
    line = config.off_line()
    if line and not _said_off:
        _said_off = True
        print(f"warning: {line}", file=sys.stderr, flush=True)
    return line is not None


async def judge_trees(trees: Sequence[ExecutionTree], env_name: str | None, config: JudgeConfig, *,
                      client: openai.AsyncOpenAI | None = None) -> tuple[list[ExecutionTree], JudgeStats]:
    """Score every node of ``trees``; returns (deep copies with scores filled, stats of this call).

    ``env_name`` picks the prompt file (None: each tree's own ``env`` field). ``client`` overrides the
    AsyncOpenAI client built from ``config`` (tests, custom transports). Raises ``JudgeEndpointError``
    when the endpoint rejects the configuration, ValueError on a malformed verifier value.
    """
    t0 = time.monotonic()
    stats = JudgeStats()
    say_judge_off(config)
    out = [t.model_copy(deep=True) for t in trees]
    prompts: dict[str, JudgePrompt] = {}
    judger: Judger | None = None
    jobs: list[tuple[Node, JudgePrompt, asyncio.Task[JudgeOutcome]]] = []
    pending_proxy: list[tuple[ExecutionTree, Node, str | None]] = []  # (tree, node, why)
    try:
        for tree in out:
            for node in tree.nodes:  # a re-judged tree starts clean
                _set(node, NAN, "none")
        for tree in out:
            env = env_name or tree.env
            root_end = tree.root.end_reason
            if config.infra_failures == "unscored" and root_end in INFRA_END_REASONS:
                stats.infra_unscored[root_end.value] = stats.infra_unscored.get(root_end.value, 0) + 1
                for node in tree.nodes:
                    stats.nodes += 1
                    _set(node, NAN, "none", {"rule": "infrastructure", "verdict": None, "reason":
                                             f"root ended by {root_end.value}: not the policy's doing"})
                continue
            for node in tree.walk():
                stats.nodes += 1
                if config.child_source == "root_proxy" and node.node_id != tree.root_id:
                    pending_proxy.append((tree, node, "root_proxy"))
                    continue
                if (config.unfinished_is_failure and node.node_id != tree.root_id
                        and node.end_reason != EndReason.FINISHED):
                    stats.unfinished_rule += 1
                    _set(node, 0.0, "rule", {"verdict": "no", "rule": "unfinished", "reason":
                                             f"node did not finish (end reason: {node.end_reason.value})"})
                    continue
                v = verifier_value(node)
                if v is not None:
                    _set(node, v, "verifier")
                elif (config.forwarding_is_failure and node.node_id != tree.root_id
                        and forwards_its_goal(node, tree)):
                    _set(node, 0.0, "rule", {"verdict": "no", "rule": "forwarded", "reason":
                                             "its only sub-agent was given the node's own goal: no work of its own"})
                elif _wants_judge(node, tree, env, config):
                    if env not in prompts:
                        prompts[env] = load_prompt(env, config.prompt_dir)
                    prompt = prompts[env]
                    if judger is None:
                        judger = Judger(config, stats, client=client)
                    messages, goal, result, cells = judge_inputs(node, prompt, config, tree=tree)
                    task = asyncio.ensure_future(judger.judge(messages, prompt_version=prompt.version, goal=goal,
                                                              result=result, cells=cells))
                    jobs.append((node, prompt, task))
                else:
                    pending_proxy.append((tree, node, None))
        if jobs:
            outcomes = await asyncio.gather(*(t for _, _, t in jobs))
            node_tree = {id(n): t for t in out for n in t.nodes}
            for (node, prompt, _), res in zip(jobs, outcomes, strict=True):
                if res.status == "budget":
                    stats.budget_skipped += 1
                    pending_proxy.append((node_tree[id(node)], node, "budget"))
                    node.judge = _judge_record(res, config, prompt)
                    continue
                if res.status == "failed":
                    stats.failures += 1
                _set(node, res.success, "judge", _judge_record(res, config, prompt))
        for tree, node, why in pending_proxy:
            rec = node.judge if why == "budget" else None
            root = tree.root
            proxy_ok = why == "root_proxy" or (node.node_id != tree.root_id and config.use_proxy
                                               and (why != "budget" or config.on_budget_exhausted == "proxy"))
            if proxy_ok and not unscored(root.success):
                _set(node, root.success, "proxy", rec)
            else:
                _set(node, NAN, "none", rec)
    finally:
        for _, _, t in jobs:
            if not t.done():
                t.cancel()
        if judger is not None:
            await judger.aclose()
    for tree in out:
        for node in tree.nodes:
            stats.sources[node.success_source or "none"] += 1
    stats.wall_s = time.monotonic() - t0
    return out, stats


def judge_trees_sync(trees: Sequence[ExecutionTree], env_name: str | None, config: JudgeConfig, *,
                     client: openai.AsyncOpenAI | None = None) -> tuple[list[ExecutionTree], JudgeStats]:
    """Blocking wrapper of ``judge_trees`` (runs its own event loop; not callable from a running loop)."""
    return asyncio.run(judge_trees(trees, env_name, config, client=client))
