"""Prompt files: every shipped prompt loads, renders its inputs, and versions change with the text."""

from __future__ import annotations

import pytest

from rao_core.judge import JudgeConfig, PromptError, load_prompt
from rao_core.judge.config import DEFAULT_PROMPT_DIR
from rao_core.judge.prompting import render_result, summarize_cells
from rao_core.judge.stage import judge_inputs
from tests.judge.conftest import node


@pytest.mark.parametrize(("env", "file"), [
    ("textcraft-synth", "textcraft-synth"), ("oolong", "oolong"), ("deepdive", "deepdive"),
    ("deepdive-synth", "deepdive"), ("arte", "arte"), ("arte-synth", "arte"), ("something-new", "default"),
])
def test_every_env_has_a_prompt(env, file):
    p = load_prompt(env, DEFAULT_PROMPT_DIR)
    assert p.name == file and p.version.startswith(f"{file}/v1#") and len(p.version.split("#")[1]) == 8
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
