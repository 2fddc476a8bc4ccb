"""A small fake Environment and helpers for runtime tests (no TextCraft needed)."""

from __future__ import annotations

from typing import Any

from rao_core.envs.base import ChildSpec, Environment, Episode, Task, ToolError, ToolSpec
from rao_core.paths import default_model_path, tiny_model_path
from rao_core.tree import Node


class CounterEpisode(Episode):
    counter: int = 0
    log: list[str] = []


class FakeEnv(Environment):
    """Tools: get_info() -> dict, add(n) -> new counter, fail() raises ToolError, submit(x) finishes."""

    name = "fake"
    exact_subtask_verifier = True

    def tools(self) -> list[ToolSpec]:
        return [
            ToolSpec(name="get_info", signature="get_info() -> dict", doc="Info about the episode."),
            ToolSpec(name="add", signature="add(n: int) -> int", doc="Add n to the shared counter."),
            ToolSpec(name="fail", signature="fail() -> None", doc="Always fails."),
            ToolSpec(name="submit", signature="submit(answer) -> object", doc="Submit and finish.",
                     finishes=True),
        ]

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

    def call_tool(self, episode: Episode, node: Node, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        episode.log.append(name)
        if name == "get_info":
            return {"depth": node.depth, "counter": episode.counter}
        if name == "add":
            episode.counter += int(args[0] if args else kwargs["n"])
            return episode.counter
        if name == "fail":
            raise ToolError("this tool always fails")
        if name == "submit":
            return {"submitted": args[0] if args else kwargs.get("answer")}
        raise ToolError(f"unknown tool {name}")

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
