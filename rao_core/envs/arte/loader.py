"""Loaders for the real ART-E data: Enron email records and the question records.

Formats (``.parquet`` or ``.jsonl``):
- emails (``corbt/enron-emails``): ``message_id, subject, from, to[], cc[], bcc[], date, body, file_name``;
- questions (``corbt/enron_emails_sample_questions``): ``id, question, answer, message_ids[],
  how_realistic, inbox_address, query_date``.
Real questions have free-form answers, so their tasks are marked ``exact=False``: ``verify`` returns None
and the judging stage decides correctness.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rao_core.envs.arte.db import EmailRecord, build_email_db, normalize_date
from rao_core.envs.base import Task, read_parquet_rows
from rao_core.jsonl import read_jsonl

QUESTION_COLUMNS = ("id", "question", "answer", "message_ids", "inbox_address", "query_date")


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a parquet or JSON-lines file; FileNotFoundError (any suffix) or ValueError naming the file."""
    if path.suffix == ".parquet" or not path.exists():  # read_parquet_rows reports a missing file
        return read_parquet_rows(path, (), "ART-E data")
    if path.suffix in (".jsonl", ".json"):
        return read_jsonl(path, lambda row: row, "ART-E record")
    raise ValueError(f"{path}: expected a .parquet or .jsonl file")


def load_enron_emails(path: str | os.PathLike[str]) -> list[EmailRecord]:
    """Email records from a parquet/JSONL file; ValueError naming the row on a malformed record."""
    path = Path(path)
    out = []
    for i, row in enumerate(_read_rows(path)):
        try:
            out.append(EmailRecord.model_validate(row))
        except Exception as e:
            raise ValueError(f"{path}: row {i} (message_id={row.get('message_id')!r}) is malformed: {e}") from e
    return out


def build_enron_db(emails_path: str | os.PathLike[str], db_path: str | os.PathLike[str]) -> Path:
    """Build the ART-E SQLite database at ``db_path`` from an Enron email file."""
    return build_email_db(load_enron_emails(emails_path), db_path)


def load_arte_questions(path: str | os.PathLike[str], db_path: str | os.PathLike[str], split: str = "train",
                        limit: int | None = None) -> list[Task]:
    """Question records -> tasks over the email database at ``db_path`` (``env="arte"``).

    ``data`` = ``{question, answer, answers: [answer], message_ids, inbox, query_date, how_realistic,
    exact: False, corpus: {"path": db_path}}``. Raises ValueError naming missing columns or a bad row.
    """
    path = Path(path)
    rows = _read_rows(path)
    tasks = []
    for i, row in enumerate(rows):
        if limit is not None and len(tasks) >= limit:
            break
        missing = [c for c in QUESTION_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"{path}: row {i} lacks columns {missing}")
        ids = row["message_ids"]
        if isinstance(ids, str):
            ids = [ids]
        if not ids or not all(isinstance(m, str) for m in ids):
            raise ValueError(f"{path}: row {i} (id={row['id']!r}): message_ids must be a non-empty list of str")
        tasks.append(Task(
            task_id=f"arte-{row['id']}", env="arte", split=split, difficulty="real",
            data={"question": str(row["question"]), "answer": str(row["answer"]), "answers": [str(row["answer"])],
                  "message_ids": list(ids), "inbox": str(row["inbox_address"]).strip().lower(),
                  "query_date": normalize_date(row["query_date"])[:10],
                  "how_realistic": float(row.get("how_realistic") or 0.0), "exact": False,
                  "corpus": {"path": str(Path(db_path).resolve())}},
        ))
    return tasks
