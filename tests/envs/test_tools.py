"""Tools declared once (``@tool``): signatures and docs from the methods, one binder, one registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from rao_core.envs import (ENV_NAMES, REGISTRY, ChildSpec, Environment, Episode, Task, ToolError, canonical_name,
                           get_env, oracle_policy, packaged_judge_prompt, tool)
from rao_core.judge.prompting import prompt_file
from rao_core.runtime import RuntimeConfig, system_prompt
from rao_core.tree import Node

PROMPTS = Path(__file__).parent / "fixtures" / "system_prompts.json"


@pytest.mark.parametrize("name", ["textcraft-synth", "oolong", "deepdive", "arte"])
def test_system_prompt_is_unchanged_by_declaring_tools_on_methods(name):
    """The root's system prompt, byte for byte as it was when each tool was a hand-written ToolSpec
    (captured before the change into fixtures/system_prompts.json)."""
    config = RuntimeConfig(max_depth=2, max_steps_per_node=10, observation_max_chars=2000)
    text = system_prompt(get_env(name), config, Node(node_id="0", goal="g"))
    assert text == json.loads(PROMPTS.read_text())[name]


class _Config(BaseModel):
    width: int = 7


class _Toy(Environment):
    name = "toy"

    def __init__(self):
        self.config = _Config()

    def new_episode(self, task: Task) -> Episode:
        return Episode(task=task)

    def root_goal(self, task: Task) -> ChildSpec:
        return ChildSpec(goal="g")

    @tool
    def zeta(self, episode: Episode, node: Node, a: int, b: str = "x") -> list[int]:
        """Cut into $width pieces;
        keeps $missing as written."""
        return [node.depth, a, len(b), len(episode.task.task_id)]

    @tool(finishes=True)
    def alpha(self, answer, extra=None):
        """Finish."""
        return {"answer": answer, "extra": extra}

    def helper(self, x: int) -> int:  # not a tool
        return x


def test_tool_specs_come_from_signatures_and_docstrings():
    toy = _Toy()
    specs = {t.name: t for t in toy.tools()}
    assert [t.name for t in toy.tools()] == ["zeta", "alpha"]  # definition order, not alphabetical
    assert specs["zeta"].signature == "zeta(a: int, b: str = 'x') -> list[int]"  # episode, node left out
    assert specs["zeta"].doc == "Cut into 7 pieces; keeps $missing as written."  # one paragraph, config value
    assert specs["alpha"].signature == "alpha(answer, extra=None)" and specs["alpha"].finishes
    assert not specs["zeta"].finishes
    sub = toy.subagent_tool()
    assert sub.signature == "launch_subagent(goal: str, context: str = '') -> object"
    assert sub.doc.startswith("Start a sub-agent with a fresh context on `goal`")


def test_one_binder_for_every_tool_and_launch_subagent():
    toy = _Toy()
    ep = toy.new_episode(Task(task_id="abc", env="toy"))
    node = Node(node_id="0.1", depth=1, goal="g")
    # positional, keyword and default values bind as Python would; episode and node are passed in
    assert toy.call_tool(ep, node, "zeta", [5], {}) == [1, 5, 1, 3]
    assert toy.call_tool(ep, node, "zeta", [], {"b": "four", "a": 2}) == [1, 2, 4, 3]
    assert toy.call_tool(ep, node, "alpha", ["42"], {}) == {"answer": "42", "extra": None}
    for name, args, kwargs, msg in [
        ("zeta", [], {}, r"zeta\(\) missing argument\(s\): a"),
        ("zeta", [1, "b", 3], {}, r"zeta\(\) takes at most 2 argument\(s\) \(a, b\), got 3"),
        ("zeta", [1], {"c": 2}, r"zeta\(\) got an unexpected argument 'c'; expected a, b"),
        ("zeta", [1], {"a": 2}, r"zeta\(\) got two values for 'a'"),
        ("helper", [1], {}, r"unknown tool 'helper'; available: zeta, alpha"),
    ]:
        with pytest.raises(ToolError, match=msg):
            toy.call_tool(ep, node, name, args, kwargs)
    spec = toy.child_spec(ep, node, ["find x"], {"context": "hint"})
    assert spec.goal == "find x\n\nContext:\nhint" and spec.goal_args == {"goal": "find x", "context": "hint"}
    with pytest.raises(ToolError, match=r"launch_subagent\(\) got an unexpected argument 'steps'"):
        toy.child_spec(ep, node, ["find x"], {"steps": 3})
    with pytest.raises(ToolError, match="non-empty goal"):
        toy.child_spec(ep, node, [" "], {})


def test_registry_holds_aliases_experts_and_judge_prompts():
    assert ENV_NAMES == sorted(["arte", "arte-synth", "deepdive", "deepdive-synth", "example", "oolong",
                                "textcraft-synth"])
    assert canonical_name("deepdive-synth") == "deepdive" and canonical_name("fake") == "fake"
    assert type(get_env("arte-synth")) is type(get_env("arte"))
    assert type(oracle_policy("deepdive-synth")).__name__ == "DeepDiveExpert"
    assert type(oracle_policy("example")).__name__ == "BoxSumExpert"
    with pytest.raises(ValueError, match="no oracle policy for environment 'oolong'"):
        oracle_policy("oolong")
    with pytest.raises(ValueError, match="unknown environment 'minecraft'"):
        get_env("minecraft")
    assert packaged_judge_prompt("example") == Path(__file__).parents[2] / "rao_core/envs/example/judge.md"
    assert packaged_judge_prompt("textcraft-synth") is None and packaged_judge_prompt("fake") is None
    assert all(e.env.count(":") == 1 for e in REGISTRY.values())


def test_judge_prompt_lookup_prompt_dir_then_alias_then_package_then_default(tmp_path):
    for name in ("default", "deepdive"):
        (tmp_path / f"{name}.md").write_text("x")
    assert prompt_file("deepdive-synth", tmp_path) == tmp_path / "deepdive.md"  # alias -> registry name's file
    assert prompt_file("example", tmp_path) == packaged_judge_prompt("example")  # shipped in its package
    assert prompt_file("oolong", tmp_path) == tmp_path / "default.md"
    (tmp_path / "example.md").write_text("x")
    assert prompt_file("example", tmp_path) == tmp_path / "example.md"  # the prompt folder wins
