"""Evaluation of a policy on held-out RL tasks: recursive agent vs single-agent baseline.

:func:`evaluate_suite` is the one evaluation of the project: ``rao eval`` (any checkpoint on any task
file), the campaign's and the experiment's evaluation after each iteration (``tasks/stages.py``) and the
nightly regression (``flows/evaluate.py``) all call it with an :class:`EvalConfig` (the campaign's
``eval`` section is that model plus pipeline fields) and the runtime limits of the RL rollouts. It runs
:func:`evaluate_policy` once per mode with the same limits (``single`` = the same runtime and context
window with ``delegation=False``, spec section 1), which grows one execution tree per task and
summarises the trees per (mode, difficulty). :func:`eval_tasks` draws the held-out tasks
(``rao_core.task_sampling``, stream ``"eval"``). :func:`compare` flags success rates that dropped
against a champion's metrics (the promotion gate of the pipeline).

Success of a tree = the root node's exact verifier value ``root.verifier`` (stored by the runtime).
Graded scoring (``graded=True``, the default): the success rate is the mean of the values, so Oolong's
partial credit (0.75^|delta|) and ART-E's ladder are kept; for verifiers that return 0 or 1 (TextCraft,
DeepDive, ART-E binary) it equals the fraction solved. ``graded=False``: the fraction of roots with value
``>= 1.0`` (exact solves only). Trees whose root could not be verified (value None)
are not scored: they are counted in ``unscored`` and left out of the rate.

Confidence interval: Wilson score interval at 95% (Wilson 1927, "Probable inference, the law of
succession, and statistical inference", JASA 22(158)):
``(p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``, z = 1.959964. For graded scores the
mean is plugged in as p (an approximation). Departures from the paper: the paper reports success rates
without intervals; this project reports both.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rao_core.envs.base import Environment, Task
from rao_core.metrics import parallel_share
from rao_core.policies.base import Policy
from rao_core.runtime import RuntimeConfig, run_trees
from rao_core.tree import ExecutionTree, verifier_value

__all__ = ["EvalConfig", "EvalRow", "EvalReport", "Mode", "compare", "evaluate_policy", "evaluate_suite",
           "eval_tasks", "mode_runtime", "render_report", "run_evaluation", "summarise", "wilson_interval",
           "Z95"]

Mode = Literal["recursive", "single"]
Z95 = 1.959963984540054  # two-sided 95% normal quantile


class EvalConfig(BaseModel):
    """What an evaluation measures: which held-out tasks, which modes, how roots are scored.

    The campaign's ``eval`` section (``rao_core.config.EvalSettings``) is this model plus pipeline fields,
    a nightly suite entry (``flows.evaluate.SuiteEntry``) is this model plus an environment, and
    ``rao eval`` builds one from its options. How the agent runs (context window, limits, temperature)
    is the caller's ``RuntimeConfig``, the same as in the RL rollouts.
    """

    model_config = ConfigDict(extra="forbid")

    difficulties: list[str] = Field(default_factory=lambda: ["easy"],
                                    description="Task difficulties evaluated, each reported separately.")
    n_tasks: int = Field(8, ge=1, description="Validation tasks per difficulty (seeded, held-out split).")
    seed: int = Field(1234, description="Seed of the evaluation tasks (rao_core.task_sampling, stream 'eval').")
    split: str = Field("validation", description="Task split (validation targets are held out of training).")
    modes: list[Mode] = Field(default_factory=lambda: ["recursive"],
                              description="'recursive' (delegation on) and/or 'single' (delegation off, same "
                              "context window).")
    graded: bool = Field(True, description="True: success rate = mean root verifier value (keeps graded "
                         "scores such as Oolong's partial credit; equals the fraction solved for 0/1 "
                         "verifiers); False: fraction of roots with value >= 1.")

    @field_validator("difficulties", "modes")
    @classmethod
    def _nonempty(cls, v: list) -> list:
        if not v:
            raise ValueError("must list at least one entry")
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate entries in {v}")
        return v


def mode_runtime(runtime: RuntimeConfig, mode: Mode) -> RuntimeConfig:
    """``runtime`` with ``delegation`` on (``mode='recursive'``) or off (``'single'``), everything else kept
    (context window included); re-validated. Raises ValueError for another mode."""
    if mode not in ("recursive", "single"):
        raise ValueError(f"mode must be 'recursive' or 'single', got {mode!r}")
    return RuntimeConfig.model_validate({**runtime.model_dump(), "delegation": mode == "recursive"})


def two_proportion_test(s1: float, n1: int, s2: float, n2: int) -> dict[str, float]:
    """Pooled two-proportion z-test of H1: p2 > p1 (e.g. 1 = warm start, 2 = last iteration).

    Args: successes and trials of each sample (successes may be fractional for graded scores).
    Returns ``{"z", "p_value"}`` (one-sided, upper tail) and ``"p_value_two_sided"``; z = 0 and p = 1 (0.5
    one-sided) when the pooled variance is 0 (both rates 0 or both 1). Raises ValueError for n < 1.
    """
    if n1 < 1 or n2 < 1:
        raise ValueError(f"two_proportion_test needs n >= 1, got {n1} and {n2}")
    p1, p2 = s1 / n1, s2 / n2
    pool = (s1 + s2) / (n1 + n2)
    var = pool * (1 - pool) * (1 / n1 + 1 / n2)
    if var <= 0:
        return {"z": 0.0, "p_value": 0.5, "p_value_two_sided": 1.0}
    z = (p2 - p1) / math.sqrt(var)
    upper = 0.5 * math.erfc(z / math.sqrt(2))
    return {"z": z, "p_value": upper, "p_value_two_sided": min(1.0, 2 * min(upper, 1 - upper))}


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (module docstring has the formula).

    ``successes`` may be fractional (graded scores summed). Returns (0.0, 1.0) for ``n == 0``.
    Raises ValueError when ``successes`` is outside [0, n].
    """
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} outside [0, n={n}]")
    p = successes / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    denom = 1 + z2 / n
    return max(0.0, (centre - half) / denom), min(1.0, (centre + half) / denom)


class EvalRow(BaseModel):
    """Summary of the trees of one (mode, difficulty). Means are per tree."""

    mode: str
    difficulty: str
    n: int  # trees
    unscored: int = 0  # roots whose verifier returned None (left out of the rate)
    successes: float = 0.0  # count (binary) or sum of values (graded), over scored roots
    success: float = 0.0  # success rate over scored roots
    ci_low: float = 0.0
    ci_high: float = 1.0
    mean_score: float = 0.0  # mean raw verifier value of scored roots
    mean_depth: float = 0.0  # tree depth (0 = root only)
    delegation_rate: float = 0.0  # fraction of trees with >= 1 child
    mean_nodes: float = 0.0
    mean_tokens: float = 0.0  # generated (assistant) tokens of all nodes of a tree
    mean_context_tokens: float = 0.0  # trajectory tokens (prompt + generated) of all nodes of a tree
    mean_tree_wall_s: float = 0.0
    child_nodes: int = 0  # depth-1 nodes over all trees
    child_success: float | None = None  # mean verifier value of the depth-1 nodes (None: no child)
    parallel_share: float = 0.0  # fraction of depth-1 nodes whose run overlapped a sibling's (asyncio.gather)
    tokens_per_success: float | None = None  # generated tokens of all trees / successes (None: no success)
    wall_s: float = 0.0  # wall-clock of the evaluate_policy call that grew these trees
    end_reasons: dict[str, int] = Field(default_factory=dict)  # root end reasons

    @property
    def scored(self) -> int:
        """Trees whose root was verified: the denominator of ``success`` and of the interval."""
        return self.n - self.unscored

    def summary(self) -> dict[str, Any]:
        """The JSON summary printed by ``rao eval --json``: ``{"n", "successes", "success", "ci95",
        "mean_depth", "delegation_rate", "child_success", "tree_wall_s", "tokens_per_success"}``
        (child_success: depth-1 nodes' mean verifier value, None without children; tokens_per_success: None
        without a success). ``n`` = scored trees (the denominator), ``successes`` = count
        (an int when it is whole) or sum of graded values, ``ci95`` = ``[low, high]`` (Wilson 95%)."""
        succ = int(self.successes) if float(self.successes).is_integer() else round(self.successes, 6)
        return {"n": self.scored, "successes": succ, "success": round(self.success, 6),
                "ci95": [round(self.ci_low, 6), round(self.ci_high, 6)], "mean_depth": round(self.mean_depth, 6),
                "delegation_rate": round(self.delegation_rate, 6),
                "child_success": None if self.child_success is None else round(self.child_success, 6),
                "tree_wall_s": round(self.mean_tree_wall_s, 3),
                "tokens_per_success": None if self.tokens_per_success is None else round(self.tokens_per_success, 1)}

    def table_row(self) -> dict[str, Any]:
        """Rounded row of the pipeline's tables (Prefect artifact, summary, docs/results.md): mode,
        difficulty, n, successes, success, ``ci95`` as ``"[lo, hi]"``, mean_depth, delegation_rate, wall_s,
        child_success (None without children), parallel_share, tree_wall_s, tokens_per_success (None without
        a success)."""
        return {"mode": self.mode, "difficulty": self.difficulty, "n": self.n, "successes": round(self.successes, 4),
                "success": round(self.success, 3), "ci95": f"[{self.ci_low:.2f}, {self.ci_high:.2f}]",
                "mean_depth": round(self.mean_depth, 2), "delegation_rate": round(self.delegation_rate, 2),
                "wall_s": round(self.wall_s, 1),
                "child_success": None if self.child_success is None else round(self.child_success, 3),
                "child_nodes": self.child_nodes, "parallel_share": round(self.parallel_share, 2),
                "tree_wall_s": round(self.mean_tree_wall_s, 1),
                "tokens_per_success": None if self.tokens_per_success is None else round(self.tokens_per_success)}


class EvalReport(BaseModel):
    """Rows per (mode, difficulty); ``trees`` (not serialised) keeps the execution trees."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rows: list[EvalRow] = Field(default_factory=list)
    trees: list[ExecutionTree] = Field(default_factory=list, exclude=True)
    graded: bool = True  # the scoring rule the rows were computed with

    def row(self, mode: str, difficulty: str) -> EvalRow:
        """The row of (mode, difficulty); KeyError naming both if absent."""
        for r in self.rows:
            if r.mode == mode and r.difficulty == difficulty:
                return r
        raise KeyError(f"no evaluation row for mode {mode!r}, difficulty {difficulty!r}")

    def metrics(self) -> dict[str, float]:
        """Flat metrics: ``eval/<mode>/<difficulty>/<name>`` with names ``success``, ``success_ci_low``,
        ``success_ci_high``, ``depth``, ``delegation_rate``, ``nodes``, ``tokens``, ``wall_s``, ``n``,
        ``tree_wall_s`` (mean per tree), ``parallel_share``, and where defined ``child_success`` (depth-1
        nodes) and ``tokens_per_success``."""
        out: dict[str, float] = {}
        for r in self.rows:
            p = f"eval/{r.mode}/{r.difficulty}"
            out.update({f"{p}/success": r.success, f"{p}/success_ci_low": r.ci_low,
                        f"{p}/success_ci_high": r.ci_high, f"{p}/depth": r.mean_depth,
                        f"{p}/delegation_rate": r.delegation_rate, f"{p}/nodes": r.mean_nodes,
                        f"{p}/tokens": r.mean_tokens, f"{p}/wall_s": r.wall_s, f"{p}/n": float(r.n),
                        f"{p}/tree_wall_s": r.mean_tree_wall_s, f"{p}/parallel_share": r.parallel_share})
            if r.child_success is not None:
                out[f"{p}/child_success"] = r.child_success
            if r.tokens_per_success is not None:
                out[f"{p}/tokens_per_success"] = r.tokens_per_success
        return out

    def pooled(self, mode: str) -> EvalRow:
        """One row (difficulty ``"all"``) over every tree of ``mode``, scored with the report's rule.

        Raises KeyError when the report has no tree of ``mode``."""
        trees = [t for t in self.trees if t.meta.get("eval_mode") == mode]
        if not trees:
            raise KeyError(f"no evaluation trees for mode {mode!r}")
        return summarise(trees, mode=mode, difficulty="all", graded=self.graded,
                         wall_s=max(r.wall_s for r in self.rows if r.mode == mode))

    def __add__(self, other: EvalReport) -> EvalReport:
        return EvalReport(rows=self.rows + other.rows, trees=self.trees + other.trees, graded=self.graded)


def summarise(trees: Sequence[ExecutionTree], *, mode: str, difficulty: str, graded: bool = True,
              wall_s: float = 0.0) -> EvalRow:
    """One :class:`EvalRow` from ``trees`` (module docstring: success rule, Wilson interval)."""
    n = len(trees)
    vals = [verifier_value(t.root) for t in trees]
    scored = [v for v in vals if v is not None]
    succ = sum(scored) if graded else float(sum(1 for v in scored if v >= 1.0))
    lo, hi = wilson_interval(min(succ, len(scored)), len(scored))

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    ends = Counter(t.root.end_reason.value for t in trees)
    kids = [x for t in trees for x in t.nodes if x.depth == 1]
    kid_vals = [v for x in kids if (v := verifier_value(x)) is not None]
    tokens = float(sum(x.num_completion_tokens for t in trees for x in t.nodes))
    return EvalRow(
        mode=mode, difficulty=difficulty, n=n, unscored=n - len(scored), successes=succ,
        success=succ / len(scored) if scored else 0.0, ci_low=lo, ci_high=hi, mean_score=mean(scored),
        mean_depth=mean([float(t.depth) for t in trees]),
        delegation_rate=mean([1.0 if len(t.nodes) > 1 else 0.0 for t in trees]),
        mean_nodes=mean([float(len(t.nodes)) for t in trees]),
        mean_tokens=mean([float(sum(x.num_completion_tokens for x in t.nodes)) for t in trees]),
        mean_context_tokens=mean([float(sum(len(x.token_ids) for x in t.nodes)) for t in trees]),
        mean_tree_wall_s=mean([t.wall_s for t in trees]), wall_s=wall_s, end_reasons=dict(sorted(ends.items())),
        child_nodes=len(kids), child_success=mean(kid_vals) if kid_vals else None,
        parallel_share=parallel_share(trees), tokens_per_success=tokens / succ if succ > 0 else None,
    )


async def evaluate_policy(env: Environment, tasks: Sequence[Task], policy: Policy, runtime_config: RuntimeConfig,
                          *, tokenizer: Any, mode: Mode, graded: bool = True, progress: Any = None) -> EvalReport:
    """Grow one execution tree per task with ``policy`` and summarise per difficulty.

    Args:
        env: the environment (its verifier scores the roots).
        tasks: evaluation tasks; rows are grouped by ``task.difficulty`` ("" becomes "all").
        policy: any policy (endpoint or scripted).
        runtime_config: limits; ``delegation`` is forced on for ``mode='recursive'`` and off for
            ``mode='single'`` (everything else, context window included, is kept).
        tokenizer: HF tokenizer or checkpoint folder (chat template of the served model).
        mode: 'recursive' | 'single'.
        graded: success rate = mean verifier value (default) instead of the fraction >= 1.
        progress: passed to ``run_trees`` (callback or True for a progress bar).

    Returns:
        :class:`EvalReport` with one row per difficulty (in first-seen order) and the trees.

    Raises:
        ValueError: no tasks, or an unknown mode.
    """
    cfg = mode_runtime(runtime_config, mode)
    if not tasks:
        raise ValueError("evaluate_policy needs at least one task")
    t0 = time.perf_counter()
    trees = await run_trees(env, [(t, 1) for t in tasks], policy, cfg, tokenizer=tokenizer, progress=progress)
    return report_from_trees(tasks, trees, mode=mode, graded=graded, wall_s=time.perf_counter() - t0)


def report_from_trees(tasks: Sequence[Task], trees: Sequence[ExecutionTree], *, mode: Mode, graded: bool = True,
                      wall_s: float = 0.0) -> EvalReport:
    """The :class:`EvalReport` of one mode from its trees, ``trees[i]`` grown for ``tasks[i]`` (one each, in
    order: :func:`evaluate_policy`, or the shards of ``tasks.rollouts``): one row per difficulty in first-seen
    order (``""`` becomes ``"all"``), ``wall_s`` the seconds the trees took (every row's ``wall_s``). Sets
    each tree's ``meta`` ``eval_mode`` and ``difficulty``. Raises ValueError when the counts differ."""
    if len(tasks) != len(trees):
        raise ValueError(f"{len(trees)} trees for {len(tasks)} evaluation tasks")
    by_diff: dict[str, list[ExecutionTree]] = {}
    for task, tree in zip(tasks, trees):
        tree.meta["eval_mode"] = mode
        tree.meta["difficulty"] = task.difficulty or "all"
        by_diff.setdefault(task.difficulty or "all", []).append(tree)
    rows = [summarise(ts, mode=mode, difficulty=d, graded=graded, wall_s=wall_s) for d, ts in by_diff.items()]
    return EvalReport(rows=rows, trees=list(trees), graded=graded)


def eval_tasks(env: Environment, config: EvalConfig, **generator_options: Any) -> list[Task]:
    """The evaluation tasks of ``config``: ``n_tasks`` per difficulty from ``split``, drawn by
    :func:`rao_core.task_sampling.sample_tasks` from stream ``"eval"`` with ``config.seed`` (a difficulty's
    tasks do not depend on the other difficulties listed). ``generator_options`` go to ``generate_tasks``."""
    from rao_core.task_sampling import sample_tasks

    return sample_tasks(env, seed=config.seed, stream="eval", difficulties=config.difficulties, n=config.n_tasks,
                        split=config.split, **generator_options)


async def evaluate_suite(config: EvalConfig, *, env: Environment | str, runtime: RuntimeConfig, tokenizer: Any,
                         tasks: Sequence[Task] | None = None, policy: Policy | None = None,
                         base_url: str | None = None, model: str = "policy", close_policy: bool = False,
                         progress: Any = None) -> EvalReport:
    """Evaluate a policy on held-out tasks in every mode of ``config`` (modes in turn, all tasks at once).

    Args:
        config: :class:`EvalConfig` (or the campaign's ``eval`` section, a subclass).
        env: the environment or its name (``rao_core.envs.get_env``).
        runtime: the agent's limits (the RL rollouts' ``RuntimeConfig``); ``delegation`` is set per mode.
        tokenizer: HF tokenizer or checkpoint folder (chat template of the evaluated model).
        tasks: the tasks (e.g. a task file); None = :func:`eval_tasks` of ``config``.
        policy: the policy; None = an ``OpenAIPolicy(base_url, model)`` with the runtime's temperature,
            top_p and ``policy_timeout_s`` (closed at the end).
        close_policy: also close a given ``policy`` at the end (callers that run this in ``asyncio.run``).
        progress: passed to ``run_trees`` (callback or True for a progress bar).

    Returns:
        One report with a row per (mode, difficulty), modes in config order; ``report.pooled(mode)``
        summarises a mode over all difficulties.

    Raises:
        ValueError: neither ``policy`` nor ``base_url``, no tasks, or an unknown environment.
    """
    from rao_core.envs import get_env

    env = get_env(env) if isinstance(env, str) else env
    tasks = list(tasks) if tasks is not None else eval_tasks(env, config)
    own = policy is None
    if policy is None:
        if not base_url:
            raise ValueError("evaluate_suite needs a policy or the base_url of a served model")
        from rao_core.policies.openai_policy import OpenAIPolicy

        policy = OpenAIPolicy(base_url, model, temperature=runtime.temperature, top_p=runtime.top_p,
                              request_timeout_s=runtime.policy_timeout_s)
    report = EvalReport(graded=config.graded)
    try:
        for mode in config.modes:
            report = report + await evaluate_policy(env, tasks, policy, runtime, tokenizer=tokenizer, mode=mode,
                                                    graded=config.graded, progress=progress)
    finally:
        if own or close_policy:
            await policy.aclose()
    return report


def run_evaluation(config: EvalConfig, **kwargs: Any) -> EvalReport:
    """:func:`evaluate_suite` from synchronous code (its own event loop; a given ``policy`` is closed at
    the end). Same arguments and errors; call it from a thread without a running event loop."""
    kwargs.setdefault("close_policy", True)
    return asyncio.run(evaluate_suite(config, **kwargs))


def compare(report: EvalReport | dict[str, float], champion_metrics: dict[str, float], tolerance: float
            ) -> list[str]:
    """Regressions of ``report`` against a champion: success rates that dropped by more than ``tolerance``.

    Compares every ``eval/<mode>/<difficulty>/success`` key present in both (extra keys on either side
    are ignored). Returns one message per regression, e.g.
    ``"eval/recursive/medium/success: 0.400 < champion 0.600 - tolerance 0.050"``; empty when none.
    Raises ValueError for a negative tolerance.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    new = report.metrics() if isinstance(report, EvalReport) else dict(report)
    out = []
    for k in sorted(new):
        if not k.endswith("/success") or k not in champion_metrics:
            continue
        old = float(champion_metrics[k])
        if new[k] < old - tolerance - 1e-12:
            out.append(f"{k}: {new[k]:.3f} < champion {old:.3f} - tolerance {tolerance:.3f}")
    return out


def render_report(report: EvalReport, console: Any = None, title: str = "Evaluation") -> Any:
    """Print the report as a rich table (to ``console`` or a new one); returns the ``rich.table.Table``."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("mode", "difficulty", "n", "success", "95% CI", "depth", "delegation", "nodes", "tokens",
                "wall s", "root ends"):
        table.add_column(col, justify="left" if col in ("mode", "difficulty", "root ends") else "right")
    for r in report.rows:
        table.add_row(r.mode, r.difficulty, str(r.n) + (f" ({r.unscored} unscored)" if r.unscored else ""),
                      f"{r.success:.3f}", f"[{r.ci_low:.2f}, {r.ci_high:.2f}]", f"{r.mean_depth:.2f}",
                      f"{r.delegation_rate:.2f}", f"{r.mean_nodes:.1f}", f"{r.mean_tokens:.0f}",
                      f"{r.wall_s:.1f}", ", ".join(f"{k} {v}" for k, v in r.end_reasons.items()))
    (console or Console()).print(table)
    return table

