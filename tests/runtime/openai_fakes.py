"""The answer of a fake OpenAI-compatible ``/v1/completions`` server (stdlib only): one body, one writer, shared
by the test servers (``fake_openai_server.py``, run as a script, and the in-process ones of the runtime tests)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any, Sequence


def completion(model: str, prompt_ids: Sequence[int], text: str, ids: Sequence[int],
               logprobs: Sequence[float | None], tokens: Sequence[str]) -> dict[str, Any]:
    """A vLLM-style completion: ``text`` generated as ``ids`` with ``logprobs`` (one per id), the prompt's ids
    echoed (``prompt_token_ids``), finish reason ``stop``, usage counted from both."""
    return {"id": "x", "object": "text_completion", "created": 0, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "token_ids": list(ids),
                         "prompt_token_ids": list(prompt_ids),
                         "logprobs": {"tokens": list(tokens), "token_logprobs": list(logprobs),
                                      "top_logprobs": None, "text_offset": list(range(len(ids)))}}],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                      "total_tokens": len(prompt_ids) + len(ids)}}


def send_json(handler: BaseHTTPRequestHandler, obj: Any) -> None:
    """Answer ``handler``'s request with 200 and ``obj`` as JSON."""
    data = json.dumps(obj).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
