"""Lenient parsing of a judge's answer into a verdict.

The prompts ask for ``{"verdict": "yes"|"no", "reason": "..."}``. Real models (small ones above all) wrap it in
a fenced block, add prose around it, use other words for yes/no, or write a ``VERDICT: yes`` line;
:func:`parse_verdict` accepts six forms, in order of preference, two of them (a cut-off JSON field, a bare
yes/no) read from recorded answers of SmolLM2-135M-Instruct (``tests/judge/fixtures/smollm2_135m_responses.json``).
Anything else is unparseable (``None``): the caller retries, then scores the node NaN and keeps the raw text.
Docs: docs/judging.md#the-judge.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel

_YES = {"yes", "y", "true", "pass", "passed", "correct", "success", "succeeded", "1", "accomplished", "done"}
_NO = {"no", "n", "false", "fail", "failed", "incorrect", "failure", "0", "not accomplished", "wrong"}
_KEYS = ("verdict", "answer", "correct", "success", "accomplished")
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_VERDICT_LINE = re.compile(r"^[\s>*_#-]*verdict[\s*_]*[:=][\s*_\"']*([A-Za-z01 ]+?)[\s*_\"'.!]*$",
                           re.IGNORECASE | re.MULTILINE)
_VERDICT_FIELD = re.compile(r'"verdict"\s*:\s*"(yes|no)"\s*(?=[,}\n]|$)', re.IGNORECASE)
_REASON_FIELD = re.compile(r'"reason"\s*:\s*"((?:[^"\\]|\\.)*)"')
_LEADING_WORD = re.compile(r"^\W*(yes|no)\b(?!-)", re.IGNORECASE)
_REASON_LINE = re.compile(r"^[\s>*_#-]*reason[\s*_]*[:=]\s*(.+)$", re.IGNORECASE | re.MULTILINE)


class ParsedVerdict(BaseModel):
    """A parsed judge answer: ``verdict`` "yes"/"no", the judge's ``reason`` (may be empty), and ``how``
    names the rule that matched ("json", "fenced_json", "embedded_json", "verdict_line", "verdict_field",
    "bare_word", "leading_word")."""

    verdict: Literal["yes", "no"]
    reason: str = ""
    how: str

    @property
    def success(self) -> float:
        """s in {0.0, 1.0}: 1.0 for "yes"."""
        return 1.0 if self.verdict == "yes" else 0.0


def _norm_verdict(v: Any) -> Literal["yes", "no"] | None:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)) and v in (0, 1):
        return "yes" if v == 1 else "no"
    if isinstance(v, str):
        w = v.strip().strip(".!\"'*").strip().lower()
        if w in _YES:
            return "yes"
        if w in _NO:
            return "no"
    return None


def _from_obj(obj: Any) -> tuple[Literal["yes", "no"], str] | None:
    if not isinstance(obj, dict):
        return None
    lower = {str(k).lower(): v for k, v in obj.items()}
    for key in _KEYS:
        if key in lower:
            verdict = _norm_verdict(lower[key])
            if verdict is not None:
                reason = lower.get("reason", lower.get("explanation", lower.get("rationale", "")))
                return verdict, reason if isinstance(reason, str) else json.dumps(reason)
    return None


def _balanced_objects(text: str) -> list[str]:
    """Substrings of ``text`` that are brace-balanced ``{...}`` spans (string literals respected)."""
    spans, depth, start, in_str, esc = [], 0, -1, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"' and depth > 0:
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start:i + 1])
    return spans


def _loads(s: str) -> Any:
    try:
        return json.loads(s)
    except (json.JSONDecodeError, ValueError):
        return None


def parse_verdict(text: str | None) -> ParsedVerdict | None:
    """Parse a judge answer; None when no verdict can be read. Accepted, in this order of preference:

    1. the whole answer as a JSON object with a ``verdict`` key (also ``answer``, ``correct``, ``success``);
    2. a fenced code block (```json ... ```) holding such an object;
    3. the first balanced ``{...}`` in the text holding such an object;
    4. the LAST line of the form ``VERDICT: yes`` (case-insensitive, markdown emphasis allowed);
    5. the first ``"verdict": "yes"`` field in JSON-like text that does not parse (a small model's object is
       often cut off by the token limit or malformed further on); a field followed by more alternatives
       (the template echoed back: ``"verdict": "yes" or "no"``) does not count;
    6. an answer that is only the word yes or no, or starts with it (``Yes, the agent ...``).

    Rules 5 and 6 come from recorded answers of SmolLM2-135M-Instruct
    (``tests/judge/fixtures/smollm2_135m_responses.json``). Never raises on odd input (None, empty text, broken
    JSON).
    """
    if not text or not text.strip():
        return None
    t = text.strip()
    for how, candidates in (("json", [t]), ("fenced_json", _FENCE.findall(t)), ("embedded_json", _balanced_objects(t))):
        for c in candidates:  # rules 1-3, in order
            got = _from_obj(_loads(c.strip()))
            if got:
                return ParsedVerdict(verdict=got[0], reason=got[1], how=how)
    lines = _VERDICT_LINE.findall(t)
    if lines:
        verdict = _norm_verdict(lines[-1])
        if verdict is not None:
            reasons = _REASON_LINE.findall(t)
            return ParsedVerdict(verdict=verdict, reason=reasons[-1].strip() if reasons else "",
                                 how="verdict_line")
    field = _VERDICT_FIELD.search(t)
    if field:
        reason = _REASON_FIELD.search(t, field.end())
        return ParsedVerdict(verdict=field.group(1).lower(), reason=reason.group(1) if reason else "",
                             how="verdict_field")
    if len(t) <= 16:
        verdict = _norm_verdict(t)
        if verdict is not None:
            return ParsedVerdict(verdict=verdict, reason="", how="bare_word")
    lead = _LEADING_WORD.match(t)
    if lead:
        return ParsedVerdict(verdict=lead.group(1).lower(), reason=t[lead.end():].strip(" ,.:;-\n")[:500],
                             how="leading_word")
    return None
