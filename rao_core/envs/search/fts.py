"""FTS5 query building, text normalisation and the on-disk cache of built search databases."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from rao_core.jsonl import atomic_path
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
    unique: dict[str, str] = {}  # de-duplicated case-insensitively: first spelling, first-seen order
    for t in (tok for p in parts for tok in tokenize(p)):
        unique.setdefault(t.lower(), t)
    if not unique:
        return None
    joiner = " AND " if mode == "and" else " OR "
    return joiner.join('"' + t.replace('"', '""') + '"' for t in unique.values())


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


def build_db(path: str | os.PathLike[str], schema: str, fill: Callable[[sqlite3.Connection], Any]) -> Path:
    """Create the SQLite database at ``path``: ``schema``, then ``fill(con)``, in one transaction (atomic:
    a temporary file renamed over ``path`` only when both succeeded)."""
    with atomic_path(path) as tmp:
        con = sqlite3.connect(tmp)
        try:
            with con:
                con.executescript(schema)
                fill(con)
        finally:
            con.close()
    return Path(path)


def open_db(path: str | os.PathLike[str], what: str) -> sqlite3.Connection:
    """Open a database read-only (shareable across threads); FileNotFoundError naming ``what`` if absent."""
    if not Path(path).exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


@dataclass(frozen=True)
class GeneratedCorpus:
    """A synthetic corpus (DeepDive's pages, ART-E's inboxes) built from generator parameters into a SQLite
    database, cached at ``$RAO_HOME/cache/<kind>/<hash of generator version and parameters>.sqlite``."""

    kind: str
    generator: str  # generator version stored in task files
    params_model: type[BaseModel]
    build: Callable[[Any, Path], Any]  # (params, path): write the database at path

    def path(self, params: BaseModel) -> Path:
        """Where the corpus of ``params`` is cached (built on first use by :meth:`ensure`)."""
        return cache_dir(self.kind) / f"{params_hash({'generator': self.generator, **params.model_dump()})}.sqlite"

    def ensure(self, params: BaseModel) -> Path:
        """Build (once, under a lock) and return the database of the corpus of ``params``."""
        path = self.path(params)
        with _BUILD_LOCK:
            if not path.exists():
                self.build(params, path)
        return path

    def of_task(self, task_id: str, corpus: dict[str, Any]) -> Path:
        """The database of a task's ``data["corpus"]``: ``{"path"}`` as is, ``{"generator", "params"}`` built
        once; ValueError naming the task for anything else or another generator version."""
        if "path" in corpus:
            return Path(corpus["path"])
        if "params" not in corpus:
            raise ValueError(f"task {task_id}: data['corpus'] needs 'path' or 'params', got {sorted(corpus)}")
        if corpus.get("generator", self.generator) != self.generator:
            raise ValueError(f"task {task_id}: corpus generator {corpus.get('generator')!r} is not "
                             f"{self.generator!r}; regenerate the tasks")
        return self.ensure(self.params_model(**corpus["params"]))
