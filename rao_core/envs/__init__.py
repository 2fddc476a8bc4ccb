"""Benchmark environments and their registry.

``get_env(name, **options)`` builds an environment by name. Names (also used in task files' ``env``
field and on the command line): ``textcraft-synth``, ``oolong``, ``deepdive`` (alias
``deepdive-synth``), ``arte`` (alias ``arte-synth``).
"""

from __future__ import annotations

import importlib
from typing import Any

from rao_core.envs.base import ChildSpec, Environment, Episode, Task, ToolError, ToolSpec, load_tasks, write_tasks

_REGISTRY: dict[str, str] = {
    "textcraft-synth": "rao_core.envs.textcraft:TextCraftEnv",
    "oolong": "rao_core.envs.oolong:OolongEnv",
    "deepdive": "rao_core.envs.deepdive:DeepDiveEnv",
    "deepdive-synth": "rao_core.envs.deepdive:DeepDiveEnv",
    "arte": "rao_core.envs.arte:ArteEnv",
    "arte-synth": "rao_core.envs.arte:ArteEnv",
}

ENV_NAMES = sorted(_REGISTRY)


def get_env(name: str, **options: Any) -> Environment:
    """Instantiate environment ``name``; raises ValueError listing the known names if unknown."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; expected one of {ENV_NAMES}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = [
    "ChildSpec", "ENV_NAMES", "Environment", "Episode", "Task", "ToolError", "ToolSpec", "get_env",
    "load_tasks", "write_tasks",
]
