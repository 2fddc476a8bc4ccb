"""Configuration of the judging stage (one pydantic model, every field documented).

The stage gives every node of an execution tree its success signal s(X, tau_X) of Eq. (1)
(docs/algorithm.md; arXiv:2605.06639, section 2) from one of three sources: the exact verifier, an LLM judge,
or the root proxy. This model configures the judge (endpoint, prompts, cache, budget, prices) and the
fallbacks. It is self-contained so the campaign config can embed it as ``judge: JudgeConfig``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rao_core.paths import rao_home

#: Folder of the prompt files shipped with the package (``<env>.md``).
DEFAULT_PROMPT_DIR = Path(__file__).resolve().parent / "prompts"


DEFAULT_MODEL = "policy"
#: What a judge without an endpoint says (:meth:`JudgeConfig.off_line`): it is off, and how to set one. There is no
#: default port: a request (and a key) sent to a port the installation did not start may reach anyone's server.
NO_ENDPOINT = ("judge: off, no endpoint is set (judge.enabled is true, judge.base_url is unset): set judge.base_url "
               "(--set judge.base_url=URL) or RAO_JUDGE_BASE_URL, or serve a judge model with `rao services up "
               "--model DIR`; nodes without a verifier value get the root proxy meanwhile")


def _env_default(names: tuple[str, ...], fallback: str | None) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), fallback)


def default_cache_path() -> Path:
    """``RAO_HOME/cache/judge.sqlite``: the persistent judge cache used when ``cache_path`` is unset."""
    return rao_home() / "cache" / "judge.sqlite"


class JudgeConfig(BaseModel):
    """Settings of the judging stage: which source scores a node, and how the LLM judge is called.

    Source selection per node (see ``rao_core.judge.stage``): ``verifier`` when the runtime stored an
    exact value in ``node.verifier``; else ``rule`` for a node that forwarded its goal
    (``forwarding_is_failure``); else ``judge`` when ``enabled`` and the
    environment is in ``judge_envs``; else ``proxy`` (the node inherits its root's success, the paper's
    fallback) when ``use_proxy``; else ``none`` (NaN).

    Budget fields bound ONE call of ``judge_trees`` (one iteration). The checks run before each request,
    so token and dollar limits can be overshot by at most ``max_concurrency`` requests already in flight.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Use the LLM judge for nodes without an exact verifier value.")
    base_url: str | None = Field(
        default_factory=lambda: _env_default(("RAO_JUDGE_BASE_URL", "RAO_POLICY_BASE_URL"), None),
        description="OpenAI-compatible endpoint of the judge. Default: env RAO_JUDGE_BASE_URL, else the "
        "project's local vLLM service (RAO_POLICY_BASE_URL, exported by `rao services up --model`), else none: "
        "the judge is then off (one line says how to set it; no default port is tried). Use "
        "https://api.openai.com/v1 for a hosted model.",
    )
    model: str = Field(
        default_factory=lambda: _env_default(("RAO_JUDGE_MODEL", "RAO_POLICY_MODEL"), DEFAULT_MODEL),
        description="Model name sent to the endpoint (the paper uses gpt-5-mini). Default: env "
        "RAO_JUDGE_MODEL, else RAO_POLICY_MODEL, else 'policy' (the local vLLM service's served name).",
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="Name of the environment variable holding the API key of a hosted judge; when it is unset "
        "the key 'EMPTY' is sent. The project's own vLLM service (RAO_POLICY_BASE_URL, recorded by `rao services "
        "up`) and the servers this process started get their own key instead, which no other endpoint, loopback "
        "included, gets (rao_core.policies.openai_policy.policy_client_key).",
    )
    judge_envs: list[str] | None = Field(
        None, description="Environments whose un-verified nodes are sent to the judge; None = all environments."
    )
    use_proxy: bool = Field(
        True, description="Fall back to the root proxy (node inherits the root's success) when not judged."
    )
    judge_roots: bool = Field(
        False, description="Also judge a root that has no verifier value (normally every root has one)."
    )
    child_source: Literal["auto", "root_proxy"] = Field(
        "auto", description="'auto': a sub-agent node is scored by the rules, its verifier, the judge or the root "
        "proxy, in that order; 'root_proxy' (the paper's ablation, docs/algorithm.md): every sub-agent node "
        "inherits its root's success (source 'proxy'), whatever its verifier, the judge or the unfinished rule "
        "would say."
    )
    unfinished_is_failure: bool = Field(
        True, description="A sub-agent node that did not finish (step/context limit, crash, cancellation) gets "
        "s = 0 (source 'rule') before any verifier, judge or proxy, so it never earns its parent a bonus."
    )
    forwarding_is_failure: bool = Field(
        True, description="A sub-agent node without a verifier value whose only child was given the node's own "
        "goal (whitespace and case normalised) gets s = 0 (source 'rule', judge.rule 'forwarded') without a "
        "request: forwarding the whole task earns its parent no delegation bonus."
    )
    infra_failures: Literal["unscored", "failure"] = Field(
        "unscored", description="Trees whose root ended by policy_error, sandbox_error, token_prefix_break or "
        "tree_timeout (infrastructure, not the policy): 'unscored' leaves them out of their group and of the "
        "baselines (counted per end reason as judge/infra_unscored_<reason>); 'failure' scores them like any "
        "other root (usually 0). Step, budget and context limits are always policy failures."
    )
    max_concurrency: int = Field(8, ge=1, description="Judge requests in flight at once.")
    max_retries: int = Field(
        4, ge=0, description="Retries with exponential backoff on transient errors (timeouts, 408/409/429/5xx), "
        "done by the openai client."
    )
    parse_retries: int = Field(
        1, ge=0, description="Extra requests when an answer cannot be parsed into a verdict (then s = NaN)."
    )
    timeout_s: float = Field(60.0, gt=0, description="Per-request timeout, seconds.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of the judge.")
    max_tokens: int = Field(256, ge=1, description="Maximum completion tokens per judge answer.")
    json_response_format: bool = Field(
        False, description="Send response_format={'type': 'json_object'} (structured output, if the server "
        "supports it); parsing stays lenient either way."
    )
    prompt_dir: Path = Field(DEFAULT_PROMPT_DIR, description="Folder holding one prompt file per environment.")
    cache_path: Path | None = Field(
        None, description="SQLite judge cache; None = RAO_HOME/cache/judge.sqlite."
    )
    use_cache: bool = Field(True, description="Read and write the persistent cache.")
    include_cells: bool = Field(
        True, description="Show the judge a bounded summary of the node's code cells and outputs."
    )
    max_summary_chars: int = Field(2000, ge=0, description="Character bound of the cell summary.")
    max_result_chars: int = Field(4000, ge=1, description="Character bound of the node's result shown.")
    max_goal_chars: int = Field(4000, ge=1, description="Character bound of the sub-task goal shown.")
    max_requests: int | None = Field(None, ge=0, description="Budget: judge requests per iteration.")
    max_tokens_total: int | None = Field(
        None, ge=0, description="Budget: prompt + completion tokens per iteration."
    )
    max_cost_usd: float | None = Field(None, ge=0, description="Budget: dollars per iteration.")
    price_prompt_per_1m: float = Field(0.0, ge=0, description="USD per 1M prompt tokens (0 for a local model).")
    price_completion_per_1m: float = Field(0.0, ge=0, description="USD per 1M completion tokens.")
    on_budget_exhausted: Literal["proxy", "nan"] = Field(
        "proxy", description="What un-judged nodes get once the budget is spent: the root proxy, or NaN."
    )

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"judge base_url must start with http:// or https://, got {v!r}")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _check_key_env(cls, v: str) -> str:
        from rao_core.policies.openai_policy import check_key_env

        return check_key_env(v)

    @field_validator("model")
    @classmethod
    def _check_model(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("judge model name must not be empty")
        return v

    @model_validator(mode="after")
    def _check_prompt_dir(self) -> JudgeConfig:
        if self.enabled and not Path(self.prompt_dir).is_dir():
            raise ValueError(f"judge prompt_dir {self.prompt_dir} is not a folder")
        return self

    @property
    def active(self) -> bool:
        """Whether nodes are sent to the judge: ``enabled`` and an endpoint (``base_url``) is set."""
        return self.enabled and self.base_url is not None

    def off_line(self) -> str | None:
        """The one line saying the judge is off for want of an endpoint and how to set one (:data:`NO_ENDPOINT`),
        when ``enabled`` without ``base_url``; else None."""
        return NO_ENDPOINT if self.enabled and self.base_url is None else None

    def resolved_cache_path(self) -> Path:
        """The cache file actually used (``cache_path`` or the RAO_HOME default)."""
        return Path(self.cache_path) if self.cache_path is not None else default_cache_path()

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Dollar cost of a request: tokens times the configured price per 1M tokens."""
        return (prompt_tokens * self.price_prompt_per_1m + completion_tokens * self.price_completion_per_1m) / 1e6
