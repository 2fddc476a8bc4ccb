"""Project-local paths. ``RAO_HOME`` (default: ``<repo>/var``) holds models, runs, caches and services."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def rao_home() -> Path:
    """Root folder for everything the project writes (env ``RAO_HOME`` overrides)."""
    return Path(os.environ.get("RAO_HOME", REPO_ROOT / "var")).resolve()


def models_dir() -> Path:
    """Where set-up puts model checkpoints: ``smollm2-135m-instruct/`` and ``tiny-llama/``."""
    return rao_home() / "models"


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct converted to safetensors by ``make setup``."""
    return models_dir() / "smollm2-135m-instruct"


def tiny_model_path() -> Path:
    """A tiny randomly initialised Llama with SmolLM2's tokenizer, for fast tests."""
    return models_dir() / "tiny-llama"


def vllm_python() -> Path:
    """Python of the separate inference-server environment (env ``RAO_VLLM_PYTHON`` overrides)."""
    return Path(os.environ.get("RAO_VLLM_PYTHON", REPO_ROOT / ".venv-vllm" / "bin" / "python"))


def vllm_cache_dir() -> Path:
    """vLLM's cache root for the servers the project starts (``VLLM_CACHE_ROOT``, vLLM's own variable; vLLM's
    default is ``~/.cache/vllm``): ``$RAO_HOME/cache/vllm``. Its ``torch_compile_cache/`` holds the compiled
    graphs (and the inductor cache) keyed by vLLM's config, code and torch hash, so a second start of the same
    model and settings loads them instead of compiling again; deleting ``var/`` deletes it too."""
    return rao_home() / "cache" / "vllm"
