"""The walk-through environment (``example``, Box-Sum) end to end: generated tasks, the real runtime with its
scripted expert and a scripted wrong answer, exact verification of every node, its packaged judge prompt."""

from __future__ import annotations

import shutil

import pytest

from rao_core.envs import get_env, load_tasks, oracle_policy, write_tasks
from rao_core.envs.base import TaskError
from rao_core.judge.config import DEFAULT_PROMPT_DIR
from rao_core.judge.prompting import load_prompt
from rao_core.paths import tiny_model_path
from rao_core.policies.scripted import ReplayPolicy, cell
from rao_core.runtime import RuntimeConfig, run_trees
from rao_core.tree import EndReason

pytestmark = pytest.mark.skipif(not (tiny_model_path() / "tokenizer_config.json").exists(),
                                reason="tiny model tokenizer not prepared (make setup)")
CONFIG = RuntimeConfig(sandbox="bwrap" if shutil.which("bwrap") else "none", repl_pool_size=1, tree_timeout_s=120)


def test_tasks_are_seeded_and_validated(tmp_path):
    env = get_env("example")
    tasks = env.generate_tasks(n=3, seed=5, difficulty="medium")
    assert tasks == env.generate_tasks(n=3, seed=5, difficulty="medium")
    assert [len(t.data["boxes"]) for t in tasks] == [16, 16, 16]
    assert load_tasks(write_tasks(tmp_path / "t.jsonl", tasks), env) == tasks
    with pytest.raises(TaskError, match="data.boxes"):
        env.validate_task(tasks[0].model_copy(update={"data": {"boxes": [1, "2"]}}))
    with pytest.raises(ValueError, match="unknown difficulty"):
        env.generate_tasks(n=1, seed=0, difficulty="extreme")


async def test_expert_solves_through_the_runtime_and_every_node_is_verified():
    env = get_env("example")
    tasks = env.generate_tasks(n=2, seed=1, difficulty="medium") + env.generate_tasks(n=1, seed=1, difficulty="easy")
    trees = await run_trees(env, [(t, 1) for t in tasks], oracle_policy("example"), CONFIG,
                            tokenizer=tiny_model_path())
    for task, tree in zip(tasks, trees):
        assert tree.error is None, tree.error
        assert tree.root.end_reason == EndReason.FINISHED and tree.root.result == sum(task.data["boxes"])
        assert [n.verifier for n in tree.nodes] == [1.0] * len(tree.nodes)
    # 16 boxes: the root splits 0..7 and 8..15 into two sub-agents that open their boxes; 4 boxes: no split
    medium, easy = trees[0], trees[2]
    assert [(n.node_id, n.goal_args) for n in medium.nodes] == [
        ("0", {"first": 0, "last": 15}), ("0.0", {"first": 0, "last": 7}), ("0.1", {"first": 8, "last": 15})]
    assert medium.node("0.1").result == sum(tasks[0].data["boxes"][8:])
    assert len(easy.nodes) == 1


async def test_wrong_totals_and_bad_calls_score_zero():
    env = get_env("example")
    task = env.generate_tasks(n=1, seed=2, difficulty="easy")[0]
    boxes = task.data["boxes"]
    pol = ReplayPolicy(by_goal={"boxes 0 to 1 ": [cell("finish(open_box(0))")]}, default=[
        cell("try:\n    open_box(9)\nexcept Exception as e:\n    print(e)\n"
             "a = await launch_subagent(0, 1)\nfinish(a + open_box(2) + open_box(3))")])
    (tree,) = await run_trees(env, [(task, 1)], pol, CONFIG, tokenizer=tiny_model_path())
    root, child = tree.root, tree.node("0.0")
    assert root.turns[0].observation.startswith("open_box: index must be an int in 0..3, got 9")
    assert child.result == boxes[0] and child.verifier == 0.0  # forgot box 1
    assert root.result == boxes[0] + boxes[2] + boxes[3] and root.verifier == 0.0


def test_judge_prompt_ships_in_the_package():
    prompt = load_prompt("example", DEFAULT_PROMPT_DIR)
    assert prompt.path.endswith("rao_core/envs/example/judge.md") and prompt.version.startswith("judge/v1#")
    assert "{{goal}}" in prompt.user and "range of boxes" in prompt.system
