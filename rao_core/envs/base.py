"""The environment interface: what the runtime needs from a benchmark.

The runtime (``rao_core.runtime``) owns the REPL sandboxes, the policy and the limits; an environment owns the RL
task data, the orchestrator-side state of one rollout (``Episode``: e.g. TextCraft's shared inventory) and its
tools. REPL tools are stubs that send ``(name, args, kwargs)`` back to ``Environment.call_tool``, so model code
never edits the environment state, the limits or its own reward (docs/concepts.md). Contract: ``@tool`` methods
(their signature and docstring are the system prompt's, ``bind_tool_args`` checks every call); ``ToolError`` for
errors the agent should see (any other exception is an environment bug); ``call_tool`` synchronous, consistent
under concurrent siblings; ``verify`` the exact verifier (None: not checkable, the judge decides);
``validate_task`` cheap, raising ``TaskError`` naming the field, before any rollout.
Docs: docs/environments.md#adding-an-environment-walk-through-example-box-sum.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rao_core.jsonl import short_repr, write_jsonl
from rao_core.tree import Node


class ToolError(Exception):
    """An error reported to the agent as a message (never kills the node): the REPL stub re-raises it inside the
    REPL as a plain exception with that message. Any other exception from a tool is a bug in the environment."""


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


def split_digits(split: str) -> tuple[int, ...]:
    """Last digits of the generated items' indices that belong to ``split`` (test 0, validation 1, train 2-9;
    DeepDive's start entities, ART-E's facts); ValueError for another split."""
    digits = {"train": (2, 3, 4, 5, 6, 7, 8, 9), "validation": (1,), "test": (0,)}
    if split not in digits:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(digits)}")
    return digits[split]


def check_options(env: str, options: dict[str, Any], allowed: Iterable[str]) -> None:
    """Raise ValueError naming ``env``'s unknown generator ``options`` and the ``allowed`` ones."""
    allowed = list(allowed)
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise ValueError(f"{env}: unknown generator option(s) {bad}; expected {', '.join(allowed)}")


def difficulty_levels(n: int, difficulty: str | None, levels: Iterable[str], mixed: Iterable[str],
                      what: str = "difficulty") -> list[str]:
    """The levels a generator draws from: ``[difficulty]``, or every level of ``mixed`` for None / "mixed";
    ValueError for ``n < 1`` or a ``difficulty`` not in ``levels`` (named as ``what`` in the message)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if difficulty in (None, "mixed"):
        return list(mixed)
    if difficulty not in levels:
        raise ValueError(f"unknown {what} {difficulty!r}; expected one of {[*levels, 'mixed']}")
    return [difficulty]


def read_parquet_rows(path: str | os.PathLike[str], columns: Iterable[str], what: str) -> list[dict[str, Any]]:
    """The rows of a parquet file as dicts; FileNotFoundError naming ``what``, ValueError naming the missing
    ``columns``."""
    import pyarrow.parquet as pq

    if not Path(path).exists():
        raise FileNotFoundError(f"{what} file not found: {path}")
    table = pq.read_table(path)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}; found {table.column_names}")
    return table.to_pylist()


def show_value(x: Any, limit: int = 60) -> str:
    """Short one-line ``repr`` of a bad value with its type, for error messages (``'one' (str)``)."""
    return f"{short_repr(x, limit)} ({type(x).__name__})"


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


def tool(fn: Callable[..., Any] | None = None, *, finishes: bool = False) -> Any:
    """Declare an ``Environment`` method as a REPL tool: ``@tool`` or ``@tool(finishes=True)``.

    The tool is described once, by the method: its name is the method's name; its signature (shown to the
    policy) the method's parameters after ``self``, minus ``episode`` and ``node`` (the runtime passes
    those when the method takes them), with annotations and defaults as written; its doc the docstring
    joined into one paragraph, where ``$field`` stands for ``self.config.field``. ``finishes=True``: the
    value it returns ends the node as its result (e.g. ART-E's ``return_final_answer``).
    """
    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        f.__rao_tool__ = finishes  # type: ignore[attr-defined]
        return f
    return mark(fn) if fn is not None else mark


def _tool_params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters a REPL call fills: all but ``self``, ``episode`` and ``node``."""
    return [p for p in list(inspect.signature(fn).parameters.values())[1:] if p.name not in _INJECTED]


def _tool_signature(name: str, fn: Callable[..., Any], returns: str | None = None) -> str:
    """``name(a: int, b: str = 'x') -> T`` from ``fn``'s parameters and return annotation (or ``returns``)."""
    def text(a: Any) -> str:
        return a if isinstance(a, str) else inspect.formatannotation(a)

    args = [p.name + (f": {text(p.annotation)}" if p.annotation is not p.empty else "")
            + ("" if p.default is p.empty else (" = " if p.annotation is not p.empty else "=") + repr(p.default))
            for p in _tool_params(fn)]
    ret = returns or inspect.signature(fn).return_annotation
    return f"{name}({', '.join(args)})" + ("" if ret is inspect.Signature.empty else f" -> {text(ret)}")


def bind_tool_args(name: str, params: list[inspect.Parameter], args: list[Any],
                   kwargs: dict[str, Any]) -> dict[str, Any]:
    """Bind a REPL call's positional and keyword arguments to ``params`` (by name; defaults left to the
    function); raises ToolError naming the tool for too many, unexpected, duplicate or missing arguments."""
    names = [p.name for p in params]
    if len(args) > len(names):
        raise ToolError(f"{name}() takes at most {len(names)} argument(s) ({', '.join(names)}), got {len(args)}")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise ToolError(f"{name}() got an unexpected argument {k!r}; expected {', '.join(names) or 'none'}")
        if k in bound:
            raise ToolError(f"{name}() got two values for {k!r}")
        bound[k] = v
    missing = [p.name for p in params if p.name not in bound and p.default is p.empty]
    if missing:
        raise ToolError(f"{name}() missing argument(s): {', '.join(missing)}")
    return bound


_INJECTED = ("episode", "node")


class Environment(ABC):
    """Base class of the benchmarks. Instances are cheap and hold configuration only.

    Tools are methods marked with ``@tool`` (see :func:`tool`); ``launch_subagent`` is described the same
    way by the method of that name, which validates the call and returns the child's ``ChildSpec``.
    """

    name: ClassVar[str]
    #: True when every node (not only roots) has an exact verifier (TextCraft-Synth).
    exact_subtask_verifier: ClassVar[bool] = False
    #: Default cap of the delegation bonus (``algo.bonus: useful`` with ``algo.lam`` unset; rao_core.rewards).
    #: Each environment sets its own, with its source (docs/algorithm/authors-code.md).
    delegation_cap: ClassVar[float] = 0.4
    #: Expert policy ``"module:Class"`` (built with no arguments) of an environment named by import path;
    #: registered environments name theirs in ``rao_core.envs.REGISTRY``.
    expert_policy: ClassVar[str | None] = None
    #: Judge prompt file beside the module of an environment named by import path (docs/judging.md format).
    judge_prompt: ClassVar[str | None] = None

    def bonus_exclusion(self, episode: Episode, parent: Node, child: ChildSpec) -> str | None:
        """Why a child launched by ``parent`` with ``child`` earns ``parent`` no delegation bonus, or None.

        The anti-farming rule of ``algo.bonus: useful`` (rao_core.rewards), stored in ``Node.no_bonus`` at
        launch. Default, for environments whose goals are free text (whitespace and case normalised): the
        child's whole goal text is its parent's, or the child's goal is the parent's goal or question with no
        context of its own (a split of a long input passes a part as context: the judge decides that one,
        docs/judging.md). Environments with structured goals override it (TextCraft: targets and recipes).
        """
        def norm(text: Any) -> str:
            return " ".join(str(text or "").split()).casefold()

        own = {norm(parent.goal), norm(parent.goal_args.get("goal")), norm(parent.goal_args.get("question"))} - {""}
        if norm(child.goal) in own or (norm(child.goal_args.get("goal")) in own
                                       and not norm(child.goal_args.get("context"))):
            return "forwards its parent's goal"
        return None

    @classmethod
    @functools.cache
    def _tool_methods(cls) -> dict[str, Callable[..., Any]]:
        """The ``@tool`` methods by name, in definition order (base classes first)."""
        names = dict.fromkeys(n for k in reversed(cls.__mro__) for n in vars(k))
        return {n: f for n in names if hasattr(f := getattr(cls, n, None), "__rao_tool__")}

    def _doc(self, fn: Callable[..., Any]) -> str:
        config = getattr(self, "config", None)
        values = config.model_dump() if isinstance(config, BaseModel) else {}
        return string.Template(" ".join((inspect.getdoc(fn) or "").split())).safe_substitute(values)

    def tools(self) -> list[ToolSpec]:
        """The environment's REPL tools (besides launch_subagent and finish), from its ``@tool`` methods."""
        return [ToolSpec(name=n, signature=_tool_signature(n, f), doc=self._doc(f), finishes=f.__rao_tool__)
                for n, f in self._tool_methods().items()]

    def subagent_tool(self) -> ToolSpec:
        """``launch_subagent`` as shown to the policy: the signature and docstring of ``self.launch_subagent``."""
        fn = type(self).launch_subagent
        return ToolSpec(name="launch_subagent", signature=_tool_signature("launch_subagent", fn, "object"),
                        doc=self._doc(fn))

    def _invoke(self, name: str, fn: Callable[..., Any], episode: Episode, node: Node | None, args: list[Any],
                kwargs: dict[str, Any]) -> Any:
        """Call method ``fn`` with the bound REPL arguments (and ``episode``/``node`` when it takes them)."""
        params = list(inspect.signature(fn).parameters)
        given = {k: v for k, v in (("episode", episode), ("node", node)) if k in params}
        return fn(self, **given, **bind_tool_args(name, _tool_params(fn), args, kwargs))

    def call_tool(self, episode: Episode, node: Node, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run tool ``name`` for ``node``; return a JSON-serialisable value or raise ToolError. May be called
        concurrently for sibling nodes from one asyncio loop: synchronous, it keeps the episode state consistent
        (no awaits inside)."""
        fn = self._tool_methods().get(name)
        if fn is None:
            raise ToolError(f"unknown tool {name!r}; available: {', '.join(self._tool_methods())}")
        return self._invoke(name, fn, episode, node, args, kwargs)

    def child_spec(self, episode: Episode, parent: Node, args: list[Any], kwargs: dict[str, Any]) -> ChildSpec:
        """Validate ``launch_subagent(*args, **kwargs)`` from ``parent`` (shared binder, then the
        environment's ``launch_subagent`` method); raise ToolError with a clear message if bad."""
        return self._invoke("launch_subagent", type(self).launch_subagent, episode, parent, args, kwargs)

    def launch_subagent(self, goal: str, context: str = '') -> ChildSpec:
        """Start a sub-agent with a fresh context on `goal` (plus optional `context` text) and return its
        finish() value. Await it; run several at once with asyncio.gather."""
        if not isinstance(goal, str) or not goal.strip():
            raise ToolError("launch_subagent needs a non-empty goal string")
        text = goal if not context else f"{goal}\n\nContext:\n{context}"
        return ChildSpec(goal=text, goal_args={"goal": goal, "context": str(context)})

    @abstractmethod
    def new_episode(self, task: Task) -> Episode:
        """Fresh orchestrator-side state for one rollout of ``task``."""

    @abstractmethod
    def root_goal(self, task: Task) -> ChildSpec:
        """Goal text and structured goal of the root node."""

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


def write_tasks(path: str | os.PathLike[str], tasks: list[Task]) -> Path:
    """Write tasks as JSON lines atomically, with sorted keys so the same tasks give the same bytes."""
    return write_jsonl(path, (json.dumps(t.model_dump(), sort_keys=True, separators=(",", ":")) for t in tasks))
