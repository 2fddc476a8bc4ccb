"""Verdict parsing on real answers recorded from SmolLM2-135M-Instruct served by vLLM.

Recorded with ``python -m tests.judge.tools.record_fixtures`` (the project's prompts, temperatures 0 and
0.8). Each record's ``expected`` verdict and rule were reviewed by hand against the raw text. The small
model truncates JSON objects at the token limit, echoes the template, writes code instead of a verdict,
or opens with "Yes, ...": the parser must read what a person would read, and refuse the rest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rao_core.judge import parse_verdict

RECORDS = json.loads((Path(__file__).parent / "fixtures" / "smollm2_135m_responses.json").read_text())


def test_fixture_is_real_and_varied():
    assert len(RECORDS) >= 12 and all(r["model"] == "smollm2-135m-instruct" for r in RECORDS)
    hows = {r["expected"]["how"] for r in RECORDS if r["expected"]}
    assert {"verdict_field", "leading_word", "embedded_json", "fenced_json"} <= hows
    assert sum(r["expected"] is None for r in RECORDS) >= 2  # some answers hold no verdict at all
    assert all(r["usage"]["prompt_tokens"] > 100 for r in RECORDS)


@pytest.mark.parametrize("rec", RECORDS, ids=[f"{i}-{r['env']}-T{r['temperature']}" for i, r in enumerate(RECORDS)])
def test_recorded_answer_parses_as_reviewed(rec):
    got = parse_verdict(rec["raw"])
    assert (None if got is None else {"verdict": got.verdict, "how": got.how}) == rec["expected"]


def test_truncated_json_and_echoed_template():
    # a cut-off object still carries its verdict field
    assert parse_verdict('The JSON object is:\n{\n  "verdict": "no",\n  "reason": "missing m4_i1",\n  "x": "x').verdict == "no"
    # the template echoed back ('"yes" or "no"') is not a verdict
    assert parse_verdict('Here:\n{"verdict": "yes" or "no", "reason": "...') is None
    # code instead of a verdict is unparseable
    assert parse_verdict('```python\nimport json\nprint(json.dumps({"count": 7}))\n```') is None
    assert parse_verdict("Nope, wrong.") is None and parse_verdict("yes-man behaviour") is None
