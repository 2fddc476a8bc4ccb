"""A small fake Environment and helpers for runtime tests (no TextCraft needed)."""

from __future__ import annotations

import shutil
from typing import Any

from rao_core.envs.base import ChildSpec, Environment, Episode, Task, ToolError, tool
from rao_core.paths import default_model_path, tiny_model_path
from rao_core.runtime import RuntimeConfig
from rao_core.tree import Node

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"


def runtime_config(**kw: Any) -> RuntimeConfig:
    """The runtime tests' limits: depth 3, a 4096-token window, 128 new tokens, 60 s per tree, one pre-started
    REPL, bubblewrap where installed; ``kw`` overrides any field."""
    return RuntimeConfig(**{"max_depth": 3, "context_window": 4096, "max_new_tokens": 128, "sandbox": SANDBOX,
                            "repl_pool_size": 1, "tree_timeout_s": 60, **kw})


class CounterEpisode(Episode):
    counter: int = 0


class FakeEnv(Environment):
    """Tools: get_info() -> dict, add(n) -> new counter, fail() raises ToolError, submit(x) finishes."""

    name = "fake"
    exact_subtask_verifier = True

    def new_episode(self, task: Task) -> Episode:
        return CounterEpisode(task=task)

    def root_goal(self, task: Task) -> ChildSpec:
        return ChildSpec(goal=task.data.get("goal", "root goal"), goal_args={"expect": task.data.get("expect")})

    def child_spec(self, episode: Episode, parent: Node, args: list[Any], kwargs: dict[str, Any]) -> ChildSpec:
        spec = super().child_spec(episode, parent, args, dict(kwargs))
        if "max_steps" in spec.goal:
            spec.max_steps = 100
        return spec

    def repl_variables(self, episode: Episode, node: Node) -> dict[str, Any]:
        return {"NODE_DEPTH": node.depth}

    @tool
    def get_info(self, episode: CounterEpisode, node: Node) -> dict:
        """Info about the episode."""
        return {"depth": node.depth, "counter": episode.counter}

    @tool
    def add(self, episode: CounterEpisode, n: int) -> int:
        """Add n to the shared counter."""
        episode.counter += int(n)
        return episode.counter

    @tool
    def fail(self, episode: CounterEpisode) -> None:
        """Always fails."""
        raise ToolError("this tool always fails")

    @tool(finishes=True)
    def submit(self, episode: CounterEpisode, answer) -> object:
        """Submit and finish."""
        return {"submitted": answer}

    def verify(self, episode: Episode, node: Node) -> float | None:
        expect = node.goal_args.get("expect")
        if expect is None:
            return None
        return 1.0 if node.result == expect else 0.0


def tokenizer_path() -> str:
    for p in (tiny_model_path(), default_model_path()):
        if (p / "tokenizer.json").exists():
            return str(p)
    import pytest

    pytest.skip("no tokenizer in var/models (run make setup)")


def task(goal: str = "root goal", expect: Any = None, task_id: str = "t0") -> Task:
    return Task(task_id=task_id, env="fake", data={"goal": goal, "expect": expect})
