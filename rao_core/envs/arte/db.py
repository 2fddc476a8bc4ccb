"""ART-E's email store: SQLite with an FTS5 index kept in sync by triggers (docs/environments.md, "ART-E").

Schema (as in the reference): ``emails(id INTEGER PRIMARY KEY, message_id UNIQUE, subject, from_address,
date, body, file_name)``, ``recipients(email_id -> emails.id, recipient_address, recipient_type in
to|cc|bcc)`` and ``emails_fts(subject, body)`` (external content = ``emails``, tokenizer
``porter unicode61``), updated by AFTER INSERT/UPDATE/DELETE triggers on ``emails``.

Departures from the reference: recipients are joined on the integer row id ``emails.id`` (the reference
looked them up by the text ``message_id`` and always returned empty to/cc/bcc lists); ``read_email`` is
restricted to the caller's inbox like ``search_emails``; addresses are stored lower-cased; keywords go
through ``fts5_query`` (quoted words, all required) so FTS5/SQL syntax in them is plain text.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rao_core.envs.search import fts5_query
from rao_core.envs.search.fts import build_db, open_db

SCHEMA = """
CREATE TABLE emails (
    id INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    subject TEXT NOT NULL DEFAULT '',
    from_address TEXT NOT NULL,
    date TEXT NOT NULL,
    body TEXT NOT NULL DEFAULT '',
    file_name TEXT NOT NULL DEFAULT ''
);
CREATE TABLE recipients (
    email_id INTEGER NOT NULL REFERENCES emails(id) ON DELETE CASCADE,
    recipient_address TEXT NOT NULL,
    recipient_type TEXT NOT NULL CHECK (recipient_type IN ('to', 'cc', 'bcc'))
);
CREATE INDEX idx_recipients_address ON recipients(recipient_address, email_id);
CREATE INDEX idx_recipients_email ON recipients(email_id);
CREATE INDEX idx_emails_from ON emails(from_address);
CREATE INDEX idx_emails_date ON emails(date);
CREATE VIRTUAL TABLE emails_fts USING fts5(
    subject, body, content='emails', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER emails_ai AFTER INSERT ON emails BEGIN
    INSERT INTO emails_fts(rowid, subject, body) VALUES (new.id, new.subject, new.body);
END;
CREATE TRIGGER emails_ad AFTER DELETE ON emails BEGIN
    INSERT INTO emails_fts(emails_fts, rowid, subject, body) VALUES ('delete', old.id, old.subject, old.body);
END;
CREATE TRIGGER emails_au AFTER UPDATE ON emails BEGIN
    INSERT INTO emails_fts(emails_fts, rowid, subject, body) VALUES ('delete', old.id, old.subject, old.body);
    INSERT INTO emails_fts(rowid, subject, body) VALUES (new.id, new.subject, new.body);
END;
"""

DATE_FMT = "%Y-%m-%d %H:%M:%S"


def normalize_date(value: Any) -> str:
    """A date as ``YYYY-MM-DD HH:MM:SS`` (accepts datetime, ISO strings with 'T', date-only strings).

    Raises ValueError naming the value when it cannot be parsed.
    """
    if isinstance(value, datetime):
        return value.replace(tzinfo=None).strftime(DATE_FMT)
    if hasattr(value, "isoformat") and not isinstance(value, str):  # date, pandas Timestamp
        value = value.isoformat()
    s = str(value).strip().replace("T", " ")
    for fmt in (DATE_FMT, "%Y-%m-%d %H:%M", "%Y-%m-%d", "%Y-%m-%d %H:%M:%S.%f"):
        try:
            return datetime.strptime(s[:26], fmt).strftime(DATE_FMT)
        except ValueError:
            continue
    try:
        return datetime.fromisoformat(s).replace(tzinfo=None).strftime(DATE_FMT)
    except ValueError:
        raise ValueError(f"unparseable date {value!r}; expected YYYY-MM-DD[ HH:MM:SS]") from None


class EmailRecord(BaseModel):
    """One email, in the field names of ``corbt/enron-emails`` (``from`` is ``from_address`` here)."""

    model_config = ConfigDict(populate_by_name=True)

    message_id: str
    subject: str = ""
    from_address: str = Field(alias="from")
    to: list[str] = Field(default_factory=list)
    cc: list[str] = Field(default_factory=list)
    bcc: list[str] = Field(default_factory=list)
    date: str
    body: str = ""
    file_name: str = ""

    @field_validator("date", mode="before")
    @classmethod
    def _date(cls, v: Any) -> str:
        return normalize_date(v)

    @field_validator("to", "cc", "bcc", mode="before")
    @classmethod
    def _addrs(cls, v: Any) -> list[str]:
        if v is None:
            return []
        if isinstance(v, str):
            v = v.split(",")
        return [str(a).strip().lower() for a in v if str(a).strip()]

    @field_validator("from_address", mode="before")
    @classmethod
    def _from(cls, v: Any) -> str:
        return str(v).strip().lower()


def insert_emails(con: sqlite3.Connection, records: Iterable[EmailRecord]) -> int:
    """Insert emails and their recipients (FTS is filled by the trigger); returns the number inserted.

    Raises sqlite3.IntegrityError on a duplicate ``message_id``.
    """
    n = 0
    for r in records:
        cur = con.execute(
            "INSERT INTO emails(message_id, subject, from_address, date, body, file_name) VALUES (?,?,?,?,?,?)",
            (r.message_id, r.subject, r.from_address, r.date, r.body, r.file_name))
        eid = cur.lastrowid
        con.executemany("INSERT INTO recipients(email_id, recipient_address, recipient_type) VALUES (?,?,?)",
                        [(eid, a, kind) for kind in ("to", "cc", "bcc") for a in getattr(r, kind)])
        n += 1
    return n


def build_email_db(records: Iterable[EmailRecord], path: str | os.PathLike[str]) -> Path:
    """Create the database at ``path`` from ``records`` (atomic: temp file, then rename)."""
    return build_db(path, SCHEMA, lambda con: insert_emails(con, records))


def open_email_db(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open an email database read-only; FileNotFoundError if absent."""
    return open_db(path, "ART-E email database")


_IN_INBOX = ("(e.from_address = :inbox OR EXISTS (SELECT 1 FROM recipients r "
             "WHERE r.email_id = e.id AND r.recipient_address = :inbox))")


class SearchHit(BaseModel):
    """One ``search_emails`` result."""

    message_id: str
    subject: str
    from_address: str
    date: str
    snippet: str


def search_emails(con: sqlite3.Connection, inbox: str, keywords: str | list[str], from_addr: str | None = None,
                  to_addr: str | None = None, sent_after: str | None = None, sent_before: str | None = None,
                  max_results: int = 10, snippet_tokens: int = 16) -> list[SearchHit]:
    """Emails of ``inbox`` (sender or any recipient) matching ALL keyword words, newest first.

    ``sent_after`` / ``sent_before``: dates (``YYYY-MM-DD``), inclusive / exclusive. Keywords with no
    word at all (``"*"``) give []. Raises TypeError for non-string keywords, ValueError for a bad date.
    """
    match = fts5_query(keywords, mode="and")
    if match is None or max_results <= 0:
        return []
    sql = [f"SELECT e.message_id, e.subject, e.from_address, e.date, "
           f"snippet(emails_fts, -1, '**', '**', ' ... ', :snip) "
           f"FROM emails_fts JOIN emails e ON e.id = emails_fts.rowid "
           f"WHERE emails_fts MATCH :match AND {_IN_INBOX}"]
    p: dict[str, Any] = {"inbox": inbox.strip().lower(), "match": match, "snip": int(snippet_tokens),
                         "n": int(max_results)}
    if from_addr:
        sql.append("AND e.from_address = :from_addr")
        p["from_addr"] = from_addr.strip().lower()
    if to_addr:
        sql.append("AND EXISTS (SELECT 1 FROM recipients r2 WHERE r2.email_id = e.id "
                   "AND r2.recipient_address = :to_addr)")
        p["to_addr"] = to_addr.strip().lower()
    if sent_after:
        sql.append("AND e.date >= :after")
        p["after"] = normalize_date(sent_after)
    if sent_before:
        sql.append("AND e.date < :before")
        p["before"] = normalize_date(sent_before)
    sql.append("ORDER BY e.date DESC, e.id DESC LIMIT :n")
    rows = con.execute(" ".join(sql), p).fetchall()
    return [SearchHit(message_id=r[0], subject=r[1], from_address=r[2], date=r[3], snippet=" ".join(r[4].split()))
            for r in rows]


def read_email(con: sqlite3.Connection, inbox: str, message_id: str) -> dict[str, Any] | None:
    """The email with ``message_id`` and its to/cc/bcc lists, or None if absent or not in ``inbox``.

    Recipients are joined on the integer ``emails.id`` (see module docstring).
    """
    row = con.execute("SELECT e.id, e.message_id, e.subject, e.from_address, e.date, e.body FROM emails e "
                      f"WHERE e.message_id = :mid AND {_IN_INBOX}",
                      {"mid": str(message_id), "inbox": inbox.strip().lower()}).fetchone()
    if row is None:
        return None
    eid = row[0]
    rec: dict[str, list[str]] = {"to": [], "cc": [], "bcc": []}
    for addr, kind in con.execute("SELECT recipient_address, recipient_type FROM recipients WHERE email_id = ? "
                                  "ORDER BY rowid", (eid,)):
        rec[kind].append(addr)
    return {"message_id": row[1], "date": row[4], "subject": row[2], "from": row[3], "to": rec["to"],
            "cc": rec["cc"], "bcc": rec["bcc"], "body": row[5]}
