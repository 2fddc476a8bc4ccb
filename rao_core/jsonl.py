"""Atomic files and JSON-lines records shared by trees, tasks and samples.

``atomic_path`` yields a temporary path in the target's folder and renames it over the target only when
the block succeeded, so a reader sees the complete old file or the complete new one, never a half-written
one. ``read_jsonl`` parses one record per non-empty line and names the file and line of a bad record.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

T = TypeVar("T")


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary file path next to ``path``; on success rename it to ``path``, else delete it. The file is
    mode 0600 whatever the umask (what the project writes is its owner's: trees hold every prompt and
    completion); folders made for it are 0700."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600: the owner's alone
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_jsonl(path: str | os.PathLike[str], lines: Iterable[str]) -> Path:
    """Write already-serialised JSON records, one per line, atomically; returns the path."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
    return Path(path)


def short_repr(x: object, limit: int = 60) -> str:
    """``repr(x)`` on one line, cut to ``limit`` characters (ending in ``...``), for error messages."""
    text = repr(x).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line_error(e: BaseException) -> str:
    """A one-line description of a parse error: pydantic errors name the field, the expectation and the
    value (``"task_id: Input should be a valid string (got 123)"``, plus ``"; and N more"``)."""
    if isinstance(e, ValidationError) and (errs := e.errors()):
        first = errs[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "(record)"
        value = short_repr(first.get("input"))
        more = f"; and {len(errs) - 1} more" if len(errs) > 1 else ""
        return f"{loc}: {first.get('msg', 'invalid')} (got {value}){more}"
    if isinstance(e, json.JSONDecodeError):  # one record per line: the column says where, json's "line" never does
        return f"invalid JSON at column {e.pos + 1}: {e.msg}"
    return " ".join(str(e).split()) or type(e).__name__


def read_jsonl(path: str | os.PathLike[str], parse: Callable[[dict], T], what: str,
               unique: tuple[str, Callable[[T], object]] | None = None) -> list[T]:
    """Parse every non-empty line of ``path`` with ``parse(json.loads(line))``.

    ``unique``: ``(field name, key of a record)``; two records with one key are refused.

    Raises FileNotFoundError if the file is missing, ValueError ``"<path>:<line>: not a valid <what>: ..."``
    (one line, naming the field for schema errors) on a malformed line, ``"<path>:<line>: not UTF-8 text"``,
    ``"<path>: is a folder, not a <what> file"``, and with ``unique`` ``"<path>:<line>: <field> 'x' repeats
    line <n> (each <what> needs its own)"``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} file not found: {path}")
    if path.is_dir():
        raise ValueError(f"{path}: is a folder, not a {what} file")
    out = []
    seen: dict[object, int] = {}
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{i}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                record = parse(json.loads(line.rstrip("\r\n")))
            except Exception as e:
                raise ValueError(f"{path}:{i}: not a valid {what}: {one_line_error(e)}") from e
            if unique is not None:
                name, key = unique
                k = key(record)
                if k in seen:
                    raise ValueError(f"{path}:{i}: {name} {short_repr(k)} repeats line {seen[k]} (each {what} needs "
                                     f"its own {name})")
                seen[k] = i
            out.append(record)
    return out
