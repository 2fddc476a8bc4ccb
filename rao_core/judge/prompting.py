"""Judge prompt files: loading, versioning and rendering.

One file per environment, ``<prompt_dir>/<env>.md`` (:func:`prompt_file`: an alias uses its registry name's
file, then the prompt shipped in the environment's package, else ``default.md``), with a ``version`` in its front
matter and ``=== system ===`` / ``=== user ===`` sections (:func:`load_prompt`). The version recorded on nodes and
in the cache key is ``<name>/v<version>#<sha8>`` (``sha8`` a hash of the file's text), so editing a prompt
without bumping ``version`` still changes the key and a stale cached verdict is never reused. ``parent_goal``
and ``subtasks`` (the node's parent's goal, its sub-agents' goals) let a prompt fail a node that only forwarded
its task. Docs: docs/judging.md#prompts.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rao_core.envs import canonical_name, packaged_judge_prompt
from rao_core.tree import EndReason, Node

PLACEHOLDERS = ("goal", "result", "cells", "parent_goal", "subtasks")
_PLACEHOLDER_RE = re.compile(r"\{\{\s*([A-Za-z_]+)\s*\}\}")
NO_CELLS = "(not shown)"


class PromptError(ValueError):
    """A prompt file is missing or malformed; the message names the file and the problem."""


class JudgePrompt(BaseModel):
    """A loaded prompt: ``system`` and ``user`` templates and the ``version`` string (``<name>/v<version>#<sha8>``)."""

    name: str
    version: str
    system: str
    user: str
    path: str

    @property
    def placeholders(self) -> frozenset[str]:
        """The placeholders the user section uses."""
        return frozenset(_PLACEHOLDER_RE.findall(self.user))

    def render(self, *, goal: str, result: str, cells: str, parent_goal: str = NO_CELLS,
               subtasks: str = NO_CELLS) -> list[dict[str, str]]:
        """Chat messages ``[system, user]`` with the placeholders filled (values inserted verbatim)."""
        values = {"goal": goal, "result": result, "cells": cells, "parent_goal": parent_goal, "subtasks": subtasks}
        user = _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], self.user)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]


def prompt_file(env_name: str, prompt_dir: str | Path) -> Path:
    """The prompt file used for ``env_name`` (env file, alias file, or ``default.md``)."""
    d = Path(prompt_dir)
    for p in (d / f"{env_name}.md", d / f"{canonical_name(env_name)}.md", packaged_judge_prompt(env_name),
              d / "default.md"):
        if p is not None and p.is_file():
            return p
    raise PromptError(f"no judge prompt for environment {env_name!r} in {d} (and no default.md)")


def load_prompt(env_name: str, prompt_dir: str | Path) -> JudgePrompt:
    """Load and validate the prompt file of ``env_name``; raises PromptError naming the file. Format::

        ---
        version: 1
        env: oolong
        description: ...
        ---
        === system ===
        ...system message...
        === user ===
        ...user message with {{goal}}, {{result}} and optionally {{cells}}, {{parent_goal}}, {{subtasks}}...
    """
    path = prompt_file(env_name, prompt_dir)
    text = path.read_text(encoding="utf-8")
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.DOTALL)
    if not m:
        raise PromptError(f"{path}: missing front matter (--- version: N --- header)")
    meta = {k.strip(): v.strip() for k, sep, v in (line.partition(":") for line in m.group(1).splitlines()) if sep}
    if not meta.get("version"):
        raise PromptError(f"{path}: front matter has no 'version'")
    parts = re.split(r"^=== (system|user) ===\s*$", m.group(2), flags=re.MULTILINE)
    sections = {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    if set(sections) != {"system", "user"}:
        raise PromptError(f"{path}: needs exactly one '=== system ===' and one '=== user ===' section")
    used = set(_PLACEHOLDER_RE.findall(sections["user"])) | set(_PLACEHOLDER_RE.findall(sections["system"]))
    unknown = used - set(PLACEHOLDERS)
    if unknown:
        raise PromptError(f"{path}: unknown placeholders {sorted(unknown)}; allowed: {list(PLACEHOLDERS)}")
    if not {"goal", "result"} <= used:
        raise PromptError(f"{path}: the user section must use {{{{goal}}}} and {{{{result}}}}")
    if _PLACEHOLDER_RE.search(sections["system"]):
        raise PromptError(f"{path}: placeholders belong in the user section, not the system section")
    sha8 = hashlib.sha256(text.encode()).hexdigest()[:8]
    return JudgePrompt(name=path.stem, version=f"{path.stem}/v{meta['version']}#{sha8}",
                       system=sections["system"], user=sections["user"], path=str(path))


def clip(s: str, n: int) -> str:
    """Keep ``s`` within ``n`` characters: head and tail with a marker saying how much was cut."""
    if len(s) <= n:
        return s
    if n < 40:
        return s[:n]
    cut = len(s) - n
    marker = f"\n...[{cut} characters omitted]...\n"
    keep = max(n - len(marker), 0)
    head = keep // 3
    return s[:head] + marker + s[len(s) - (keep - head):]


def render_result(node: Node, max_chars: int) -> str:
    """The node's final result as text for the judge (JSON for non-strings), at most ``max_chars``."""
    if node.end_reason != EndReason.FINISHED:
        return f"(the agent did not call finish; end reason: {node.end_reason.value})"
    r: Any = node.result
    text = r if isinstance(r, str) else json.dumps(r, ensure_ascii=False, sort_keys=True, default=str)
    return clip(text, max_chars)


def summarize_cells(node: Node, max_chars: int, *, per_cell_chars: int = 600) -> str:
    """A bounded summary of the node's code cells and their outputs, at most ``max_chars`` characters.

    Each turn contributes its code and observation, each clipped to ``per_cell_chars``; the joined text
    is clipped (head and tail kept) to ``max_chars``. Returns ``"(no code cells)"`` for a node without turns.
    """
    if max_chars <= 0:
        return NO_CELLS
    blocks = []
    for i, t in enumerate(node.turns, 1):
        code = (t.code or "").strip()
        obs = (t.observation or "").strip()
        if not code and not obs:
            continue
        blocks.append(f"[cell {i}]\n{clip(code, per_cell_chars) or '(no code)'}\n[output {i}]\n"
                      f"{clip(obs, per_cell_chars) or '(nothing printed)'}")
    if not blocks:
        return "(no code cells)"
    return clip("\n".join(blocks), max_chars)


def summarize_subtasks(children: list[Node], max_chars: int, *, per_goal_chars: int = 600) -> str:
    """The goals of the sub-agents a node launched, one block each (clipped to ``per_goal_chars``), the whole
    at most ``max_chars``; ``"(none: it launched no sub-agent)"`` for a node without children."""
    if not children:
        return "(none: it launched no sub-agent)"
    blocks = [f"[sub-agent {i}] {clip(c.goal.strip(), per_goal_chars)}" for i, c in enumerate(children, 1)]
    return clip("\n".join(blocks), max_chars)
