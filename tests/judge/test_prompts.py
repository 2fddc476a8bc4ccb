"""Prompt files: every shipped prompt loads, renders its inputs, and versions change with the text."""

from __future__ import annotations

import pytest

from rao_core.judge import JudgeConfig, PromptError, load_prompt
from rao_core.judge.config import DEFAULT_PROMPT_DIR
from rao_core.judge.prompting import render_result, summarize_cells
from rao_core.judge.stage import judge_inputs
from tests.judge.conftest import node, tree

#: Version of each shipped prompt (v2: the failure rules of forwarding and unused children).
VERSIONS = {"textcraft-synth": 1, "oolong": 2, "deepdive": 2, "arte": 2, "default": 2}


@pytest.mark.parametrize(("env", "file"), [
    ("textcraft-synth", "textcraft-synth"), ("oolong", "oolong"), ("deepdive", "deepdive"),
    ("deepdive-synth", "deepdive"), ("arte", "arte"), ("arte-synth", "arte"), ("something-new", "default"),
])
def test_every_env_has_a_prompt(env, file):
    p = load_prompt(env, DEFAULT_PROMPT_DIR)
    assert p.name == file and p.version.startswith(f"{file}/v{VERSIONS[file]}#") and len(p.version.split("#")[1]) == 8
    msgs = p.render(goal="GOAL-TEXT", result="RESULT-TEXT", cells="CELLS-TEXT")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "GOAL-TEXT" in msgs[1]["content"] and "RESULT-TEXT" in msgs[1]["content"]
    assert "CELLS-TEXT" in msgs[1]["content"] and "{{" not in msgs[1]["content"]
    assert '"verdict"' in msgs[0]["content"]


def _write(tmp_path, body: str, version: str = "1"):
    (tmp_path / "x.md").write_text(f"---\nversion: {version}\n---\n{body}", encoding="utf-8")


def test_version_hash_changes_with_text(tmp_path):
    _write(tmp_path, "=== system ===\nS\n=== user ===\n{{goal}} {{result}}")
    v1 = load_prompt("x", tmp_path).version
    _write(tmp_path, "=== system ===\nS2\n=== user ===\n{{goal}} {{result}}")
    v2 = load_prompt("x", tmp_path).version
    assert v1.split("#")[0] == v2.split("#")[0] == "x/v1" and v1 != v2


@pytest.mark.parametrize(("body", "msg"), [
    ("=== user ===\n{{goal}} {{result}}", "exactly one"),
    ("=== system ===\nS\n=== user ===\n{{goal}} {{result}} {{secret}}", "unknown placeholders"),
    ("=== system ===\nS\n=== user ===\n{{goal}}", "must use"),
    ("=== system ===\n{{goal}}\n=== user ===\n{{goal}} {{result}}", "user section"),
])
def test_malformed_prompts_are_rejected(tmp_path, body, msg):
    _write(tmp_path, body)
    with pytest.raises(PromptError, match=msg):
        load_prompt("x", tmp_path)


def test_missing_prompt(tmp_path):
    with pytest.raises(PromptError, match="no judge prompt"):
        load_prompt("oolong", tmp_path)


def test_result_rendering():
    assert render_result(node("a", None, result={"b": 2, "a": [1]}), 100) == '{"a": [1], "b": 2}'
    assert render_result(node("a", None, result="x" * 50), 1000) == "x" * 50
    assert "did not call finish; end reason: max_steps" in render_result(node("a", None, finished=False), 100)
    long = render_result(node("a", None, result="a" * 300 + "Z" * 300), 200)
    assert len(long) <= 200 and "characters omitted" in long and long.startswith("a") and long.endswith("Z")


def test_cell_summary_is_bounded_and_ordered():
    n = node("a", None, cells=[(f"craft({i})", f"ok {i}") for i in range(100)])
    s = summarize_cells(n, 500)
    assert len(s) <= 500 and s.startswith("[cell 1]\ncraft(0)\n[output 1]\nok 0") and s.endswith("ok 99")
    assert summarize_cells(node("b", None), 500) == "(no code cells)"


def test_judge_inputs_respect_include_cells(tmp_path):
    n = node("a", None, goal="count rolls", result=7, cells=[("print(1)", "1")])
    p = load_prompt("oolong", DEFAULT_PROMPT_DIR)
    msgs, goal, result, cells = judge_inputs(n, p, JudgeConfig(include_cells=True))
    assert (goal, result) == ("count rolls", "7") and "print(1)" in msgs[1]["content"]
    msgs, _, _, cells = judge_inputs(n, p, JudgeConfig(include_cells=False))
    assert cells == "(not shown)" and "print(1)" not in msgs[1]["content"]


def _forwarding_tree(env: str):
    """p asks the question; n works on a part with a regex, hits the depth limit once and delegates once."""
    cells = [("import re\nprint(len(re.findall(r'Vex rolls', context)))", "7"),
             ("r = await launch_subagent('deeper')", "ToolError: launch_subagent refused: maximum depth 2 reached")]
    return tree(env, [node("p", None, goal="PARENT-QUESTION: how many rolls?"),
                      node("n", "p", depth=1, goal="NODE-GOAL: count the rolls in chunk 1", result=7, cells=cells),
                      node("k", "n", depth=2, goal="CHILD-GOAL: count the rolls in half of chunk 1")])


#: Each v2 failure rule: the words the system message must hold, per prompt.
FORWARDING = ("only forwarded its task", "its own goal unchanged", "returned its parent's goal or question")
RULES = {
    "oolong": FORWARDING + ("string matching, regex or keyword counting", "re.findall",
                            "read or delegate, do not pattern-match"),
    "arte": FORWARDING + ('"launch_subagent refused"', "maximum depth reached", "the sub-agent that never ran"),
    "deepdive": FORWARDING,
    "default": FORWARDING,
}


@pytest.mark.parametrize("env", sorted(RULES))
def test_prompts_state_the_v2_failure_rules_and_show_their_inputs(env):
    """The system message states each rule as a "no" criterion; the user message shows what applying them
    needs: the parent's goal, the delegated goals and the cells (the regex call, the refused launch)."""
    t = _forwarding_tree(env)
    p = load_prompt(env, DEFAULT_PROMPT_DIR)
    assert {"parent_goal", "subtasks", "cells"} <= p.placeholders
    msgs, goal, _, _ = judge_inputs(t.node("n"), p, JudgeConfig(), tree=t)
    system, user = msgs[0]["content"], msgs[1]["content"]
    assert 'Also answer "no" when:' in system
    for phrase in RULES[env]:
        assert phrase in system, phrase
    assert "## Parent's goal" in user and "## Sub-tasks it delegated" in user
    for shown in ("NODE-GOAL", "PARENT-QUESTION", "[sub-agent 1] CHILD-GOAL", "re.findall(r'Vex rolls', context)",
                  "launch_subagent refused: maximum depth 2 reached"):
        assert shown in user, shown
    assert "{{" not in user
    # the cache key's goal carries the shown tree fields, so another parent is another key
    assert goal.startswith("NODE-GOAL") and "PARENT-QUESTION" in goal and "CHILD-GOAL" in goal


def test_tree_fields_of_a_root_and_a_leaf():
    t = _forwarding_tree("oolong")
    p = load_prompt("oolong", DEFAULT_PROMPT_DIR)
    root = judge_inputs(t.root, p, JudgeConfig(), tree=t)[0][1]["content"]
    leaf = judge_inputs(t.node("k"), p, JudgeConfig(), tree=t)[0][1]["content"]
    assert "(none: this agent is the root)" in root and "[sub-agent 1] NODE-GOAL" in root
    assert "NODE-GOAL" in leaf and "(none: it launched no sub-agent)" in leaf
    # without the tree (calibration) the fields read "(not shown)" and the key is the plain goal
    msgs, goal, _, _ = judge_inputs(t.node("n"), p, JudgeConfig())
    assert goal == "NODE-GOAL: count the rolls in chunk 1" and msgs[1]["content"].count("(not shown)") == 2


def test_a_prompt_without_the_new_fields_renders_as_before(tmp_path):
    """A v1 prompt (goal, result, cells only) renders unchanged and keeps its key."""
    _write(tmp_path, "=== system ===\nS\n=== user ===\nG={{goal}} R={{result}} C={{cells}}")
    t = _forwarding_tree("x")
    p = load_prompt("x", tmp_path)
    msgs, goal, result, cells = judge_inputs(t.node("n"), p, JudgeConfig(), tree=t)
    assert msgs[1]["content"] == f"G=NODE-GOAL: count the rolls in chunk 1 R=7 C={cells}"
    assert goal == "NODE-GOAL: count the rolls in chunk 1" and result == "7"
    # the TextCraft prompt uses none of the tree fields: its cache key does not depend on the tree
    t = _forwarding_tree("textcraft-synth")
    p = load_prompt("textcraft-synth", DEFAULT_PROMPT_DIR)
    assert judge_inputs(t.node("n"), p, JudgeConfig(), tree=t)[1:] == judge_inputs(t.node("n"), p, JudgeConfig())[1:]
