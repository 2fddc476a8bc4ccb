"""An ASGI middleware for vLLM's API server (``--middleware rao_vllm_auth.RequireKey``): every route requires the
server's API key (``VLLM_API_KEY``, as ``Authorization: Bearer KEY``), not only the ``/v1`` ones vLLM's own
``--api-key`` guards; the probes ``/health``, ``/ping`` and ``/metrics`` stay open. Imported by vLLM's Python
from this folder (``PYTHONPATH``), so it needs nothing but the standard library."""

from __future__ import annotations

import hashlib
import hmac
import json
import os

#: Routes answered without the key: liveness probes and Prometheus' counters (no request or model content).
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics"})


class RequireKey:
    """Answers 401 to a request without ``Authorization: Bearer <VLLM_API_KEY>`` (OPTIONS and
    :data:`OPEN_PATHS` pass). With no ``VLLM_API_KEY`` set, it lets everything pass."""

    def __init__(self, app) -> None:
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        self.digest = hashlib.sha256(key.encode()).digest() if key else None

    def _allowed(self, scope) -> bool:
        if self.digest is None or scope.get("method") == "OPTIONS":
            return True
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS:
            return True
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(hashlib.sha256(token.encode()).digest(),
                                                                  self.digest)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
