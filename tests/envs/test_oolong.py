"""Oolong: official scoring on hand-written cases, loaders on fixture files, generator and environment."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from rao_core.envs import get_env, load_tasks, write_tasks
from rao_core.envs.base import ToolError
from rao_core.envs.oolong import (
    OolongEnv, approx_tokens, extract_boxed, generate_oolong_tasks, load_oolong_real, load_oolong_synth,
    score_answer, score_synth_answer,
)
from rao_core.tree import EndReason, Node
from tests.envs.fixtures.make_oolong_fixtures import write_fixtures

ENV = OolongEnv()


# ---------------------------------------------------------------- scoring ---------------------------------------------
def test_boxed_extraction():
    assert extract_boxed(r"so \boxed{12}") == "12"
    assert extract_boxed(r"\boxed{1} then \boxed{3}") == "3"  # the last box counts
    assert extract_boxed(r"\boxed{\text{Fire Bolt}}") == r"\text{Fire Bolt}"  # nested braces kept whole
    assert extract_boxed("no box") is None


def test_score_answer_hand_cases():
    assert score_answer(r"\boxed{7}", "7") == 1.0
    assert score_answer(r"\boxed{5}", "7") == pytest.approx(0.5625)  # 0.75 ** |7 - 5| = 0.75 ** 2 = 0.5625
    assert score_answer(r"\boxed{10}", "7") == pytest.approx(0.421875)  # 0.75 ** 3 = 0.421875
    assert score_answer(r"answer \boxed{ Thorn }", "thorn") == 1.0  # lowercased and stripped
    assert score_answer(r"\boxed{Thorns}", "Thorn") == 0.0  # exact match only
    # list recall: gold {fireball, shield, misty step}; pred has fireball, shield, bless -> 2 / 3
    assert score_answer(r"\boxed{Fireball, Shield, Bless}", "Fireball, Shield, Misty Step") == pytest.approx(2 / 3)
    assert score_answer(r"\boxed{shield, fireball}", "Fireball, Shield") == 1.0  # order does not matter
    assert score_answer(r"\boxed{Fireball}", "7") == 0.0  # string vs int: type mismatch
    assert score_answer(r"\boxed{7}", "Fireball, Shield") == 0.0  # int vs list: type mismatch
    assert score_answer(r"\boxed{Fireball}", "Fireball, Shield") == 0.0  # string vs list: type mismatch
    assert score_answer("7", "7") == 1.0  # no box: the whole stripped response is the answer (project choice)
    assert score_answer(r"\boxed{-1}", "1") == pytest.approx(0.5625)  # 0.75 ** 2


def test_score_synth_answer_hand_cases():
    assert score_synth_answer(r"\boxed{spam}", "['spam']", "LABEL") == 1.0
    assert score_synth_answer("Label: SPAM", "['spam']", "LABEL") == 1.0  # tag stripped, lowercased
    assert score_synth_answer(r"\boxed{ham}", "['spam']", "LABEL") == 0.0
    assert score_synth_answer(r"\boxed{10}", "[12]", "NUMERIC") == pytest.approx(0.5625)  # 0.75 ** 2
    assert score_synth_answer(r"\boxed{many}", "[12]", "NUMERIC") == 0.0  # not a number
    assert score_synth_answer(r"\boxed{more common than}", "['more common than']", "COMPARISON") == 1.0
    with pytest.raises(ValueError, match="answer_type"):
        score_synth_answer("x", "['x']", "COLOUR")


# ---------------------------------------------------------------- loaders ---------------------------------------------
def test_loaders_on_fixture_files(tmp_path):
    real_path, synth_path = write_fixtures(tmp_path)
    real = load_oolong_real(real_path)
    assert [t.task_id for t in real] == ["oolong-real-dnd-0001", "oolong-real-dnd-0002"]
    assert [t.split for t in real] == ["test", "validation"]  # campaign 1 = test, 2 = validation
    d = real[1].data
    assert d["episodes"] == [4, 5] and d["question_type"] == "multidoc_spells" and d["campaign"] == 2
    assert d["answer"] == "Hunter's Mark, Fireball" and d["context"].startswith("[START OF EPISODE 4]")
    # JSON lines works too
    jl = tmp_path / "real.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in json.loads(real_path.read_text())))
    assert [t.data for t in load_oolong_real(jl)] == [t.data for t in real]
    synth = load_oolong_synth(synth_path)
    assert [t.data["answer_type"] for t in synth] == ["LABEL", "NUMERIC"]
    assert synth[1].data["answer"] == "[12]" and synth[1].data["context_len"] == 2048
    assert synth[0].data["context"].startswith("Date: Jan 01, 2023 || User: 42")
    # tasks round-trip through task files
    write_tasks(tmp_path / "t.jsonl", real + synth)
    assert load_tasks(tmp_path / "t.jsonl") == real + synth


def test_loaders_reject_bad_records(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "x", "question": "q"}]))
    with pytest.raises(ValueError, match="misses field"):
        load_oolong_real(bad)
    with pytest.raises(FileNotFoundError):
        load_oolong_real(tmp_path / "none.json")


# ---------------------------------------------------------------- generator -------------------------------------------
def test_generator_is_deterministic(tmp_path):
    a = write_tasks(tmp_path / "a.jsonl", generate_oolong_tasks(n=6, seed=3, target_tokens=1500)).read_bytes()
    b = write_tasks(tmp_path / "b.jsonl", generate_oolong_tasks(n=6, seed=3, target_tokens=1500)).read_bytes()
    c = write_tasks(tmp_path / "c.jsonl", generate_oolong_tasks(n=6, seed=4, target_tokens=1500)).read_bytes()
    assert a == b and a != c


@pytest.mark.parametrize("target", [1000, 8000, 40000])
def test_generator_hits_the_target_length(target):
    for t in generate_oolong_tasks(n=4, seed=1, target_tokens=target):
        assert target <= t.data["context_tokens"] <= target * 1.1 + 100
        assert t.data["context_tokens"] == approx_tokens(t.data["context"])


_ROLL = re.compile(r"^(\w+): (?:Natural (20|1) on the ([a-z ]+)[.!]|(\d+) for ([a-z ]+)\.)$")
_SPELL = re.compile(r"^(\w+): I cast ([A-Za-z' ]+?)(?: at (\d)\w\w level)?\.$")


def _reparse(context: str):
    """Independent parse of the transcript text back into roll and spell events."""
    cast = dict(re.findall(r"^- (\w+) plays (\w+)$", context, re.M))
    events, episode = [], None
    for line in context.splitlines():
        m = re.match(r"\[START OF EPISODE (\d+)\]", line)
        if m:
            episode = int(m.group(1))
        if (r := _ROLL.match(line)):
            value = int(r.group(2) or r.group(4))
            events.append(("roll", episode, cast[r.group(1)], (r.group(3) or r.group(5)), value, bool(r.group(2))))
        elif (s := _SPELL.match(line)):
            events.append(("spell", episode, cast[s.group(1)], s.group(2), s.group(3)))
    return cast, events


def test_generator_answers_match_the_logged_ground_truth():
    tasks = generate_oolong_tasks(n=40, seed=9, target_tokens=3000)
    assert Counter(t.difficulty for t in tasks) == Counter({q: 10 for q in
                                                           ("singledoc_rolls", "singledoc_spells",
                                                            "multidoc_rolls", "multidoc_spells")})
    for t in tasks:
        d = t.data
        cast, parsed = _reparse(d["context"])
        assert cast == d["cast"]
        logged = [("roll", e["episode"], e["character"], e["roll_type"], e["value"], e["natural"] is not None)
                  if e["kind"] == "roll" else
                  ("spell", e["episode"], e["character"], e["spell"],
                   None if e["level"] == e["base_level"] else str(e["level"]))
                  for e in d["events"]]
        assert parsed == logged, t.task_id  # the text holds exactly the logged events
        eps = {e[1] for e in parsed}
        assert eps <= set(d["episodes"]) and len(d["episodes"]) == (1 if t.difficulty.startswith("single") else
                                                                    len(d["episodes"]))
        # recompute simple count answers from the re-parsed text
        q, a = d["question"], d["answer"]
        rolls = [e for e in parsed if e[0] == "roll"]
        spells = [e for e in parsed if e[0] == "spell"]
        if q == "How many dice rolls were made in total?":
            assert a == str(len(rolls))
        elif q == "How many natural 20s were rolled?":
            assert a == str(sum(e[5] and e[4] == 20 for e in rolls))
        elif q == "How many spells were cast in total?":
            assert a == str(len(spells))
        elif (m := re.match(r"How many dice rolls did (\w+) make\?", q)):
            assert a == str(sum(e[2] == m.group(1) for e in rolls))
        elif (m := re.match(r"What were the first (\d) spells cast", q)):
            assert a == ", ".join(e[3] for e in spells[: int(m.group(1))])
        assert score_answer(f"\\boxed{{{a}}}", a) == 1.0


def test_generator_rejects_bad_options():
    with pytest.raises(ValueError, match="question type"):
        generate_oolong_tasks(n=1, seed=0, difficulty="hard")
    with pytest.raises(ValueError, match="split"):
        generate_oolong_tasks(n=1, seed=0, split="dev")
    with pytest.raises(ValueError, match="unknown generator option"):
        ENV.generate_tasks(n=1, seed=0, foo=2)


# ---------------------------------------------------------------- environment -----------------------------------------
def test_env_context_variables_tools_and_verify():
    env = get_env("oolong")
    task = env.generate_tasks(n=1, seed=0, difficulty="singledoc_rolls", target_tokens=1000)[0]
    ep = env.new_episode(task)
    spec = env.root_goal(task)
    assert task.data["question"] in spec.goal and "\\boxed{}" in spec.goal
    root = Node(node_id="r", goal=spec.goal, goal_args=spec.goal_args)
    assert env.repl_variables(ep, root) == {"context": task.data["context"]}
    cspec = env.child_spec(ep, root, ["count the rolls"], {"context": "Ada: 3 for stealth."})
    child = Node(node_id="c", parent_id="r", depth=1, goal=cspec.goal, goal_args=cspec.goal_args)
    assert env.repl_variables(ep, child) == {"context": "Ada: 3 for stealth."}
    assert env.call_tool(ep, root, "count_tokens", ["Ada: 3 for stealth."], {}) == 6  # Ada : 3 for stealth .
    with pytest.raises(ToolError, match="string"):
        env.call_tool(ep, root, "count_tokens", [3], {})
    with pytest.raises(ToolError, match="unknown tool"):
        env.call_tool(ep, root, "craft", [], {})
    assert env.verify(ep, root) == 0.0  # not finished
    root.end_reason = EndReason.FINISHED
    root.result = f"The answer is \\boxed{{{task.data['answer']}}}"
    assert env.verify(ep, root) == 1.0
    root.result = "\\boxed{" + str(int(task.data["answer"]) + 1) + "}"  # off by one: 0.75 ** 1
    assert env.verify(ep, root) == pytest.approx(0.75)
    child.end_reason = EndReason.FINISHED
    assert env.verify(ep, child) is None  # sub-agents: judge or proxy decides


def test_env_verifies_synth_records_with_the_synth_scorer(tmp_path):
    _, synth_path = write_fixtures(tmp_path)
    task = load_oolong_synth(synth_path)[1]  # NUMERIC, gold [12]
    ep = ENV.new_episode(task)
    root = Node(node_id="r", goal="q", end_reason=EndReason.FINISHED, result="\\boxed{11}")
    assert ENV.verify(ep, root) == pytest.approx(0.75)
