"""A tiny OpenAI-compatible HTTP server (stdlib) for unit tests of the judge client.

It speaks the real wire protocol (``POST /v1/chat/completions``), so the tests exercise the openai client,
its retries and our parsing exactly as against vLLM or a hosted API. ``responder(body, index)`` returns
``(status, content_or_error, headers)``; requests are recorded in ``.requests`` (path, body and headers).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any], int], tuple[int, str, dict[str, str]]]


def completion(content: str, prompt_tokens: int = 100, completion_tokens: int = 20, model: str = "judge") -> dict:
    """An OpenAI chat.completion response body."""
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class FakeOpenAI:
    """Threaded fake server on 127.0.0.1 (random port). Use as a context manager."""

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:  # GET /v1/models, as a real OpenAI-compatible server answers
                payload = json.dumps({"object": "list", "data": [{"id": "judge", "object": "model"}]}).encode()
                self.send_response(200 if self.path.rstrip("/").endswith("/models") else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with outer._lock:
                    idx = len(outer.requests)
                    outer.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                status, content, headers = outer.responder(body, idx)
                if status == 200:
                    payload = json.dumps(completion(content, model=body.get("model", "judge"))).encode()
                else:
                    payload = json.dumps({"error": {"message": content, "type": "test", "code": status}}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
