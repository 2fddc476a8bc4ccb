"""End to end: the TextCraft expert solves tasks through the real runtime (sandboxed REPLs, default limits)."""

from __future__ import annotations

import shutil

import pytest

from rao_core.envs import get_env
from rao_core.paths import tiny_model_path
from rao_core.policies.textcraft_expert import TextCraftExpert
from rao_core.runtime import RuntimeConfig, run_trees
from rao_core.tree import EndReason

pytestmark = pytest.mark.skipif(not (tiny_model_path() / "tokenizer_config.json").exists(),
                                reason="tiny model tokenizer not prepared (make setup)")


async def _solve_all(tasks):
    env = get_env("textcraft-synth")
    # default limits (max depth 2, 10 steps/node, 8K context, 2000-char observations); only the sandbox
    # falls back to plain subprocesses where bubblewrap is missing
    config = RuntimeConfig(sandbox="bwrap" if shutil.which("bwrap") else "none")
    trees = await run_trees(env, [(t, 1) for t in tasks], TextCraftExpert(seed=0), config,
                            tokenizer=tiny_model_path())
    for task, tree in zip(tasks, trees):
        assert tree.error is None, tree.error
        bad = [(n.node_id, n.end_reason, n.error) for n in tree.nodes if n.verifier != 1.0]
        assert not bad, (task.task_id, bad)  # every node, root and sub-agents, verified exactly
        assert tree.root.end_reason == EndReason.FINISHED and tree.root.result.startswith("Crafted")
        assert all(len(n.token_ids) <= config.context_window for n in tree.nodes)
    return trees


async def test_expert_solves_easy_and_medium_tasks_through_the_runtime():
    env = get_env("textcraft-synth")
    tasks = env.generate_tasks(n=2, seed=31, difficulty="easy") + env.generate_tasks(n=2, seed=31, difficulty="medium")
    trees = await _solve_all(tasks)
    assert any(len(t.nodes) > 1 for t in trees)  # delegation happened through the real launch_subagent


@pytest.mark.slow
async def test_expert_solves_hard_and_extreme_tasks_through_the_runtime():
    env = get_env("textcraft-synth")
    tasks = env.generate_tasks(n=1, seed=41, difficulty="hard") + env.generate_tasks(n=1, seed=41, difficulty="extreme")
    trees = await _solve_all(tasks)
    assert all(t.depth == 2 for t in trees)
