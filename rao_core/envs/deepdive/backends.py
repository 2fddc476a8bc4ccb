"""Search backends behind DeepDive's ``search``/``open`` tools.

``SearchBackend`` is the protocol; ``LocalFTSBackend`` is the offline default (SQLite FTS5, bm25 ranking,
stdlib ``sqlite3``); ``HttpSearchBackend`` is a documented skeleton for a real web search API over
``httpx`` (tests only talk to it through ``httpx.MockTransport``). To plug in another engine, implement
``search`` and ``open`` and pass an instance to ``DeepDiveEnv(backend=...)``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from rao_core.envs.deepdive.kg import Page
from rao_core.envs.search import fts5_query
from rao_core.envs.search.fts import build_db, open_db


class SearchResult(BaseModel):
    """One ranked hit. ``score``: higher is better (local: minus bm25). ``text``: the full page text when
    the backend has it for free (used by the question-leak filter), else None."""

    id: str
    title: str
    snippet: str
    url: str = ""
    score: float = 0.0
    text: str | None = None


@runtime_checkable
class SearchBackend(Protocol):
    """What DeepDive's tools need from a search engine."""

    def search(self, query: str, num: int = 10) -> list[SearchResult]:
        """Up to ``num`` results for free-text ``query``, best first (never raises on odd query syntax)."""
        ...

    def open(self, page_id: str) -> Page | None:
        """The page with ``page_id``, or None when there is no such page."""
        ...


_SCHEMA = """
CREATE TABLE pages (page_id TEXT PRIMARY KEY, title TEXT NOT NULL, url TEXT NOT NULL, text TEXT NOT NULL);
CREATE VIRTUAL TABLE pages_fts USING fts5(
    title, text, content='pages', content_rowid='rowid', tokenize='unicode61 remove_diacritics 2'
);
"""


def build_pages_db(pages: Iterable[Page], path: str | os.PathLike[str]) -> Path:
    """Write ``pages`` into a new SQLite FTS5 database at ``path`` (atomic: temp file, then rename)."""
    def fill(con: sqlite3.Connection) -> None:
        con.executemany("INSERT INTO pages(page_id, title, url, text) VALUES (?, ?, ?, ?)",
                        ((p.id, p.title, p.url, p.text) for p in pages))
        con.execute("INSERT INTO pages_fts(rowid, title, text) SELECT rowid, title, text FROM pages")
    return build_db(path, _SCHEMA, fill)


class LocalFTSBackend:
    """Read-only search over a pages database built by :func:`build_pages_db`.

    Ranking: FTS5 ``bm25(pages_fts, title_weight, 1.0)`` over the OR of the query's words (quoted, so FTS5
    operators in the query are plain words). Snippets come from FTS5 ``snippet()`` with ``**`` marks.
    """

    def __init__(self, db_path: str | os.PathLike[str], title_weight: float = 4.0, snippet_tokens: int = 24):
        self.db_path = Path(db_path)
        self._con = open_db(self.db_path, "DeepDive corpus database")
        self.title_weight = float(title_weight)
        self.snippet_tokens = int(snippet_tokens)

    def search(self, query: str, num: int = 10) -> list[SearchResult]:
        """Top ``num`` pages for ``query`` by bm25; [] when the query has no word."""
        match = fts5_query(query, mode="or")
        if match is None or num <= 0:
            return []
        rows = self._con.execute(
            "SELECT p.page_id, p.title, p.url, p.text, "
            "snippet(pages_fts, 1, '**', '**', ' ... ', ?), bm25(pages_fts, ?, 1.0) AS r "
            "FROM pages_fts JOIN pages p ON p.rowid = pages_fts.rowid "
            "WHERE pages_fts MATCH ? ORDER BY r LIMIT ?",
            (self.snippet_tokens, self.title_weight, match, int(num)),
        ).fetchall()
        return [SearchResult(id=r[0], title=r[1], url=r[2], text=r[3], snippet=r[4], score=-r[5]) for r in rows]

    def open(self, page_id: str) -> Page | None:
        """The stored page, or None."""
        row = self._con.execute("SELECT page_id, title, url, text FROM pages WHERE page_id = ?",
                                (str(page_id),)).fetchone()
        return None if row is None else Page(id=row[0], title=row[1], url=row[2], text=row[3])

    def close(self) -> None:
        """Close the SQLite connection."""
        self._con.close()


class HttpSearchBackend:
    """Skeleton client for a real web search API (not used offline; adapt the two mappings to your API).

    Expected API (a thin proxy you run in front of e.g. a commercial search API and a page fetcher):

    - ``GET {base_url}/search?q=<query>&num=<n>`` -> ``{"results": [{"id", "title", "snippet", "url"}]}``
    - ``GET {base_url}/page?id=<page_id>`` -> ``{"id", "title", "text", "url"}``, 404 when unknown.

    The API key, if any, is read from the environment variable named ``api_key_env`` and sent as a
    ``Authorization: Bearer`` header, so it never lands in configs or task files. HTTP errors raise
    ``httpx.HTTPStatusError``; the environment turns them into tool errors the agent sees.
    """

    def __init__(self, base_url: str, api_key_env: str | None = None, timeout_s: float = 20.0,
                 transport: Any = None):
        import httpx

        headers = {}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"environment variable {api_key_env!r} (search API key) is not set")
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s,
                                    transport=transport)

    def search(self, query: str, num: int = 10) -> list[SearchResult]:
        """Results of the remote search, mapped to ``SearchResult`` (no full text, score = -rank)."""
        r = self._client.get("/search", params={"q": query, "num": int(num)})
        r.raise_for_status()
        items = r.json().get("results", [])[: int(num)]
        return [SearchResult(id=str(it["id"]), title=str(it.get("title", "")), snippet=str(it.get("snippet", "")),
                             url=str(it.get("url", "")), score=-float(i)) for i, it in enumerate(items)]

    def open(self, page_id: str) -> Page | None:
        """The remote page, or None on 404."""
        r = self._client.get("/page", params={"id": page_id})
        if r.status_code == 404:
            return None
        r.raise_for_status()
        d = r.json()
        return Page(id=str(d.get("id", page_id)), title=str(d.get("title", "")), text=str(d.get("text", "")),
                    url=str(d.get("url", "")))

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()
