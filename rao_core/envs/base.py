"""The environment interface: what the runtime needs from a benchmark.

The runtime (``rao_core.runtime``) owns the REPL sandboxes, the policy and the limits. An environment
owns the RL task data, the orchestrator-side state of one rollout (``Episode``: e.g. TextCraft's shared
inventory) and its tools. Tool functions inside the REPL are stubs that send ``(name, args, kwargs)``
back to the orchestrator, which calls ``Environment.call_tool``; model code can therefore never edit the
environment state, the limits or its own reward (spec section 1).

Contract for implementers:
- ``tools()`` lists the REPL tools with a signature and a one-paragraph doc used in the system prompt.
  ``launch_subagent`` and ``finish`` are provided by the runtime; an environment only describes how
  ``launch_subagent`` maps its arguments to a child (``child_spec``) and may declare extra finishing
  tools (``ToolSpec.finishes=True``, e.g. ART-E's ``return_final_answer``): the value returned by
  ``call_tool`` for such a tool becomes the node's result.
- Errors the agent should see (bad item name, malformed ingredients) are raised as ``ToolError``; the
  stub re-raises them inside the REPL as a plain exception with that message. Any other exception is a
  bug in the environment.
- ``call_tool`` may be called concurrently for sibling nodes from one asyncio loop; it is synchronous
  and must keep the episode state consistent (no awaits inside).
- ``verify`` is the exact verifier: a success in [0, 1] for a node, or None when this environment cannot
  check that node exactly (the judging stage then uses an LLM judge or the root proxy).
- ``validate_task`` checks a task record before any rollout (``load_tasks(path, env)`` calls it for
  every record): unknown items, wrong types and impossible goals raise ``TaskError`` naming the field
  and what was expected. It must be cheap and must not open services.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rao_core.jsonl import read_jsonl, write_jsonl
from rao_core.tree import Node


class ToolError(Exception):
    """An error reported to the agent as a message (never kills the node)."""


class TaskError(ValueError):
    """A task record its environment cannot run: ``field`` (dotted path in the record, e.g.
    ``data.targets.m3_i1``), what is wrong with it (``problem``) and what was ``expected``.

    ``str()`` is one line: ``"data.targets.zz9_i999: unknown item 'zz9_i999' (expected ...)"``.
    """

    def __init__(self, field: str, problem: str, expected: str):
        self.field, self.problem, self.expected = field, problem, expected
        super().__init__(f"{field}: {problem} (expected {expected})")


def require_text(data: dict[str, Any], key: str) -> str:
    """``data[key]`` as a non-empty string; raises TaskError naming ``data.<key>`` otherwise."""
    v = data.get(key)
    if not isinstance(v, str) or not v.strip():
        raise TaskError(f"data.{key}", "missing" if v is None else f"got {show_value(v)}", "a non-empty string")
    return v


def require_answers(data: dict[str, Any], expected: str) -> None:
    """``data.answers`` (a non-empty list of strings) or else ``data.answer`` (a string); raises TaskError
    naming the field, with ``expected`` as the expectation of ``data.answer``."""
    answers = data.get("answers")
    if answers:
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise TaskError("data.answers", f"got {show_value(answers)}", "a list of strings")
    elif not isinstance(data.get("answer"), str):
        raise TaskError("data.answer", "missing" if data.get("answer") is None else
                        f"got {show_value(data['answer'])}", expected)


def check_corpus(data: dict[str, Any], params_model: type[BaseModel], generator: str) -> None:
    """Check ``data.corpus`` = ``{"path": existing file}`` or ``{"generator": generator, "params": {...}}``
    (``params`` valid for ``params_model``); raises TaskError naming the field."""
    corpus = data.get("corpus")
    expected = f"{{'path': existing file}} or {{'generator': {generator!r}, 'params': {{...}}}}"
    if not isinstance(corpus, dict) or not ({"path", "params"} & set(corpus)):
        raise TaskError("data.corpus", "missing" if corpus is None else f"got {show_value(corpus)}", expected)
    if "path" in corpus:
        if not isinstance(corpus["path"], str) or not Path(corpus["path"]).exists():
            raise TaskError("data.corpus.path", f"not an existing file: {show_value(corpus['path'])}",
                            "the path of a corpus database on this machine")
        return
    if corpus.get("generator", generator) != generator:
        raise TaskError("data.corpus.generator", f"got {show_value(corpus.get('generator'))}",
                        f"{generator!r} (regenerate the tasks)")
    try:
        params_model.model_validate(corpus["params"])
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise TaskError("data.corpus.params" + (f".{loc}" if loc else ""),
                        f"got {show_value(err.get('input'))}: {err.get('msg', 'invalid')}",
                        f"valid {params_model.__name__} fields") from None


def show_value(x: Any, limit: int = 60) -> str:
    """Short one-line ``repr`` of a bad value with its type, for error messages (``'one' (str)``)."""
    text = repr(x).replace("\n", " ")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{text} ({type(x).__name__})"


class Task(BaseModel):
    """One RL task (a "problem"), as stored in a task file (one JSON object per line).

    ``data`` is environment-specific (TextCraft: targets, inventory, gold plan; Oolong: context and
    question; ...). ``split`` is "train" | "validation" | "test".
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str
    env: str
    split: str = "train"
    difficulty: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(BaseModel):
    """A REPL tool as shown to the policy. ``signature`` like ``craft(ingredients: dict, target: tuple)``."""

    name: str
    signature: str
    doc: str
    finishes: bool = False  # calling it ends the node with the returned value as result


class ChildSpec(BaseModel):
    """What ``launch_subagent(...)`` asked for, after the environment validated it."""

    goal: str  # the child's goal text (its first user message)
    goal_args: dict[str, Any] = Field(default_factory=dict)  # structured goal (TextCraft targets)
    max_steps: int | None = None  # step budget requested for the child (capped by the runtime)


class Episode(BaseModel):
    """Orchestrator-side state of one rollout tree. Environments subclass it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    task: Task


class Environment(ABC):
    """Base class of the four benchmarks. Instances are cheap and hold configuration only."""

    name: ClassVar[str]
    #: True when every node (not only roots) has an exact verifier (TextCraft-Synth).
    exact_subtask_verifier: ClassVar[bool] = False
    #: Signature of launch_subagent shown to the policy.
    subagent_signature: ClassVar[str] = "launch_subagent(goal: str, context: str = '') -> object"
    subagent_doc: ClassVar[str] = (
        "Start a sub-agent with a fresh context on `goal` (plus optional `context` text) and return its "
        "finish() value. Await it; run several at once with asyncio.gather."
    )

    @abstractmethod
    def tools(self) -> list[ToolSpec]:
        """The environment's REPL tools (besides launch_subagent and finish)."""

    @abstractmethod
    def new_episode(self, task: Task) -> Episode:
        """Fresh orchestrator-side state for one rollout of ``task``."""

    @abstractmethod
    def root_goal(self, task: Task) -> ChildSpec:
        """Goal text and structured goal of the root node."""

    def child_spec(self, episode: Episode, parent: Node, args: list[Any], kwargs: dict[str, Any]) -> ChildSpec:
        """Validate ``launch_subagent(*args, **kwargs)``; raise ToolError with a clear message if bad.

        Default: ``launch_subagent(goal: str, context: str = '')``.
        """
        goal = kwargs.pop("goal", args[0] if args else None)
        context = kwargs.pop("context", args[1] if len(args) > 1 else "")
        if not isinstance(goal, str) or not goal.strip():
            raise ToolError("launch_subagent needs a non-empty goal string")
        if kwargs:
            raise ToolError(f"launch_subagent got unexpected arguments: {sorted(kwargs)}")
        text = goal if not context else f"{goal}\n\nContext:\n{context}"
        return ChildSpec(goal=text, goal_args={"goal": goal, "context": str(context)})

    def on_node_start(self, episode: Episode, node: Node) -> None:
        """Hook called before a node's first turn (e.g. snapshot the inventory into node.env_info)."""

    def on_node_end(self, episode: Episode, node: Node) -> None:
        """Hook called once when a node has ended (any end reason), before its parent resumes.

        Used to snapshot node-end state that ``verify`` needs later (TextCraft: target counts when the
        node finished, since the parent may consume them afterwards). Default: nothing.
        """

    def repl_variables(self, episode: Episode, node: Node) -> dict[str, Any]:
        """JSON-serialisable variables pre-set in the node's REPL (e.g. Oolong's long ``context``)."""
        return {}

    @abstractmethod
    def call_tool(self, episode: Episode, node: Node, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run tool ``name`` for ``node``; return a JSON-serialisable value or raise ToolError."""

    def verify(self, episode: Episode, node: Node) -> float | None:
        """Exact success s in [0, 1] of ``node`` (call after the node ended), or None if not checkable."""
        return None

    #: Difficulty names ``generate_tasks`` accepts: listed by ``rao tasks generate --help`` and checked when a
    #: campaign config is loaded (``check_difficulty``). Empty: not declared (the generator checks alone).
    difficulties: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check_difficulty(cls, difficulty: str) -> None:
        """Raise ValueError (one line) unless ``difficulty`` is one of ``difficulties`` (when declared)."""
        if cls.difficulties and difficulty not in cls.difficulties:
            raise ValueError(f"unknown {cls.name} difficulty {difficulty!r}; expected one of {list(cls.difficulties)}")

    def generate_tasks(self, *, n: int, seed: int, difficulty: str | None = None, split: str = "train",
                       **options: Any) -> list[Task]:
        """Seeded offline generator: ``n`` tasks of ``difficulty`` from ``split``; same seed, same tasks.

        Raises NotImplementedError for environments without a generator, ValueError for a bad option.
        """
        raise NotImplementedError(f"environment {self.name!r} has no task generator")

    def extra_system_prompt(self) -> str:
        """Environment-specific guidance appended to the system prompt (may be empty)."""
        return ""

    def validate_task(self, task: Task) -> None:
        """Check that ``task`` can be run by this environment (as configured) before any rollout.

        Raises ``TaskError(field, problem, expected)`` for unknown items, wrong types, missing fields and
        impossible goals. Default: accepts every record (the ``Task`` schema is checked on parsing).
        """


def _same_env(task_env: str, env: Environment) -> bool:
    """True when ``task_env`` names ``env`` (directly or through a registry alias like ``deepdive-synth``)."""
    if task_env == env.name:
        return True
    from rao_core.envs import _REGISTRY

    return task_env in _REGISTRY and _REGISTRY.get(task_env) == _REGISTRY.get(env.name)


def check_task(env: Environment, task: Task) -> Task:
    """Check that ``task`` is for ``env`` and passes ``env.validate_task``; returns it or raises TaskError."""
    if not _same_env(task.env, env):
        raise TaskError("env", f"task {task.task_id} is for environment {task.env!r}", f"{env.name!r}")
    env.validate_task(task)
    return task


def load_tasks(path: str | os.PathLike[str], env: Environment | None = None) -> list[Task]:
    """Load a JSON-lines task file, checking every record before anything runs.

    Each line must be a ``Task``; with ``env``, each task must also be for that environment and pass
    ``env.validate_task``. Raises FileNotFoundError, or ValueError with one line naming the file, the
    line, the field and what was expected (``"t.jsonl:3: not a valid task record: data.targets.x: unknown
    item 'x' (expected ...)"``).
    """
    if env is None:
        return read_jsonl(path, Task.model_validate, "task record")
    return read_jsonl(path, lambda d: check_task(env, Task.model_validate(d)), "task record")


def write_tasks(path: str | os.PathLike[str], tasks: list[Task]) -> Path:
    """Write tasks as JSON lines atomically, with sorted keys so the same tasks give the same bytes."""
    return write_jsonl(path, (json.dumps(t.model_dump(), sort_keys=True, separators=(",", ":")) for t in tasks))
