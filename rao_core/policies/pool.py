"""A pool of policy servers: every tree pinned to one replica, trees spread by load.

:class:`PolicyPool` is the policy the pipeline's stages use, with one replica or several (``serving.replicas``
servers started by the serve stage, or the external servers of ``serving.base_urls``). The first request of a
tree chooses its replica and every later request of that tree (its sub-agents' too) goes there, so vLLM's prefix
cache holds its prompts; a new tree goes to the live replica with the fewest trees in flight, ties from
``offset`` on. A replica found unreachable (:func:`replica_unreachable`) is taken out: its trees' requests fail
(``policy_error``), new trees go to the others; the last live replica is never taken out. The paper (one server)
has no pool, and the sampled tokens do not depend on the replica. Departure from a global load balancer (SkyRL's
or verl's router): each pool counts only its own trees (one pool per Ray shard), no queue lengths.
Docs: docs/pipeline/ray.md#a-pool-of-policy-servers-servingreplicas-servingbase_urls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from rao_core.policies.base import Generation, Policy, PolicyError, PolicyRequest

log = logging.getLogger("rao")


def replica_unreachable(error: BaseException) -> bool:
    """True when ``error`` (a ``PolicyError`` or its causes) says the replica's server cannot be reached: the
    connection refused, reset or closed without an answer (``openai.APIConnectionError`` except
    ``APITimeoutError``, ``httpx.TransportError`` except timeouts, ``ConnectionError``). A timeout, an HTTP
    error status or a malformed answer is not: the server is there (busy or answering badly)."""
    import httpx

    try:
        import openai

        conn, timeout = (openai.APIConnectionError,), (openai.APITimeoutError,)
    except ImportError:  # pragma: no cover - openai is a dependency of the endpoint policies
        conn, timeout = (), ()
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, timeout + (httpx.TimeoutException, TimeoutError)):
            return False
        if isinstance(e, conn + (httpx.TransportError, ConnectionError)):
            return True
        e = e.__cause__ or e.__context__
    return False


class PolicyPool(Policy):
    """Replicas of one policy, each tree pinned to one of them, trees spread by load.

    Pinning: the first request of a tree (``PolicyRequest.tree_id``) chooses its replica; the pin is dropped when
    the runtime reports the tree ended (``Policy.tree_done``). Spreading: a new tree goes to the live replica with
    the fewest trees in flight (pinned and not yet ended); ties go to the first replica in the order ``offset,
    offset + 1, ...`` (mod N), so the choice is deterministic for a given order of tree starts (Ray shard ``i``
    starts at ``i mod N``: ``ServedEndpoint.replica_offset``). A request that fails with the replica unreachable,
    after the replica policy's own retries, takes it out for the pool's life: every tree pinned to it fails at
    once (``PolicyError``); with one replica the pool behaves as one ``OpenAIPolicy`` (each request tries the
    server again). The serve stage brings a lost replica back at the next checkpoint switch (``tasks.serve``).

    Args:
        replicas: one policy per replica (e.g. an ``OpenAIPolicy`` per server), at least one.
        urls: a name for each replica in messages (its base URL); default ``replica 1``, ``replica 2``, ...
        offset: the replica ties start from (``offset mod N``).

    Safe to call concurrently from one event loop (the bookkeeping has no ``await`` inside).
    ``requests[i]``: requests replica i answered; ``down``: replica index -> why it was taken out.
    """

    def __init__(self, replicas: Sequence[Policy], *, urls: Sequence[str] | None = None, offset: int = 0):
        if not replicas:
            raise ValueError("PolicyPool needs at least one replica")
        self.replicas = list(replicas)
        self.urls = list(urls) if urls is not None else [f"replica {i + 1}" for i in range(len(self.replicas))]
        if len(self.urls) != len(self.replicas):
            raise ValueError(f"PolicyPool: {len(self.urls)} names for {len(self.replicas)} replicas")
        self.offset = offset % len(self.replicas)
        self.name = getattr(self.replicas[0], "name", "policy")
        self.requests = [0] * len(self.replicas)
        self.down: dict[int, str] = {}
        self._pins: dict[str, int] = {}
        self._load = [0] * len(self.replicas)  # trees in flight per replica

    @classmethod
    def of_endpoints(cls, base_urls: Sequence[str], model: str, *, offset: int = 0,
                     key: Callable[[str], str] | None = None, **kwargs: Any) -> PolicyPool:
        """A pool of ``OpenAIPolicy(url, model, **kwargs)``, one per base URL (``.../v1``); ``key(url)`` is the
        key each sends (None: ``OpenAIPolicy``'s default, ``policy_client_key(url)``)."""
        from rao_core.policies.openai_policy import OpenAIPolicy

        return cls([OpenAIPolicy(u, model, api_key=key(u) if key else None, **kwargs) for u in base_urls],
                   urls=list(base_urls), offset=offset)

    def __len__(self) -> int:
        return len(self.replicas)

    def _label(self, i: int) -> str:
        return f"policy replica {i + 1}/{len(self.replicas)} ({self.urls[i]})"

    def choose(self) -> int:
        """The replica a new tree goes to: the live one with the fewest trees in flight; ties to the first in
        the order offset, offset + 1, ... (mod N)."""
        n = len(self.replicas)
        live = [i for i in range(n) if i not in self.down]
        return min(live, key=lambda i: (self._load[i], (i - self.offset) % n))

    def pinned(self, tree_id: str) -> int | None:
        """The replica tree ``tree_id`` is pinned to, or None (not started, or ended)."""
        return self._pins.get(tree_id)

    def in_flight(self) -> list[int]:
        """Trees in flight per replica."""
        return list(self._load)

    async def generate(self, request: PolicyRequest) -> Generation:
        """Ask the replica ``request.tree_id`` is pinned to (pinning it now at its first request); a request
        without a tree id goes to :meth:`choose`'s replica, unpinned.

        Raises:
            PolicyError: the replica's own failure (and, when it was unreachable, the replica is taken out of
                the pool unless it is the last live one), or at once when the tree's replica was taken out.
        """
        key = request.tree_id
        i = self._pins.get(key) if key else None
        if i is None:
            i = self.choose()
            self._load[i] += 1
            if key:
                self._pins[key] = i
        try:
            if i in self.down:
                raise PolicyError(f"{self._label(i)} was taken out of the pool ({self.down[i]}); this tree was "
                                  "pinned to it")
            try:
                gen = await self.replicas[i].generate(request)
            except PolicyError as e:
                self._maybe_take_out(i, e)
                raise
            self.requests[i] += 1
            return gen
        finally:
            if not key:
                self._load[i] -= 1

    def _maybe_take_out(self, i: int, error: BaseException) -> None:
        live = [j for j in range(len(self.replicas)) if j not in self.down]
        if i in self.down or len(live) < 2 or not replica_unreachable(error):
            return
        why = " ".join(str(error).split())[:200]
        self.down[i] = f"unreachable: {why}"
        log.warning(f"{self._label(i)} is unreachable and was taken out of the pool: its {self._load[i]} tree(s) "
                    f"in flight end policy_error, new trees go to the {len(live) - 1} other replica(s) ({why})")

    def tree_done(self, tree_id: str) -> dict[str, Any]:
        """Drop tree ``tree_id``'s pin; returns ``{"replica": i}`` (0-based) to record in the tree's meta when the
        pool has more than one replica and the tree made a request (else ``{}``)."""
        i = self._pins.pop(tree_id, None)
        if i is None:
            return {}
        self._load[i] -= 1
        return {"replica": i} if len(self.replicas) > 1 else {}

    async def aclose(self) -> None:
        """Close every replica's client."""
        for p in self.replicas:
            await p.aclose()
