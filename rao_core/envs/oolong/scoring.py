"""Oolong answer scoring (docs/environments.md, "Oolong"): ``\\boxed{}`` extraction, typed comparison.

Oolong-Real (``score_answer``), per answer in [0, 1]:
- take the text inside the LAST ``\\boxed{...}`` of the response (braces may nest);
- parse gold and prediction the same way: an int if the text is an integer, else a comma-separated list
  if it holds a comma, else a string;
- int vs int: ``0.75 ** abs(gold - pred)``; string vs string: exact match after lowercasing and stripping;
  list vs list: ``|gold ∩ pred| / |gold|`` over lowercased, stripped, distinct elements; any type
  mismatch: 0.
Project choice: a response with no ``\\boxed{}`` is scored on its whole stripped text (the instruction asks
for a box; a bare answer is rarely exactly right, and an int gets partial credit the same way).

Oolong-synth (``score_synth_answer``): the gold ``answer`` is a Python list literal (``"['spam']"``,
``"[12]"``); its first element is the gold. NUMERIC answers: ``0.75 ** abs(gold - pred)`` (0 if the
prediction is not a number); every other ``answer_type`` (LABEL, USER, DATE, COMPARISON, MONTH_YEAR):
exact match after lowercasing and stripping (and stripping a leading ``Answer:``/``Label:`` tag).
"""

from __future__ import annotations

import ast
import re
from typing import Any

_INT_RE = re.compile(r"^[+-]?\d+$")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (balanced braces), or None if there is none."""
    start = text.rfind("\\boxed{")
    while start != -1:
        i = start + len("\\boxed{")
        depth = 1
        j = i
        while j < len(text) and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        if depth == 0:
            return text[i:j - 1]
        start = text.rfind("\\boxed{", 0, start)  # unbalanced: try an earlier box
    return None


def parse_answer(text: str) -> int | list[str] | str:
    """Typed answer: int, else list of lowercased stripped items (if a comma), else lowercased string."""
    s = str(text).strip()
    if _INT_RE.match(s):
        return int(s)
    if "," in s:
        return [x.strip().lower() for x in s.split(",") if x.strip()]
    return s.lower()


def score_answer(response_text: str, gold: str) -> float:
    """Oolong-Real score in [0, 1] of a response against the gold answer string (see module docstring)."""
    boxed = extract_boxed(str(response_text))
    pred = parse_answer(boxed if boxed is not None else str(response_text))
    g = parse_answer(gold)
    if isinstance(g, int) and isinstance(pred, int):
        return 0.75 ** abs(g - pred)
    if isinstance(g, list) and isinstance(pred, list):
        gs = set(g)
        return len(gs & set(pred)) / len(gs) if gs else 0.0
    if isinstance(g, str) and isinstance(pred, str):
        return 1.0 if g == pred else 0.0
    return 0.0


_TAG_RE = re.compile(r"^(answer|label|user|date)\s*:\s*", re.IGNORECASE)
SYNTH_ANSWER_TYPES = frozenset({"LABEL", "USER", "DATE", "NUMERIC", "COMPARISON", "MONTH_YEAR"})


def _synth_gold(answer: Any) -> Any:
    if isinstance(answer, str):
        try:
            answer = ast.literal_eval(answer)
        except (ValueError, SyntaxError):
            return answer
    if isinstance(answer, (list, tuple)):
        return answer[0] if answer else ""
    return answer


def score_synth_answer(response_text: str, gold: Any, answer_type: str) -> float:
    """Oolong-synth score in [0, 1]; ``gold`` is the record's ``answer`` (a list literal or list).

    Raises ValueError for an unknown ``answer_type``.
    """
    if answer_type not in SYNTH_ANSWER_TYPES:
        raise ValueError(f"unknown Oolong-synth answer_type {answer_type!r}; expected one of "
                         f"{sorted(SYNTH_ANSWER_TYPES)}")
    boxed = extract_boxed(str(response_text))
    pred = _TAG_RE.sub("", (boxed if boxed is not None else str(response_text)).strip()).strip()
    g = _synth_gold(gold)
    if answer_type == "NUMERIC":
        try:
            return 0.75 ** abs(float(g) - float(pred))
        except (TypeError, ValueError):
            return 0.0
    return 1.0 if str(g).strip().lower() == pred.lower() else 0.0
