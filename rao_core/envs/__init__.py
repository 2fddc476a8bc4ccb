"""Benchmark environments and their registry.

``REGISTRY`` holds one ``EnvEntry`` per environment: its class, its other names, its expert (scripted
gold-path) policy and the judge prompt shipped in its package. Adding an environment is its own package
plus one line here (``docs/environments.md`` walks through ``rao_core/envs/example``). Names (used in
task files' ``env`` field and on the command line): ``textcraft-synth``, ``oolong``, ``deepdive`` (alias
``deepdive-synth``), ``arte`` (alias ``arte-synth``), ``example``.

An environment outside this package needs no edit here: name it by import path, ``"module:Class"``
(``tasks.env: pagecount:PageCountEnv``, ``--env pagecount:PageCountEnv``), as uvicorn and gym name theirs. The
module is imported with the current folder on ``sys.path``; the class is registered on first use under its
``name`` (the name its task files carry) with the import path as an alias, its expert and judge prompt
taken from its class attributes ``expert_policy`` (``"module:Class"``) and ``judge_prompt`` (a file beside the
module). ``docs/tutorial.md`` builds one.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rao_core.envs.base import (ChildSpec, Environment, Episode, Task, TaskError, ToolError, ToolSpec, tool,
                                write_tasks)
from rao_core.jsonl import read_jsonl

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


def _is_import_path(name: str) -> bool:
    return name.count(":") == 1 and all(part.replace(".", "").replace("_", "").isalnum()
                                        for part in name.split(":"))


def register_import_path(name: str) -> str:
    """Register the environment class named by the import path ``"module:Class"`` (once per process) and
    return its registry name (the class's ``name``). The current folder is put on ``sys.path`` first, so a
    module beside the config is found. Raises ValueError naming the path and what failed (no such module or
    class, not an ``Environment`` subclass, a ``name`` already registered for another class)."""
    if name in _names():
        return _names()[name]
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        cls = _load(name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"environment {name!r}: cannot import it ({type(e).__name__}: {e}); expected "
                         "'module:Class' importable from the current folder or an installed package") from None
    if not (isinstance(cls, type) and issubclass(cls, Environment)) or not getattr(cls, "name", None):
        raise ValueError(f"environment {name!r}: {cls!r} is not an Environment subclass with a `name`")
    known = REGISTRY.get(cls.name)
    if known is not None and known.env != name:
        raise ValueError(f"environment {name!r}: its name {cls.name!r} is already registered for {known.env}")
    REGISTRY[cls.name] = EnvEntry(name, (name,), getattr(cls, "expert_policy", None),
                                  getattr(cls, "judge_prompt", None))
    return cls.name


def canonical_name(name: str) -> str:
    """The registry name of ``name`` (``deepdive-synth`` -> ``deepdive``; an import path ``"module:Class"`` ->
    its class's ``name``, registering it); unknown names come back as is."""
    if name not in _names() and _is_import_path(name):
        try:
            return register_import_path(name)
        except ValueError:
            return name
    return _names().get(name, name)


def check_task(env: Environment, task: Task) -> Task:
    """Check that ``task`` is for ``env`` and passes ``env.validate_task``; returns it or raises TaskError."""
    if canonical_name(task.env) != canonical_name(env.name):
        raise TaskError("env", f"task {task.task_id} is for environment {task.env!r}", f"{env.name!r}")
    env.validate_task(task)
    return task


def load_tasks(path: str | os.PathLike[str], env: Environment | None = None) -> list[Task]:
    """Load a JSON-lines task file, checking every record before anything runs.

    Each line must be a ``Task``; with ``env``, each task must also be for that environment and pass
    ``env.validate_task``; two records with one ``task_id`` are refused. Raises FileNotFoundError, or ValueError
    with one line naming the file, the line, the field and what was expected (``"t.jsonl:3: not a valid task
    record: data.targets.x: unknown item 'x' (expected ...)"``, ``"t.jsonl:5: task_id 'a' repeats line 2 (...)"``).
    """
    ids = ("task_id", lambda t: t.task_id)  # a repeated task_id would mix two tasks' records and verdicts
    if env is None:
        return read_jsonl(path, Task.model_validate, "task record", unique=ids)
    return read_jsonl(path, lambda d: check_task(env, Task.model_validate(d)), "task record", unique=ids)


def _load(target: str) -> Any:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def env_class(name: str) -> type[Environment]:
    """The class of environment ``name`` (a registry name, an alias or an import path ``"module:Class"``; not
    instantiated); raises ValueError listing the known names, or naming what failed for an import path."""
    if _is_import_path(name):
        register_import_path(name)
    names = _names()
    if name not in names:
        raise ValueError(f"unknown environment {name!r}; expected one of {sorted(names)} or an import path "
                         "'module:Class'")
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
    "canonical_name", "env_class", "get_env", "load_tasks", "oracle_policy", "packaged_judge_prompt",
    "register_import_path", "tool", "write_tasks",
]
