"""Atomic checkpoint folders that vLLM serves as they are, with a JSON manifest.

A checkpoint folder is either
- ``kind='full'``: ``config.json`` + ``model*.safetensors`` + ``generation_config.json`` + tokenizer files
  (``vllm serve DIR`` / ``VLLMServer(DIR)``), tied embeddings kept tied (``tie_word_embeddings`` is
  copied from the parent, the duplicate ``lm_head.weight`` is not written); or
- ``kind='lora'``: ``adapter_config.json`` + ``adapter_model.safetensors`` + tokenizer files, hot-loaded
  with ``POST /v1/load_lora_adapter`` on a server of the base model (``manifest['base_model']``).

Every folder holds ``rao-checkpoint.json`` (:data:`MANIFEST_NAME`): kind, parent checkpoint, base model,
iteration, data hash, config hash, counts and versions. Writing goes to a hidden temporary sibling folder
that is renamed into place, so a reader sees a complete checkpoint or none; an existing folder at the
target is replaced (renamed away first, then deleted). Only an empty folder or a checkpoint may be
replaced: :func:`check_out_folder` refuses any other existing target before training starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rao_core.samples import Sample

MANIFEST_NAME = "rao-checkpoint.json"

__all__ = ["MANIFEST_NAME", "OutFolderError", "data_hash", "read_manifest", "is_checkpoint", "is_lora_checkpoint",
           "is_replaceable", "check_out_folder", "atomic_folder"]


def data_hash(samples: Iterable[Sample]) -> str:
    """sha256 (first 16 hex digits) of the samples' canonical JSON, in order."""
    h = hashlib.sha256()
    for s in samples:
        h.update(s.model_dump_json().encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The checkpoint manifest of ``folder``, or None when it has none (e.g. a base model)."""
    p = Path(folder) / MANIFEST_NAME
    return json.loads(p.read_text()) if p.exists() else None


def is_checkpoint(folder: str | os.PathLike[str]) -> bool:
    """True when ``folder`` holds a model to serve or train from: full weights or a LoRA adapter."""
    return (Path(folder) / "config.json").exists() or is_lora_checkpoint(folder)


def is_lora_checkpoint(folder: str | os.PathLike[str]) -> bool:
    """True when ``folder`` holds a PEFT/LoRA adapter rather than full weights."""
    return (Path(folder) / "adapter_config.json").exists()


class OutFolderError(ValueError):
    """The output folder exists and holds something that writing a checkpoint there would delete."""


def is_replaceable(folder: str | os.PathLike[str]) -> bool:
    """True when writing a checkpoint at ``folder`` loses nothing: it does not exist, is an empty folder, or
    is a checkpoint (this writer's manifest :data:`MANIFEST_NAME`, or model weights: ``config.json`` or
    ``adapter_config.json`` with a ``*.safetensors`` file, e.g. a base model folder)."""
    p = Path(folder)
    if not p.exists():
        return not p.is_symlink()
    if not p.is_dir():
        return False
    if (p / MANIFEST_NAME).is_file() or not any(p.iterdir()):
        return True
    weights = (p / "config.json").is_file() or (p / "adapter_config.json").is_file()
    return weights and any(p.glob("*.safetensors"))


def check_out_folder(folder: str | os.PathLike[str], option: str = "--out") -> None:
    """Refuse, before any work, an output folder that :class:`atomic_folder` would replace and that is not
    :func:`is_replaceable`: an existing file, or a folder holding anything but a checkpoint. Replacing an
    existing checkpoint (re-runs, campaigns) stays allowed.

    Raises:
        OutFolderError: one line ``OPTION FOLDER exists and is not a checkpoint (holds a, b, ...); choose
            another folder or remove it`` (``option``: how the caller names the folder).
    """
    if is_replaceable(folder):
        return
    p = Path(folder)
    if not p.is_dir():
        raise OutFolderError(f"{option} {folder} exists and is not a folder; choose another folder or remove it")
    names = sorted(x.name for x in p.iterdir())
    held = ", ".join(names[:3]) + (f", ... ({len(names)} entries)" if len(names) > 3 else "")
    raise OutFolderError(f"{option} {folder} exists and is not a checkpoint (holds {held}); choose another folder "
                         "or remove it")


class atomic_folder:
    """Context manager yielding a temporary folder that replaces ``target`` on a clean exit.

    On an exception the temporary folder is deleted and ``target`` is left untouched.
    """

    def __init__(self, target: str | os.PathLike[str]):
        self.target = Path(target).resolve()

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        old = None
        if self.target.exists():
            old = self.target.parent / f".{self.target.name}.old-{int(time.time() * 1e6)}"
            os.replace(self.target, old)
        os.replace(self.tmp, self.target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
