"""Benchmark environments and their registry.

``REGISTRY`` holds one ``EnvEntry`` per environment: its class, its other names, its expert (scripted
gold-path) policy and the judge prompt shipped in its package. Adding an environment is its own package
plus one line here (``docs/environments.md`` walks through ``rao_core/envs/example``). Names (used in
task files' ``env`` field and on the command line): ``textcraft-synth``, ``oolong``, ``deepdive`` (alias
``deepdive-synth``), ``arte`` (alias ``arte-synth``), ``example``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rao_core.envs.base import (ChildSpec, Environment, Episode, Task, ToolError, ToolSpec, load_tasks, tool,
                                write_tasks)

if TYPE_CHECKING:
    from rao_core.policies.base import Policy


class EnvEntry(NamedTuple):
    """One registered environment. ``env`` and ``expert`` are ``"module:Class"`` (imported on use)."""

    env: str
    aliases: tuple[str, ...] = ()  # other names task files and commands may use
    expert: str | None = None  # scripted expert ("oracle") policy, built with no arguments
    judge_prompt: str | None = None  # prompt file in the env's package, used when judge.prompt_dir has none


REGISTRY: dict[str, EnvEntry] = {
    "textcraft-synth": EnvEntry("rao_core.envs.textcraft:TextCraftEnv",
                                expert="rao_core.policies.textcraft_expert:TextCraftExpert"),
    "oolong": EnvEntry("rao_core.envs.oolong:OolongEnv"),
    "deepdive": EnvEntry("rao_core.envs.deepdive:DeepDiveEnv", ("deepdive-synth",),
                         "rao_core.policies.deepdive_expert:DeepDiveExpert"),
    "arte": EnvEntry("rao_core.envs.arte:ArteEnv", ("arte-synth",), "rao_core.policies.arte_expert:ArteExpert"),
    "example": EnvEntry("rao_core.envs.example:BoxSumEnv", (), "rao_core.envs.example:BoxSumExpert", "judge.md"),
}

ENV_NAMES = sorted(n for canonical, e in REGISTRY.items() for n in (canonical, *e.aliases))


def _names() -> dict[str, str]:
    """Every name and alias -> its registry name (read from ``REGISTRY`` each time, so tests may add entries)."""
    return {n: canonical for canonical, e in REGISTRY.items() for n in (canonical, *e.aliases)}


def canonical_name(name: str) -> str:
    """The registry name of ``name`` (``deepdive-synth`` -> ``deepdive``); unknown names come back as is."""
    return _names().get(name, name)


def _load(target: str) -> Any:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def env_class(name: str) -> type[Environment]:
    """The class of environment ``name`` (not instantiated); raises ValueError listing the known names."""
    names = _names()
    if name not in names:
        raise ValueError(f"unknown environment {name!r}; expected one of {sorted(names)}")
    return _load(REGISTRY[names[name]].env)


def get_env(name: str, **options: Any) -> Environment:
    """Instantiate environment ``name``; raises ValueError listing the known names if unknown."""
    return env_class(name)(**options)


def oracle_policy(env_name: str) -> Policy:
    """A new instance of ``env_name``'s expert policy (no-arg constructor).

    Raises ValueError for an environment without one, ImportError when its module is not available.
    """
    entry = REGISTRY.get(canonical_name(env_name))
    if entry is None or entry.expert is None:
        known = sorted(n for n, c in _names().items() if REGISTRY[c].expert)
        raise ValueError(f"no oracle policy for environment {env_name!r}; known: {known}")
    return _load(entry.expert)()


def packaged_judge_prompt(env_name: str) -> Path | None:
    """The judge prompt file shipped in ``env_name``'s package, or None."""
    entry = REGISTRY.get(canonical_name(env_name))
    if entry is None or entry.judge_prompt is None:
        return None
    return Path(importlib.import_module(entry.env.split(":")[0]).__file__).parent / entry.judge_prompt


__all__ = [
    "REGISTRY", "ChildSpec", "ENV_NAMES", "EnvEntry", "Environment", "Episode", "Task", "ToolError", "ToolSpec",
    "canonical_name", "env_class", "get_env", "load_tasks", "oracle_policy", "packaged_judge_prompt", "tool",
    "write_tasks",
]
