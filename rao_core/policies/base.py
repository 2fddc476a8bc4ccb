"""The policy interface used by the runtime for every node turn.

Message format (the contract between policies and the runtime): an assistant message is free-form
reasoning followed by ONE code cell in a fenced block opening with ```python and closing with ```.
The runtime runs the first such block; text after it is ignored. The cell may use top-level ``await``.

A policy sees the node (goal, structured goal, depth, readable messages so far including the last
observation) and the exact prompt token ids the runtime built with the checkpoint's chat template.
Endpoint policies return the server's token ids and log-probs; scripted policies may return text only
(``token_ids=None``), and the runtime then tokenises the text itself and records log-prob 0.0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel, ConfigDict

from rao_core.tree import Node


class PolicyRequest(BaseModel):
    """One generation request for ``node``'s next turn. ``prompt_token_ids``: [T_prompt] ids."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    node: Node
    env: str
    prompt_token_ids: list[int]
    max_tokens: int
    seed: int | None = None  # sampling seed of this request (``agent.request_seed``); None: the server's own
    tree_id: str = ""  # the execution tree asking (a pool of servers pins each tree to one); "": none


class Generation(BaseModel):
    """A policy's answer. ``token_ids`` and ``logprobs`` ([T_gen] each) are None for text-only policies."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None  # as echoed by the server, for the prefix check


def code_message(reasoning: str, code: str) -> Generation:
    """A scripted assistant message: ``reasoning``, a blank line, then ``code`` in one ```python cell."""
    return Generation(text=f"{reasoning}\n\n```python\n{code}\n```", finish_reason="stop")


class Policy(ABC):
    """Async policy. Implementations must be safe to call concurrently from one event loop."""

    name: str = "policy"

    @abstractmethod
    async def generate(self, request: PolicyRequest) -> Generation:
        """Return the next assistant message for ``request.node``; raise PolicyError on failure."""

    def tree_done(self, tree_id: str) -> dict[str, Any]:
        """Called by the runtime once tree ``tree_id`` has ended (finished, failed or cancelled): a policy that
        keeps per-tree state (``rao_core.policies.pool.PolicyPool``'s pin) drops it here. Returns entries to
        record in the tree's ``meta`` (default: none)."""
        return {}

    async def aclose(self) -> None:
        """Release connections (default: nothing)."""


class PolicyError(RuntimeError):
    """The policy could not answer (server dead, repeated transient errors, bad response)."""
