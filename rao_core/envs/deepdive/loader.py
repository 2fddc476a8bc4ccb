"""Loader for the real DeepDive records (``zai-org/DeepDive`` parquet: id, question, answer, conversations).

Real records carry no corpus: solve them with an HTTP search backend (``DeepDiveEnv(backend="http")``)
and score them with the LLM judge (offline, ``verify`` falls back to exact match on the one answer).
"""

from __future__ import annotations

import os
from typing import Any

from rao_core.envs.base import Task, read_parquet_rows

REQUIRED_COLUMNS = ("id", "question", "answer")


def load_deepdive_parquet(path: str | os.PathLike[str], split: str = "train", limit: int | None = None,
                          keep_conversations: bool = False, difficulty: str = "real") -> list[Task]:
    """Read a DeepDive parquet file into tasks (``env="deepdive"``, no corpus).

    ``data`` = ``{"question", "answer", "answers": [answer], "source_id", "corpus": None}`` plus
    ``"conversations"`` when ``keep_conversations`` (off by default: they make task files large).
    Raises FileNotFoundError for a missing file, ValueError naming missing columns or a bad row.
    """
    tasks: list[Task] = []
    for i, row in enumerate(read_parquet_rows(path, REQUIRED_COLUMNS, "DeepDive parquet")):
        if limit is not None and len(tasks) >= limit:
            break
        q, a = row.get("question"), row.get("answer")
        if not isinstance(q, str) or not q.strip() or a is None:
            raise ValueError(f"{path}: row {i} (id={row.get('id')!r}) has an empty question or answer")
        data: dict[str, Any] = {"question": q, "answer": str(a), "answers": [str(a)],
                                "source_id": str(row["id"]), "corpus": None}
        if keep_conversations and "conversations" in row:
            data["conversations"] = row["conversations"]
        tasks.append(Task(task_id=f"deepdive-{row['id']}", env="deepdive", split=split, difficulty=difficulty,
                          data=data))
    return tasks
