"""Scripted policies for tests and demos: replay fixed assistant messages, no model involved.

``ReplayPolicy`` answers each node turn from a script chosen by the node (goal substring, depth or a
callable). Messages are text only (``Generation.token_ids=None``): the runtime tokenises them and records
log-prob 0.0. An optional per-call ``delay_s`` simulates generation latency (asyncio.sleep, so concurrent
nodes overlap as they would against a server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from rao_core.policies.base import Generation, Policy, PolicyError, PolicyRequest
from rao_core.tree import Node

Script = Sequence[str]


def cell(code: str, thought: str = "") -> str:
    """An assistant message holding ``code`` in one ```python block."""
    return f"{thought}\n```python\n{code}\n```" if thought else f"```python\n{code}\n```"


class ReplayPolicy(Policy):
    """Replays assistant messages. Turn k of a node gets ``script[k]`` (the last one repeats).

    Script selection, first match wins: ``by_goal`` (substring of the node's goal -> script), then
    ``by_depth`` (depth -> script), then ``default``. ``chooser`` (node -> script) overrides all.
    Raises PolicyError when no script matches the node.
    """

    name = "replay"

    def __init__(self, *, by_goal: dict[str, Script] | None = None, by_depth: dict[int, Script] | None = None,
                 default: Script | None = None, chooser: Callable[[Node], Script] | None = None,
                 delay_s: float = 0.0):
        self.by_goal = by_goal or {}
        self.by_depth = by_depth or {}
        self.default = default
        self.chooser = chooser
        self.delay_s = delay_s
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def script_for(self, node: Node) -> Script:
        """The script of ``node``; raises PolicyError if none matches."""
        if self.chooser is not None:
            return self.chooser(node)
        for key, script in self.by_goal.items():
            if key in node.goal:
                return script
        if node.depth in self.by_depth:
            return self.by_depth[node.depth]
        if self.default is not None:
            return self.default
        raise PolicyError(f"ReplayPolicy has no script for node at depth {node.depth} with goal {node.goal[:80]!r}")

    async def generate(self, request: PolicyRequest) -> Generation:
        """The next scripted message of ``request.node`` (after ``delay_s``)."""
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            script = self.script_for(request.node)
            if not script:
                raise PolicyError("empty script")
            k = min(len(request.node.turns), len(script) - 1)
            return Generation(text=script[k], finish_reason="stop")
        finally:
            self.in_flight -= 1
