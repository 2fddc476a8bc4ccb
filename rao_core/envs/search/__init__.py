"""Shared full-text search helpers (SQLite FTS5, stdlib ``sqlite3``) for DeepDive and ART-E.

The only way user or model text reaches an FTS5 ``MATCH`` is through :func:`fts5_query`, which splits it
into word tokens and quotes each one as an FTS5 string, so FTS5 operators typed by a model (``NEAR``,
``AND``/``OR``/``NOT``, ``*``, ``-``, ``^``, ``:``, quotes, parentheses) are searched as plain words and can
neither raise a syntax error nor change the query. SQL injection is excluded separately by binding every
value as a parameter.
"""

from rao_core.envs.search.fts import (
    cache_dir,
    fts5_query,
    normalize_text,
    params_hash,
    tokenize,
)

__all__ = ["cache_dir", "fts5_query", "normalize_text", "params_hash", "tokenize"]
