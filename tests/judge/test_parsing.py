"""Verdict parsing: every accepted form, and the unparseable ones."""

from __future__ import annotations

import pytest

from rao_core.judge import parse_verdict


@pytest.mark.parametrize(("text", "verdict", "how"), [
    ('{"verdict": "yes", "reason": "all targets crafted"}', "yes", "json"),
    ('{"Verdict": "NO", "reason": "missing m0_i5"}', "no", "json"),
    ('{"verdict": true}', "yes", "json"),
    ('{"correct": false, "explanation": "wrong count"}', "no", "json"),
    ('Here is my grade:\n```json\n{"verdict": "no", "reason": "x"}\n```\nThanks', "no", "fenced_json"),
    ('```\n{"verdict": "Yes."}\n```', "yes", "fenced_json"),
    ('I think {"verdict": "yes", "reason": "a {nested} brace \\" quote"} is right', "yes", "embedded_json"),
    ('The agent crafted it.\nREASON: fine\nVERDICT: yes', "yes", "verdict_line"),
    ('**Verdict:** No', "no", "verdict_line"),
    ('verdict: yes\nwait, recheck\nVerdict = no', "no", "verdict_line"),  # the last line wins
    ('{"verdict": "yes"', "yes", "verdict_field"),  # cut off by the token limit
    ('Sure.\n{"verdict": "No", "reason": "x", "extra": [1, 2', "no", "verdict_field"),
    ("Yes.", "yes", "bare_word"),
    ("No, the count is 5 not 7.", "no", "leading_word"),
    (" no ", "no", "bare_word"),
])
def test_accepted_forms(text, verdict, how):
    p = parse_verdict(text)
    assert p is not None and p.verdict == verdict and p.how == how


def test_reason_is_kept():
    assert parse_verdict('{"verdict": "no", "reason": "count 2 < 3"}').reason == "count 2 < 3"
    assert parse_verdict("Reason: crafted twice\nVerdict: yes").reason == "crafted twice"
    assert parse_verdict('{"verdict": "yes"}').success == 1.0
    assert parse_verdict('{"verdict": "no"}').success == 0.0


@pytest.mark.parametrize("text", [
    None, "", "   ", "maybe", '{"verdict": "perhaps"}', '{"reason": "no verdict key"}',
    "The answer is yes, but also no, depending on the count of items here.",  # prose only: too risky
    "VERDICT: unclear", '{"verdict": "yes" or "no"}',
])
def test_unparseable(text):
    assert parse_verdict(text) is None
