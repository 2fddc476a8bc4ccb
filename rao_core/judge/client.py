"""The judge's OpenAI-API client and one-item judging (request, parse, retry, cache, budget).

Transport: ``openai.AsyncOpenAI`` against ``JudgeConfig.base_url``; transient errors (connection errors,
timeouts, 408/409/429/5xx) are retried by the openai client itself with exponential backoff and
``Retry-After`` honoured (``max_retries``). Errors that mean the judge is misconfigured (401 bad key, 403,
404 unknown model or route) raise ``JudgeEndpointError`` and stop the stage, instead of silently scoring
every node NaN. Other errors after retries make that node's judgement fail (NaN).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import openai
from pydantic import BaseModel

from rao_core.judge.budget import Budget, JudgeStats
from rao_core.judge.cache import JudgeCache, cache_key
from rao_core.judge.config import JudgeConfig
from rao_core.judge.parsing import parse_verdict

REMINDER = ('Your answer could not be read. Reply with ONE JSON object and nothing else: '
            '{"verdict": "yes" or "no", "reason": "<one short sentence>"}')


class JudgeEndpointError(RuntimeError):
    """The judge endpoint rejected the configuration (bad key, unknown model, wrong URL)."""


class JudgeOutcome(BaseModel):
    """Result of judging one item.

    ``status``: "ok" (verdict parsed), "failed" (NaN: unparseable after retries or transport error),
    "budget" (not judged: the budget ran out first). ``raw`` holds every answer text received (joined
    by a separator line when retried) or the error text.
    """

    status: Literal["ok", "failed", "budget"]
    verdict: Literal["yes", "no"] | None = None
    reason: str = ""
    raw: str = ""
    how: str | None = None
    cached: bool = False
    attempts: int = 0
    error: str | None = None

    @property
    def success(self) -> float:
        """s for the node: 1.0 yes, 0.0 no, NaN otherwise."""
        return {"yes": 1.0, "no": 0.0}.get(self.verdict or "", float("nan"))


def make_client(config: JudgeConfig) -> openai.AsyncOpenAI:
    """An AsyncOpenAI client for ``config``. Its key (``rao_core.policies.openai_policy.policy_client_key``):
    the key of a server this process started, ``RAO_POLICY_API_KEY`` for the project's vLLM service
    (``RAO_POLICY_BASE_URL``), else the variable named by ``config.api_key_env``; any other endpoint, loopback
    included, gets only that variable (never the project's own key); 'EMPTY' when unset. Raises ValueError (the
    line saying how to set one) when ``config`` has no endpoint."""
    from rao_core.policies.openai_policy import policy_client_key

    if config.base_url is None:
        raise ValueError(config.off_line() or "judge: no endpoint (judge.base_url) is set")
    return openai.AsyncOpenAI(base_url=config.base_url, api_key=policy_client_key(config.base_url,
                                                                                   key_env=config.api_key_env),
                              max_retries=config.max_retries, timeout=config.timeout_s)


class Judger:
    """Judges (messages, goal, result, cells) items under one config, sharing cache, budget and stats.

    Identical items (same cache key) in flight at once make one request; the others reuse its answer.
    """

    def __init__(self, config: JudgeConfig, stats: JudgeStats, client: openai.AsyncOpenAI | None = None,
                 cache: JudgeCache | None = None) -> None:
        """``client`` defaults to ``make_client(config)``; ``cache`` to the configured SQLite file."""
        self.config = config
        self.stats = stats
        self.budget = Budget(config, stats)
        self._own_client = client is None
        self.client = client or make_client(config)
        self.cache = cache if cache is not None else (
            JudgeCache(config.resolved_cache_path()) if config.use_cache else None)
        self._sem = asyncio.Semaphore(config.max_concurrency)
        self._inflight: dict[str, asyncio.Future[JudgeOutcome]] = {}

    async def aclose(self) -> None:
        """Close the client (if created here) and the cache."""
        if self._own_client:
            await self.client.close()
        if self.cache is not None:
            self.cache.close()

    async def _ask(self, messages: list[dict[str, str]]) -> tuple[str, int, int]:
        kwargs: dict[str, Any] = dict(model=self.config.model, messages=messages,
                                      temperature=self.config.temperature, max_tokens=self.config.max_tokens)
        if self.config.json_response_format:
            kwargs["response_format"] = {"type": "json_object"}
        resp = await self.client.chat.completions.create(**kwargs)
        text = (resp.choices[0].message.content or "") if resp.choices else ""
        usage = resp.usage
        return text, (usage.prompt_tokens if usage else 0), (usage.completion_tokens if usage else 0)

    async def judge(self, messages: list[dict[str, str]], *, prompt_version: str, goal: str, result: str,
                    cells: str) -> JudgeOutcome:
        """Judge one item: cache, then up to ``1 + parse_retries`` requests; never raises except
        ``JudgeEndpointError`` (misconfiguration)."""
        key = cache_key(self.config.model, prompt_version, goal, result, cells)
        if self.cache is not None:
            rec = self.cache.get(key)
            if rec is not None:
                self.stats.cache_hits += 1
                return JudgeOutcome(status="ok", verdict=rec["verdict"], reason=rec["reason"], raw=rec["raw"],
                                    how="cache", cached=True)
        if key in self._inflight:
            out = await asyncio.shield(self._inflight[key])
            if out.status == "ok":
                self.stats.cache_hits += 1
                return out.model_copy(update={"cached": True, "attempts": 0})
            return out
        fut: asyncio.Future[JudgeOutcome] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            out = await self._request(messages, key, prompt_version)
            fut.set_result(out)
            return out
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved: waiters re-raise it; no "never retrieved" warning
            raise
        finally:
            self._inflight.pop(key, None)

    async def _request(self, messages: list[dict[str, str]], key: str, prompt_version: str) -> JudgeOutcome:
        raws: list[str] = []
        msgs = list(messages)
        async with self._sem:
            for attempt in range(1 + self.config.parse_retries):
                if not self.budget.allows():
                    return JudgeOutcome(status="budget", raw="\n-----\n".join(raws), attempts=attempt)
                self.stats.requests += 1
                if attempt:
                    self.stats.parse_retries += 1
                try:
                    text, pt, ct = await self._ask(msgs)
                except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as e:
                    raise JudgeEndpointError(
                        f"judge endpoint {self.config.base_url} rejected model {self.config.model!r}: {e}") from e
                except openai.APIError as e:
                    self.stats.transport_errors += 1
                    return JudgeOutcome(status="failed", raw="\n-----\n".join(raws), attempts=attempt + 1,
                                        error=f"{type(e).__name__}: {e}")
                self.budget.charge(pt, ct)
                raws.append(text)
                parsed = parse_verdict(text)
                if parsed is not None:
                    if self.cache is not None:
                        self.cache.put(key, model=self.config.model, prompt_version=prompt_version,
                                       verdict=parsed.verdict, reason=parsed.reason, raw=text,
                                       prompt_tokens=pt, completion_tokens=ct)
                    return JudgeOutcome(status="ok", verdict=parsed.verdict, reason=parsed.reason, raw=text,
                                        how=parsed.how, attempts=attempt + 1)
                msgs = [*msgs, {"role": "assistant", "content": text}, {"role": "user", "content": REMINDER}]
        return JudgeOutcome(status="failed", raw="\n-----\n".join(raws), attempts=len(raws),
                            error="unparseable judge answer")
