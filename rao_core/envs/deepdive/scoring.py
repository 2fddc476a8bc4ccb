"""DeepDive's offline answer check: exact match after normalisation against the answer and its aliases.

The real benchmark's reward is binary: valid format AND an LLM judge agreeing with the reference. Offline
(no judge) the root verifier is this exact match; the judging stage may replace it with an LLM judge.
Normalisation follows the SQuAD convention (lower case, drop punctuation and articles, collapse spaces)
plus accent stripping; digit grouping disappears with the punctuation, so ``"48,210" == "48210"``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = re.compile(r"[^\w\s]|_", re.UNICODE)


def normalize_answer(text: Any) -> str:
    """Normalise an answer string: NFKD without accents, lower case, no punctuation or articles.

    Non-strings are converted with ``str`` (ints, floats); None gives "".
    """
    if text is None:
        return ""
    s = unicodedata.normalize("NFKD", str(text))
    s = "".join(c for c in s if not unicodedata.combining(c)).lower()
    s = _PUNCT.sub("", s)  # "48,210" -> "48210", "o'neil" -> "oneil"
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(pred: Any, answers: Iterable[Any]) -> bool:
    """True when ``normalize_answer(pred)`` equals the normalised form of any reference in ``answers``.

    An empty prediction never matches (even an empty reference).
    """
    p = normalize_answer(pred)
    if not p:
        return False
    return any(p == normalize_answer(a) for a in answers)
