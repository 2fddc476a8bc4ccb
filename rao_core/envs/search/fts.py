"""FTS5 query building, text normalisation and the on-disk cache of built search databases."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
import unicodedata
from pathlib import Path
from typing import Any, Literal

from rao_core.paths import rao_home

# Letters and digits, like FTS5's default ``unicode61`` tokenizer (underscore is a separator there too).
_TOKEN_RE = re.compile(r"[^\W_]+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into the word tokens FTS5's ``unicode61`` tokenizer would see (case kept)."""
    return _TOKEN_RE.findall(text)


def fts5_query(text: str | list[str], mode: Literal["and", "or"] = "and") -> str | None:
    """Turn free text (or a list of keyword strings) into a safe FTS5 ``MATCH`` expression.

    Every token becomes a quoted FTS5 string (``"word"``), joined by ``AND`` (all words required; ART-E's
    ``search_emails``) or ``OR`` (any word, ranked by bm25; DeepDive's ``search``). Operators and
    punctuation in the input are therefore plain text. Returns None when the input holds no word at all
    (e.g. ``"*"`` or ``"()"``); callers treat that as "no results", never as an error.

    Raises TypeError when ``text`` is neither a string nor a list/tuple of strings.
    """
    if isinstance(text, str):
        parts = [text]
    elif isinstance(text, list | tuple) and all(isinstance(t, str) for t in text):
        parts = list(text)
    else:
        raise TypeError(f"expected a string or a list of strings, got {type(text).__name__}")
    tokens: list[str] = []
    for p in parts:
        tokens.extend(tokenize(p))
    if not tokens:
        return None
    seen: list[str] = []
    for t in tokens:  # de-duplicate case-insensitively, keep order
        if t.lower() not in (s.lower() for s in seen):
            seen.append(t)
    joiner = " AND " if mode == "and" else " OR "
    return joiner.join('"' + t.replace('"', '""') + '"' for t in seen)


def normalize_text(text: str) -> str:
    """Lower-case, strip accents, turn punctuation into spaces and collapse whitespace.

    Used to decide whether a page "contains the question text" (DeepDive leak filter).
    """
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    return " ".join(tokenize(text.lower()))


def params_hash(params: dict[str, Any]) -> str:
    """A short stable hash (16 hex digits) of JSON-serialisable generator parameters (cache key)."""
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_dir(kind: str) -> Path:
    """``$RAO_HOME/cache/<kind>``, created if missing (where generated SQLite corpora are cached)."""
    d = rao_home() / "cache" / kind
    d.mkdir(parents=True, exist_ok=True)
    return d


_BUILD_LOCK = threading.Lock()


def cached_db_path(kind: str, key: dict[str, Any]) -> Path:
    """Where the database built from ``key`` (generator version + parameters) is cached for ``kind``."""
    return cache_dir(kind) / f"{params_hash(key)}.sqlite"


def ensure_cached_db(kind: str, key: dict[str, Any], build: Callable[[Path], Any]) -> Path:
    """Return :func:`cached_db_path`, calling ``build(path)`` once (under a lock) if it does not exist yet."""
    path = cached_db_path(kind, key)
    with _BUILD_LOCK:
        if not path.exists():
            build(path)
    return path
