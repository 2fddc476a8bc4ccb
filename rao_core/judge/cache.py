"""Persistent judge cache (SQLite, stdlib), so re-judging a tree costs nothing.

Key: SHA-256 over (judge model, prompt version, goal, result, cell summary). The spec names the first four;
the cell summary is part of the rendered prompt when ``include_cells`` is on, so it is part of the key too
(two nodes with the same goal and result but different work may deserve different verdicts).
Only parsed verdicts are stored: a failure (unparseable answer, transport error) is retried next time.

The connection is used from one asyncio thread; writes are committed at once. WAL mode lets several
processes share the file.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    verdict TEXT NOT NULL,
    reason TEXT NOT NULL,
    raw TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    created_at REAL NOT NULL
)
"""
_FIELDS = ("model", "prompt_version", "verdict", "reason", "raw", "prompt_tokens", "completion_tokens")


def cache_key(model: str, prompt_version: str, goal: str, result: str, cells: str) -> str:
    """Hex SHA-256 of the JSON list [model, prompt_version, goal, result, cells]."""
    blob = json.dumps([model, prompt_version, goal, result, cells], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """SQLite-backed map from ``cache_key`` to a stored verdict record (dict)."""

    def __init__(self, path: str | Path) -> None:
        """Open (creating folders and the table if needed) the cache at ``path``."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._db.commit()

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored record for ``key`` (verdict, reason, raw, model, prompt_version, tokens) or None."""
        row = self._db.execute(f"SELECT {', '.join(_FIELDS)} FROM verdicts WHERE key = ?", (key,)).fetchone()
        return None if row is None else dict(zip(_FIELDS, row, strict=True))

    def put(self, key: str, *, model: str, prompt_version: str, verdict: str, reason: str, raw: str,
            prompt_tokens: int, completion_tokens: int) -> None:
        """Store (or replace) the verdict for ``key``."""
        self._db.execute(
            "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, model, prompt_version, verdict, reason, raw, prompt_tokens, completion_tokens, time.time()))
        self._db.commit()

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])

    def close(self) -> None:
        """Close the connection."""
        self._db.close()
