"""Loaders of the real Oolong data files into ``Task`` records (docs/environments.md, "Oolong").

- Oolong-Real (``oolongbench/oolong-real``, configs ``dnd`` / ``toy_dnd``): JSON (a list of records, or
  one record per line). Fields: ``id``, ``context_window_id``, ``context_window_text``, ``question``,
  ``answer`` (string; lists comma-separated), ``question_type`` (``singledoc_rolls``,
  ``singledoc_spells``, ``multidoc_rolls``, ``multidoc_spells``), ``episodes`` (ints), ``campaign``.
  Campaign 1 is the test split, campaign 2 the validation split.
- Oolong-synth (``oolongbench/oolong-synth``): parquet. Fields: ``id``, ``context_len``, ``dataset``,
  ``context_window_text``, ``context_window_text_with_labels``, ``question``, ``task_group``, ``task``,
  ``answer`` (a Python list literal), ``answer_type``.

Both give ``Task(env="oolong", data={"source", "context", "question", "answer", ...})``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rao_core.envs.base import Task, read_parquet_rows

REAL_FIELDS = ("id", "context_window_id", "context_window_text", "question", "answer", "question_type",
               "episodes", "campaign")
REAL_QUESTION_TYPES = ("singledoc_rolls", "singledoc_spells", "multidoc_rolls", "multidoc_spells")
SYNTH_FIELDS = ("id", "context_len", "dataset", "context_window_text", "context_window_text_with_labels",
                "question", "task_group", "task", "answer", "answer_type")


def _read_json_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        data = data.get("data", data.get("rows", [data]))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of Oolong-Real records")
    return data


def load_oolong_real(path: str | Path) -> list[Task]:
    """Oolong-Real records from a JSON / JSON-lines file; raises ValueError naming the record and field."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Oolong-Real file not found: {path}")
    tasks = []
    for k, rec in enumerate(_read_json_records(path)):
        missing = [f for f in REAL_FIELDS if f not in rec]
        if missing:
            raise ValueError(f"{path}: record {k} misses field(s) {missing}")
        if rec["question_type"] not in REAL_QUESTION_TYPES:
            raise ValueError(f"{path}: record {k} has question_type {rec['question_type']!r}; "
                             f"expected one of {REAL_QUESTION_TYPES}")
        campaign = int(rec["campaign"]) if str(rec["campaign"]).isdigit() else rec["campaign"]
        split = {1: "test", 2: "validation"}.get(campaign, "train")
        tasks.append(Task(
            task_id=f"oolong-real-{rec['id']}", env="oolong", split=split, difficulty=rec["question_type"],
            data={"source": "oolong-real", "context": rec["context_window_text"], "question": rec["question"],
                  "answer": str(rec["answer"]), "question_type": rec["question_type"],
                  "episodes": [int(e) for e in rec["episodes"]], "campaign": campaign,
                  "context_window_id": rec["context_window_id"]},
        ))
    return tasks


def load_oolong_synth(path: str | Path, split: str = "test") -> list[Task]:
    """Oolong-synth records from a parquet file; raises ValueError naming missing columns."""
    tasks = []
    for rec in read_parquet_rows(path, SYNTH_FIELDS, "Oolong-synth"):
        answer = rec["answer"]
        if not isinstance(answer, str):  # some exports store the list itself
            answer = repr(list(answer))
        tasks.append(Task(
            task_id=f"oolong-synth-{rec['id']}", env="oolong", split=split, difficulty=str(rec["task_group"]),
            data={"source": "oolong-synth", "context": rec["context_window_text"], "question": rec["question"],
                  "answer": answer, "answer_type": rec["answer_type"], "task_group": rec["task_group"],
                  "task": rec["task"], "dataset": rec["dataset"], "context_len": int(rec["context_len"])},
        ))
    return tasks
