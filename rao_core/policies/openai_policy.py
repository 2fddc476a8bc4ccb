"""Endpoint policy: token-in/token-out generations from an OpenAI-compatible vLLM server.

Requests use the legacy completions route with a list of token ids as the prompt, so the server sees
exactly the ids the runtime built (docs/algorithm.md, "Loss"), and vLLM's ``return_token_ids`` extension echoes the
prompt ids and returns the generated ids; ``logprobs=0`` returns each sampled token's log-prob.
Generation stops at EOS or at the end of the first code fence (stop string ``"\\n```\\n"``, kept in the
output with ``include_stop_str_in_output`` so that the recorded ids are exactly what was generated).

Retries: transient errors (connection refused/reset, timeouts, 5xx, 429) are retried with exponential
backoff (tenacity) up to ``max_retries`` times; then ``PolicyError``. Each HTTP request has its own
``request_timeout_s``, so a dead or hung server fails the node instead of hanging.

Keys: :func:`policy_client_key` sends a vLLM key only to the server it was made for (a server this process
started, :func:`bind_server_key`, or the installation's recorded service); any other server, loopback included,
gets the key of the variable the configuration names (``serving.api_key_env``, ``judge.api_key_env``).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any
from urllib.parse import urlsplit

from rao_core.policies.base import Generation, Policy, PolicyError, PolicyRequest

DEFAULT_STOP = ("\n```\n",)


#: The variable holding the keys of the servers this process (or a parent) started: a JSON object
#: ``{origin: key}`` (:func:`server_origin`), kept by :func:`bind_server_key`; children inherit it, so a campaign a
#: test or a command starts in a child process still sends each such server its own key, and no other server one.
SERVER_KEYS_ENV = "RAO_SERVER_KEYS"


def server_origin(base_url: str) -> str:
    """``scheme://host:port`` of a server URL (the path dropped, ``localhost`` read as 127.0.0.1, the scheme's
    default port filled in): two URLs of one server have one origin. ``"http://localhost:8000/v1/"`` gives
    ``"http://127.0.0.1:8000"``."""
    parts = urlsplit(base_url.strip())
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host == "localhost" else host
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return f"{parts.scheme.lower()}://{'[' + host + ']' if ':' in host else host}:{port}"


def _server_keys() -> dict[str, str]:
    try:
        keys = json.loads(os.environ.get(SERVER_KEYS_ENV) or "{}")
    except ValueError:
        return {}
    return keys if isinstance(keys, dict) else {}


def bind_server_key(base_url: str, key: str) -> None:
    """Record that the server at ``base_url`` was started by this process with API key ``key``
    (:data:`SERVER_KEYS_ENV`): from now on :func:`policy_client_key` sends ``key`` to that server (its origin), in
    this process and its children, and to no other."""
    keys = _server_keys()
    keys[server_origin(base_url)] = key
    os.environ[SERVER_KEYS_ENV] = json.dumps(keys)


def unbind_server_key(base_url: str) -> None:
    """Forget the key of the server at ``base_url`` (it was stopped: another process may take its port)."""
    keys = _server_keys()
    if keys.pop(server_origin(base_url), None) is not None:
        os.environ[SERVER_KEYS_ENV] = json.dumps(keys)


def policy_client_key(base_url: str, *, own: bool | None = None, key_env: str = "OPENAI_API_KEY") -> str:
    """The API key a client sends to the OpenAI-compatible server at ``base_url``.

    A key is bound to its server: a server this process started (:func:`bind_server_key`) gets its own key; the
    installation's service (``base_url`` has the origin of ``RAO_POLICY_BASE_URL``, which ``rao services up``
    exports from its record of the server it started) and a server the caller knows the pipeline started
    (``own`` True) get ``RAO_POLICY_API_KEY``. Any other server, on loopback or not, gets only the variable named
    ``key_env``: the installation's key never goes to a server it did not start (another user may listen on a
    loopback port). ``own`` False: only ``key_env``. ``EMPTY`` (what a server without a key ignores) when the
    variable is unset or empty."""
    if own is not False and (bound := _server_keys().get(server_origin(base_url))):
        return bound
    if own is None:
        service = os.environ.get("RAO_POLICY_BASE_URL", "")
        own = bool(service) and server_origin(base_url) == server_origin(service)
    key = (os.environ.get("RAO_POLICY_API_KEY") if own else None) or (os.environ.get(key_env) if key_env else None)
    return key or "EMPTY"


#: Variables an ``api_key_env`` may not name: the installation's own key (it would then reach any server) and
#: what the Ray workers' environment sets itself (``infra.ray_rollouts.worker_runtime_env``).
RESERVED_KEY_ENVS = frozenset({"RAO_POLICY_API_KEY", "RAO_POLICY_BASE_URL", SERVER_KEYS_ENV, "PYTHONPATH",
                               "RAO_HOME", "RAO_VLLM_PYTHON"})


def check_key_env(name: str) -> str:
    """Validate an ``api_key_env`` (``serving.api_key_env``, ``judge.api_key_env``): an environment variable's
    name, not one of :data:`RESERVED_KEY_ENVS`. Returns it; raises ValueError naming the rule broken."""
    if not name.isidentifier():
        raise ValueError(f"api_key_env must name an environment variable, got {name!r}")
    if name in RESERVED_KEY_ENVS:
        raise ValueError(f"api_key_env {name!r} is reserved (the installation's own key and the Ray workers' "
                         "variables); name the variable holding the external server's key, e.g. OPENAI_API_KEY")
    return name


class OpenAIPolicy(Policy):
    """Client of one served model. Safe to call concurrently (one shared ``AsyncOpenAI`` client).

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: served model name.
        api_key: the key sent; None = :func:`policy_client_key` of ``base_url``.
        temperature, top_p: sampling parameters.
        stop: stop strings (default: end of a code fence).
        request_timeout_s: per HTTP request, seconds.
        max_retries: retries of a transient error (so at most ``max_retries + 1`` attempts).
        extra_body: extra vLLM sampling fields (e.g. ``{"min_p": 0.05}``).

        send_seeds: send a request's ``seed`` (``PolicyRequest.seed``: the rollout's seeds), so vLLM
            draws that request's tokens from its own generator seeded with it. False for vLLM's CPU engine
            (``serving.request_seeds``), which dies on a seeded request prefilled in chunks.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, temperature: float = 1.0,
                 top_p: float = 1.0, stop: tuple[str, ...] | list[str] = DEFAULT_STOP,
                 request_timeout_s: float = 120.0, max_retries: int = 3, extra_body: dict[str, Any] | None = None,
                 send_seeds: bool = True):
        from openai import AsyncOpenAI

        if not base_url:
            raise ValueError("OpenAIPolicy needs a base_url such as http://127.0.0.1:8000/v1")
        self.name = model
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.stop = list(stop)
        self.max_retries = max_retries
        self.extra_body = dict(extra_body or {})
        self.send_seeds = send_seeds
        api_key = api_key or policy_client_key(base_url)
        self.client = AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=request_timeout_s, max_retries=0)

    async def _create(self, request: PolicyRequest) -> Any:
        return await self.client.completions.create(
            model=self.model, prompt=request.prompt_token_ids, max_tokens=request.max_tokens,
            temperature=self.temperature, top_p=self.top_p, logprobs=0, stop=self.stop or None,
            **({"seed": request.seed} if request.seed is not None and self.send_seeds else {}),
            extra_body={"return_token_ids": True, "include_stop_str_in_output": True,
                        "skip_special_tokens": False, **self.extra_body})

    async def generate(self, request: PolicyRequest) -> Generation:
        """One completion; raises PolicyError after the retries or on a malformed answer."""
        import openai
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

        transient = (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError,
                     openai.RateLimitError)
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(self.max_retries + 1),
                                               wait=wait_exponential(multiplier=0.25, max=4),
                                               retry=retry_if_exception_type(transient), reraise=True):
                with attempt:
                    resp = await self._create(request)
        except openai.OpenAIError as e:
            raise PolicyError(f"{type(e).__name__} from {self.client.base_url}: {e}") from e
        if not resp.choices:
            raise PolicyError("server returned no choices")
        ch = resp.choices[0]
        extra = ch.model_extra or {}
        token_ids = extra.get("token_ids")
        prompt_ids = extra.get("prompt_token_ids")
        if prompt_ids is None:
            prompt_ids = (resp.model_extra or {}).get("prompt_token_ids")
        if token_ids is None:
            raise PolicyError("server did not return token_ids (needs vLLM with return_token_ids)")
        lps = None
        if ch.logprobs is not None and ch.logprobs.token_logprobs is not None:
            lps = list(ch.logprobs.token_logprobs)
            for i, x in enumerate(lps):  # a missing behaviour log-prob is an error, never a silent 0.0
                if x is None or not isinstance(x, (int, float)) or math.isnan(x):
                    raise PolicyError(f"server returned no usable log-prob for generated token {i} "
                                      f"(id {token_ids[i] if i < len(token_ids) else '?'}): {x!r}")
            lps = [float(x) for x in lps]
        if lps is None or len(lps) != len(token_ids):
            raise PolicyError(f"server returned {len(token_ids)} token ids but "
                              f"{None if lps is None else len(lps)} log-probs")
        return Generation(text=ch.text, token_ids=list(token_ids), logprobs=lps, finish_reason=ch.finish_reason,
                          prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.client.close()
