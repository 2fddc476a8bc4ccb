"""Accounting and the per-iteration budget of the judging stage."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rao_core.judge.config import JudgeConfig

SOURCES = ("verifier", "judge", "rule", "proxy", "none")


class JudgeStats(BaseModel):
    """What one ``judge_trees`` call (one iteration) did and cost (metric meanings in docs/judging.md)."""

    nodes: int = 0  # nodes seen
    requests: int = 0  # HTTP requests sent, parse retries included
    cache_hits: int = 0  # answers reused from the persistent cache or an identical node of the same call
    failures: int = 0  # nodes scored NaN by the judge (unparseable or transport errors, after retries)
    parse_retries: int = 0  # extra requests after an unparseable answer
    transport_errors: int = 0  # requests that failed after the client's retries
    unfinished_rule: int = 0  # nodes scored 0 by the unfinished rule, without a request
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    budget_exhausted: bool = False
    budget_skipped: int = 0  # nodes that needed the judge after the budget ran out
    sources: dict[str, int] = Field(default_factory=lambda: dict.fromkeys(SOURCES, 0))  # final source counts
    infra_unscored: dict[str, int] = Field(default_factory=dict)  # root end reason -> trees left unscored
    wall_s: float = 0.0

    def as_metrics(self) -> dict[str, float]:
        """Flat, namespaced metrics (``judge/...``) for the metrics logger; meanings in docs/judging.md."""
        judged = self.sources.get("judge", 0)
        m = {f"judge/{k}": float(v) for k, v in self.model_dump(exclude={"sources", "infra_unscored"}).items()}
        m["judge/fail_rate"] = self.failures / judged if judged else 0.0
        for s in SOURCES:
            m[f"judge/source_{s}"] = float(self.sources.get(s, 0))
        m["judge/infra_unscored_trees"] = float(sum(self.infra_unscored.values()))
        for reason, k in self.infra_unscored.items():
            m[f"judge/infra_unscored_{reason}"] = float(k)
        return m


class Budget:
    """Per-iteration limits on judge requests, tokens and dollars (``JudgeConfig`` budget fields).

    ``allows()`` is checked before each request; once it returns False it stays False for this call
    (``stats.budget_exhausted`` is set), so judging stops cleanly instead of flapping.
    """

    def __init__(self, config: JudgeConfig, stats: JudgeStats) -> None:
        """Bind the limits of ``config`` to the running totals in ``stats``."""
        self.config = config
        self.stats = stats

    def allows(self) -> bool:
        """True while one more request fits every configured limit."""
        c, s = self.config, self.stats
        if s.budget_exhausted:
            return False
        over = (
            (c.max_requests is not None and s.requests >= c.max_requests)
            or (c.max_tokens_total is not None and s.prompt_tokens + s.completion_tokens >= c.max_tokens_total)
            or (c.max_cost_usd is not None and s.cost_usd >= c.max_cost_usd)
        )
        if over:
            s.budget_exhausted = True
        return not over

    def charge(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Add one answered request's tokens and dollars to the totals."""
        self.stats.prompt_tokens += prompt_tokens
        self.stats.completion_tokens += completion_tokens
        self.stats.cost_usd += self.config.cost_usd(prompt_tokens, completion_tokens)
