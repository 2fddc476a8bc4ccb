"""Evaluation of a policy on held-out RL tasks: recursive agent vs single-agent baseline, benchmark by benchmark.

:func:`evaluate_suite` is the one evaluation of the project (``rao eval``, the campaign's and the experiment's
evaluation after each iteration, the nightly regression): :func:`evaluate_policy` once per mode with the RL
rollouts' runtime limits (``single`` = the same runtime with ``delegation=False``, docs/concepts.md; the tree's
limit counts its own time: :func:`mode_runtime`). A campaign and the nightly evaluate a suite of
:class:`Benchmark` entries (an environment and its :class:`EvalSpec`; the standard four:
:data:`STANDARD_BENCHMARKS`), one :func:`evaluate_suite` call each, whose rows and metric keys name the benchmark
(:func:`metric_key`: ``eval/<benchmark>/<mode>/<difficulty>/success``). :func:`eval_tasks` draws the held-out
tasks, :func:`summarise` makes one audit-ready :class:`EvalRow` per (mode, difficulty), :func:`compare` flags
success rates that dropped against a champion's. Success of a tree = the root's verifier value (graded mean or
exact solves).

Departures from the paper: it reports success rates without intervals, this project adds Wilson 95% intervals
(:func:`wilson_interval`) and one cause per missed task (:func:`miss_cause`; the paper attributes no failure).
Docs: docs/pipeline/evaluation.md#evaluation.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rao_core.envs.base import Environment, Task
from rao_core.metrics import parallel_share
from rao_core.policies.base import Policy
from rao_core.runtime import RuntimeConfig, run_trees
from rao_core.tree import EndReason, ExecutionTree, Node, verifier_value

__all__ = ["BENCHMARK_NAME_PATTERN", "COMPACT_MAX_CHARS", "MISS_CAUSES", "SAMPLE_MAX_CHARS", "STANDARD_BENCHMARKS",
           "STORED_TREES", "Benchmark", "DevSet", "EvalConfig", "EvalRow", "EvalReport", "EvalSpec", "Mode",
           "benchmark_name", "compact_tree", "compare", "depth_stats", "dev_tasks", "eval_tasks", "evaluate_policy",
           "evaluate_suite", "legacy_key", "metric_key", "miss_cause", "miss_counts", "mode_runtime", "named_key",
           "render_report", "report_from_trees", "run_evaluation", "summarise", "tree_sample", "wilson_interval",
           "Z95"]

Mode = Literal["recursive", "single"]
Z95 = 1.959963984540054  # two-sided 95% normal quantile
STORED_TREES = 10  # evaluated trees kept per (mode, difficulty) row by default (EvalConfig.stored_trees)
COMPACT_MAX_CHARS = 4000  # longest text, code, observation or goal a compact tree keeps (compact_tree)
SAMPLE_MAX_CHARS = 400_000  # JSON characters of one row's compact trees at most (tree_sample; ~60 KB gzipped)
#: Primary causes of a missed task, in order of precedence (:func:`miss_cause`).
MISS_CAUSES = ("child_two_targets", "child_failed", "window", "limit", "error", "finished_wrong", "other")
_CHILD_OWN_ENDS = frozenset({EndReason.FINISHED, EndReason.MAX_STEPS, EndReason.CONTEXT_OVERFLOW})
_TREE_LIMIT_ENDS = frozenset({EndReason.TREE_STEP_BUDGET, EndReason.TREE_TIMEOUT})
_INFRA_ENDS = frozenset({EndReason.POLICY_ERROR, EndReason.SANDBOX_ERROR, EndReason.TOKEN_PREFIX_BREAK})


class EvalSpec(BaseModel):
    """What one evaluation measures: which held-out tasks, which modes, how roots are scored. The fields shared
    by :class:`EvalConfig` (a campaign's evaluation schedule added) and :class:`Benchmark` (an environment
    added)."""

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
    stored_trees: int = Field(STORED_TREES, ge=0, description="Evaluated execution trees kept per (mode, "
                              "difficulty) row, made small (compact_tree: no token ids or log-probs, long texts "
                              "cut) and at most SAMPLE_MAX_CHARS of JSON: failures and successes alternately, in "
                              "task order (tree_sample); the experiment stores them beside its record. 0: none.")

    @field_validator("difficulties", "modes")
    @classmethod
    def _nonempty(cls, v: list) -> list:
        if not v:
            raise ValueError("must list at least one entry")
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate entries in {v}")
        return v


class EvalConfig(EvalSpec):
    """What an evaluation measures (:class:`EvalSpec`) and, for a campaign, after which iterations (``every``).

    The campaign's ``eval`` section (``rao_core.config.EvalSettings``) is this model plus pipeline fields and
    the suite's other benchmarks; ``rao eval`` builds one from its options. How the agent runs (context window,
    limits, temperature) is the caller's ``RuntimeConfig``, the same as in the RL rollouts.
    """

    every: int = Field(1, ge=1, description="A campaign evaluates its held-out set after iteration 0 (the starting "
                       "checkpoint), after every iteration k with k % every == 0, and after the last iteration "
                       "(evaluates); the others grow no evaluation tree: their checkpoint is registered but never "
                       "champion, the collapse guard does not judge them and they have no point on the learning "
                       "curve. 1: after every iteration.")

    def evaluates(self, iteration: int, iterations: int) -> bool:
        """Whether a campaign of ``iterations`` RL iterations evaluates after iteration ``iteration``: iteration
        0, every multiple of ``every``, and the last one."""
        return iteration == 0 or iteration % self.every == 0 or iteration >= iterations

    def evaluated_iterations(self, iterations: int) -> list[int]:
        """The iterations a campaign of ``iterations`` RL iterations evaluates after (:meth:`evaluates`),
        ascending: ``every`` 6 of 12 gives [0, 6, 12], ``every`` 2 of 5 gives [0, 2, 4, 5]."""
        return [k for k in range(iterations + 1) if self.evaluates(k, iterations)]

    def next_evaluated(self, iteration: int, iterations: int) -> int:
        """The first iteration after ``iteration`` that is evaluated (:meth:`evaluates`); ``iterations`` past
        the last one."""
        return min((iteration // self.every + 1) * self.every, max(iterations, iteration + 1))


#: A benchmark's name: the second part of its MLflow keys (``eval/<name>/<mode>/<difficulty>/success``).
BENCHMARK_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"

#: The standard suite: benchmark name -> its environment and the difficulties evaluated by default, each
#: generated offline and verified exactly (docs/environments.md): TextCraft-Synth's CPU-sized level ``tier1``,
#: Oolong's one-transcript counting questions (``singledoc_rolls``; ``mixed`` would draw the four question types in
#: turn, each its own row), DeepDive's 1-2 hop questions, ART-E's plainest phrasing: the cheapest level of each on
#: the CPU. Every other field of an entry (n_tasks, seed, split, modes, grading) is the evaluation's own.
STANDARD_BENCHMARKS: dict[str, dict[str, Any]] = {
    "textcraft": {"env": "textcraft-synth", "difficulties": ["tier1"]},
    "oolong": {"env": "oolong", "difficulties": ["singledoc_rolls"]},
    "deepdive": {"env": "deepdive", "difficulties": ["easy"]},
    "arte": {"env": "arte", "difficulties": ["easy"]},
}


def benchmark_name(env: str) -> str:
    """The benchmark name of environment ``env`` (a registry name, alias or import path): the standard
    suite's name when it is one of its environments (``textcraft-synth`` -> ``textcraft``, ``arte-synth`` ->
    ``arte``), else the environment's registry name in lower case with characters outside
    ``[a-z0-9_-]`` made ``-``."""
    import re

    from rao_core.envs import canonical_name

    canonical = canonical_name(env)
    for name, spec in STANDARD_BENCHMARKS.items():
        if canonical_name(spec["env"]) == canonical:
            return name
    return re.sub(r"[^a-z0-9_-]", "-", canonical.lower()).strip("-_") or "env"


class Benchmark(EvalSpec):
    """One benchmark of an evaluation suite: an environment (with its options) and what of it is evaluated
    (:class:`EvalSpec`). Its ``name`` is the second part of its metric keys
    (``eval/<name>/<mode>/<difficulty>/success``); unset, it is :func:`benchmark_name` of ``env``."""

    name: str = Field("", description="The benchmark's name in metric keys (eval/<name>/<mode>/<difficulty>/...); "
                      "empty: the environment's (textcraft-synth -> textcraft, oolong, deepdive, arte).")
    env: str = Field("textcraft-synth", description="Environment, e.g. textcraft-synth, oolong, deepdive, arte.")
    env_options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the environment "
                                        "(e.g. ART-E's reward).")
    generator_options: dict[str, Any] = Field(default_factory=dict, description="Extra options of the task "
                                              "generator (e.g. Oolong's target_tokens).")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        import re

        if v and not re.fullmatch(BENCHMARK_NAME_PATTERN, v):
            raise ValueError(f"{v!r} is not a benchmark name (lowercase letters, digits, '-' and '_')")
        return v

    @model_validator(mode="after")
    def _named(self) -> Benchmark:
        if not self.name:
            self.name = benchmark_name(self.env)
        return self

    def spec(self) -> dict[str, Any]:
        """What the benchmark's tasks and outcomes depend on besides the policy and the runtime, as plain
        values: environment, its options, generator options, difficulties, n_tasks, seed, split, modes,
        grading (the nightly's stored-outcome key, ``flows.evaluate.evaluation_key``)."""
        return {"env": self.env, "env_options": self.env_options, "generator_options": self.generator_options,
                "difficulties": self.difficulties, "n_tasks": self.n_tasks, "seed": self.seed, "split": self.split,
                "modes": self.modes, "graded": self.graded}


def metric_key(benchmark: str, mode: str, difficulty: str, name: str = "success") -> str:
    """``eval/<benchmark>/<mode>/<difficulty>/<name>``; without a benchmark (``rao eval`` of a task file, the
    checkpoint studies) ``eval/<mode>/<difficulty>/<name>``."""
    return f"eval/{benchmark}/{mode}/{difficulty}/{name}" if benchmark else f"eval/{mode}/{difficulty}/{name}"


def legacy_key(key: str) -> str | None:
    """The key an evaluation recorded before metric keys named their benchmark: ``eval/<b>/<mode>/<d>/<name>``
    -> ``eval/<mode>/<d>/<name>`` (campaigns evaluated only their training benchmark then); None for a key of
    another shape."""
    parts = key.split("/")
    if len(parts) == 5 and parts[0] == "eval" and parts[2] in ("recursive", "single"):
        return "/".join([parts[0], *parts[2:]])
    return None


def named_key(key: str, benchmark: str) -> str:
    """``key`` with its benchmark: a legacy ``eval/<mode>/<d>/<name>`` key (:func:`legacy_key`'s output, e.g.
    an explicit ``eval.primary_metric`` written before) becomes ``eval/<benchmark>/<mode>/<d>/<name>``; any
    other key is returned as is."""
    parts = key.split("/")
    if len(parts) == 4 and parts[0] == "eval" and parts[1] in ("recursive", "single"):
        return metric_key(benchmark, parts[1], parts[2], parts[3])
    return key


class DevSet(BaseModel):
    """The development set: held-out tasks for design decisions (probes of first replies, choosing a window,
    a learning rate, a step count), so the evaluation set is looked at only by the preregistered runs
    (``docs/experiments`` habits: three sets of tasks, never mixed, each with its own seed). Drawn by
    :func:`dev_tasks`: the evaluation's difficulties and split, stream ``"dev"``, its own seed, and never a
    task of the evaluation set (same target multiset for TextCraft: ``rao_core.task_sampling.task_identity``)."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(description="Seed of the development tasks (stream 'dev'); must differ from eval.seed.")
    n_tasks: int = Field(20, ge=1, description="Development tasks per difficulty.")


def mode_runtime(runtime: RuntimeConfig, mode: Mode) -> RuntimeConfig:
    """``runtime`` with ``delegation`` on (``mode='recursive'``) or off (``'single'``) and ``tree_clock``
    ``'auto'`` resolved to ``'own'`` (an evaluation tree's limit counts its own time, not its wait on a server
    slowed by other load: ``rao_core.runtime.agent``, "Tree limits"; an explicit ``'wall'`` or ``'own'`` is
    kept; ``agent.tree_clock`` reads ``'auto'`` the same way, and writing it here keeps the clock in the runtime
    that keys the nightly's stored outcomes), everything else kept (context window included); re-validated. Raises ValueError for another mode."""
    if mode not in ("recursive", "single"):
        raise ValueError(f"mode must be 'recursive' or 'single', got {mode!r}")
    clock = "own" if runtime.tree_clock == "auto" else runtime.tree_clock
    return RuntimeConfig.model_validate({**runtime.model_dump(), "delegation": mode == "recursive",
                                         "tree_clock": clock})


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
    """Wilson score interval of a proportion at level ``z`` (Wilson 1927, "Probable inference, the law of
    succession, and statistical inference", JASA 22(158)), with ``p = successes / n``::

        (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n),   z = 1.959964 (95%)

    ``successes`` may be fractional (graded scores summed: the mean is plugged in as p, an approximation). (graded scores summed). Returns (0.0, 1.0) for ``n == 0``.
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
    """Summary of the trees of one (mode, difficulty) of a benchmark. Means are per tree."""

    benchmark: str = ""  # the suite's benchmark (Benchmark.name); "": none named (a task file, a study)
    mode: str
    difficulty: str
    n: int  # trees
    distinct_problems: int | None = None  # distinct problems among the trees' tasks (task_identity; task ids
    # name draws, not problems); None where the tasks were not given (summarise from trees alone)
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
    # what a record needs to recompute every sentence written about it (summarise)
    per_task: dict[str, float | None] = Field(default_factory=dict)  # task id -> root outcome: 1/0 (graded: the
    # verifier value), None when unscored; with graded=False the outcome is 1 for a value >= 1, else 0
    tokens_total: int = 0  # generated (assistant) tokens of all nodes of all trees
    median_tree_wall_s: float = 0.0
    children_per_tree: dict[str, int] = Field(default_factory=dict)  # the root's children -> trees
    depth_hist: dict[str, int] = Field(default_factory=dict)  # tree depth (0 = root only) -> trees
    per_depth: dict[str, dict[str, Any]] = Field(default_factory=dict)  # depth -> depth_stats(...)
    misses: dict[str, int] = Field(default_factory=dict)  # miss_counts(...): cause -> missed scored roots
    sample: list[ExecutionTree] = Field(default_factory=list, exclude=True)  # tree_sample(...): compact trees

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
        """Rounded row of the pipeline's tables (Prefect artifact, summary, docs/results.md): benchmark (only
        when named), mode, difficulty, n, unscored, successes, success, ``ci95`` as ``"[lo, hi]"``, mean_depth,
        delegation_rate, wall_s, child_success (None without children), child_nodes, parallel_share, tree_wall_s
        (mean) and tree_wall_s_median, tokens_per_tree (mean completion tokens) and tokens_total; then the audit fields
        of the experiment's record: end_reasons, children_per_tree, depth_hist, per_depth, per_task, misses
        (:func:`miss_counts`), distinct_problems, and ``trees`` (the compact sample as JSON objects; absent when empty). Tokens per solved task are no
        longer a column (they restate the success rate)."""
        row = {"benchmark": self.benchmark} if self.benchmark else {}
        row |= {"mode": self.mode, "difficulty": self.difficulty, "n": self.n, "unscored": self.unscored,
               "successes": round(self.successes, 4), "success": round(self.success, 3),
               "ci95": f"[{self.ci_low:.2f}, {self.ci_high:.2f}]", "mean_depth": round(self.mean_depth, 2),
               "delegation_rate": round(self.delegation_rate, 2), "wall_s": round(self.wall_s, 1),
               "child_success": None if self.child_success is None else round(self.child_success, 3),
               "child_nodes": self.child_nodes, "parallel_share": round(self.parallel_share, 2),
               "tree_wall_s": round(self.mean_tree_wall_s, 1), "tree_wall_s_median": round(self.median_tree_wall_s, 1),
               "tokens_per_tree": round(self.mean_tokens, 1), "tokens_total": self.tokens_total,
               "end_reasons": dict(self.end_reasons), "children_per_tree": dict(self.children_per_tree),
               "depth_hist": dict(self.depth_hist), "per_depth": {d: dict(v) for d, v in self.per_depth.items()},
               "per_task": dict(self.per_task), "misses": dict(self.misses),
               "distinct_problems": self.distinct_problems}
        if self.sample:
            row["trees"] = [t.model_dump(mode="json") for t in self.sample]
        return row


class EvalReport(BaseModel):
    """Rows per (benchmark, mode, difficulty); ``trees`` (not serialised) keeps the execution trees."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rows: list[EvalRow] = Field(default_factory=list)
    trees: list[ExecutionTree] = Field(default_factory=list, exclude=True)
    graded: bool = True  # the scoring rule the rows were computed with

    def row(self, mode: str, difficulty: str, benchmark: str | None = None) -> EvalRow:
        """The row of (mode, difficulty) (of ``benchmark`` when given); KeyError naming them if absent."""
        for r in self.rows:
            if r.mode == mode and r.difficulty == difficulty and benchmark in (None, r.benchmark):
                return r
        of = f" of benchmark {benchmark!r}" if benchmark is not None else ""
        raise KeyError(f"no evaluation row for mode {mode!r}, difficulty {difficulty!r}{of}")

    def named(self, benchmark: str) -> EvalReport:
        """This report with every row (and tree's ``meta["benchmark"]``) of benchmark ``benchmark``."""
        for t in self.trees:
            t.meta["benchmark"] = benchmark
        return self.model_copy(update={"rows": [r.model_copy(update={"benchmark": benchmark}) for r in self.rows]})

    def metrics(self) -> dict[str, float]:
        """Flat metrics: ``eval/<benchmark>/<mode>/<difficulty>/<name>`` (:func:`metric_key`; without
        ``<benchmark>/`` for rows of no named benchmark) with names ``success``, ``success_ci_low``,
        ``success_ci_high`` (its Wilson 95% interval), ``depth``, ``delegation_rate``, ``nodes``, ``tokens``,
        ``wall_s``, ``n``, ``tree_wall_s`` (mean per tree), ``parallel_share``, and where defined
        ``child_success`` (depth-1 nodes) and ``tokens_per_success``."""
        out: dict[str, float] = {}
        for r in self.rows:
            p = "/".join(["eval", *([r.benchmark] if r.benchmark else []), r.mode, r.difficulty])
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


def _whole(v: float | None) -> float | int | None:
    """``v`` as an int when it is whole (0/1 outcomes print as 0 and 1), else unchanged."""
    return int(v) if v is not None and float(v).is_integer() else v


def _histogram(values: Sequence[int]) -> dict[str, int]:
    """``{value: count}`` in increasing value order, keys as strings (as JSON writes them)."""
    return {str(k): c for k, c in sorted(Counter(values).items())}


def depth_stats(trees: Sequence[ExecutionTree]) -> dict[str, dict[str, Any]]:
    """Per depth d (keys ``"0"``, ``"1"``, ...), over every node at depth d of ``trees``: ``nodes``,
    ``scored`` (nodes with a verifier value), ``success`` (mean verifier value of the scored ones; None
    without any), ``delegation_rate`` (share of the nodes that launched >= 1 child), ``children_per_node``
    (mean children over all the nodes, 0 included) and ``end_reasons`` ({reason: nodes})."""
    by_depth: dict[int, list[tuple[ExecutionTree, Node]]] = {}
    for t in trees:
        for x in t.nodes:
            by_depth.setdefault(x.depth, []).append((t, x))
    out: dict[str, dict[str, Any]] = {}
    for d, pairs in sorted(by_depth.items()):
        vals = [v for _, x in pairs if (v := verifier_value(x)) is not None]
        kids = [len(t.children_of(x.node_id)) for t, x in pairs]
        out[str(d)] = {"nodes": len(pairs), "scored": len(vals),
                       "success": round(sum(vals) / len(vals), 6) if vals else None,
                       "delegation_rate": round(sum(1 for k in kids if k) / len(kids), 6),
                       "children_per_node": round(sum(kids) / len(kids), 6),
                       "end_reasons": dict(sorted(Counter(x.end_reason.value for _, x in pairs).items()))}
    return out


def _target_count(node: Node) -> int:
    """How many targets ``node``'s structured goal names (``goal_args["targets"]``: a dict or a list); 0
    without any."""
    targets = node.goal_args.get("targets")
    return len(targets) if isinstance(targets, (dict, list, tuple)) else 0


def _child_failed(node: Node) -> bool:
    """True when a child ended by its own doing (finished, max_steps, context_overflow) without succeeding:
    verifier value < 1, or no value and not finished."""
    if node.end_reason not in _CHILD_OWN_ENDS:
        return False
    value = verifier_value(node)
    return value < 1.0 if value is not None else not node.finished


def miss_cause(tree: ExecutionTree) -> str | None:
    """The primary cause (one of :data:`MISS_CAUSES`) of ``tree``'s miss; None when the root succeeded (value
    >= 1) or could not be verified (unscored: not a miss). Reads only the tree (its root, its depth-1 children and
    every node's end reason). A project addition (the paper does not attribute failures): the first that holds of

    1. ``child_two_targets``: the root gave a depth-1 child two or more targets (``goal_args["targets"]`` with
       >= 2 items; in the ``tier1x<K>`` shape one child per target is what fits a window) and that child failed
       by its own doing (as in 2.); a two-target child that succeeded is not a cause;
    2. ``child_failed``: a depth-1 child ended by its own doing (finished, max_steps or context_overflow) without
       succeeding (verifier < 1, or no value and not finished). Children cut by the tree's limits, by an
       infrastructure error or by cancellation are not counted here: their cause is the tree's (below). This
       departs from the plain rule "a depth-1 node with verifier < 1" so that a timeout is not read as a
       child's failure. Nor is a failed child that the root relaunched with success: a later depth-1 sibling
       with the same targets (or, without targets, the same goal) that succeeded delivered its part (1. too);
    3. ``window``: the root ended by its context window (``context_overflow``);
    4. ``limit``: the root ended by a step or time limit (``max_steps``, ``tree_step_budget``,
       ``tree_timeout``), or some node was cut by the tree's budget or wall-clock limit;
    5. ``error``: an infrastructure failure (the root ended ``policy_error``, ``sandbox_error``,
       ``token_prefix_break`` or ``cancelled``, any node ended by one of the first three, or the rollout crashed:
       ``tree.error``);
    6. ``finished_wrong``: the root called finish with every child fine and its targets not crafted;
    7. ``other``: anything else (a root still ``running``; not expected in a finished tree).
    """
    value = verifier_value(tree.root)
    if value is None or value >= 1.0:
        return None
    root, kids = tree.root, tree.children_of(tree.root_id)

    def part(k: Node) -> object:
        targets = k.goal_args.get("targets")
        return repr(targets) if targets else k.goal

    def ok(k: Node) -> bool:
        v = verifier_value(k)
        return v is not None and v >= 1.0

    # a failure a later relaunch of the same part made good is not a cause
    failed = [k for j, k in enumerate(kids)
              if _child_failed(k) and not any(part(x) == part(k) and ok(x) for x in kids[j + 1:])]
    if any(_target_count(k) >= 2 for k in failed):
        return "child_two_targets"
    if failed:
        return "child_failed"
    if root.end_reason == EndReason.CONTEXT_OVERFLOW:
        return "window"
    if root.end_reason == EndReason.MAX_STEPS or any(x.end_reason in _TREE_LIMIT_ENDS for x in tree.nodes):
        return "limit"
    if (tree.error or root.end_reason == EndReason.CANCELLED
            or any(x.end_reason in _INFRA_ENDS for x in tree.nodes)):
        return "error"
    if root.finished:
        return "finished_wrong"
    return "other"


def miss_counts(trees: Sequence[ExecutionTree]) -> dict[str, int]:
    """``{cause: missed roots}`` of :func:`miss_cause` over ``trees``, causes in :data:`MISS_CAUSES` order,
    only those that occur (empty when nothing missed); the counts sum to the scored roots below 1."""
    counts = Counter(c for t in trees if (c := miss_cause(t)) is not None)
    return {c: counts[c] for c in MISS_CAUSES if counts[c]}


def summarise(trees: Sequence[ExecutionTree], *, mode: str, difficulty: str, graded: bool = True,
              wall_s: float = 0.0, keep_trees: int = 0, max_sample_chars: int = SAMPLE_MAX_CHARS) -> EvalRow:
    """One :class:`EvalRow` from ``trees``; ``keep_trees``: trees of :func:`tree_sample` kept in ``sample`` (at
    most ``max_sample_chars`` of JSON).

    Success of a tree = the root node's exact verifier value ``root.verifier`` (stored by the runtime). Graded
    scoring (``graded=True``, the default): the success rate is the mean of the values, so Oolong's partial credit
    (0.75^|delta|) and ART-E's ladder are kept; for verifiers that return 0 or 1 (TextCraft, DeepDive, ART-E
    binary) it equals the fraction solved. ``graded=False``: the fraction of roots with value ``>= 1.0`` (exact
    solves only). Roots that could not be verified (value None) are counted in ``unscored`` and left out of the
    rate and of its Wilson interval (:func:`wilson_interval`).

    What a row keeps so a reader can audit it (``docs/results/*.json``): the outcome of every task (``per_task``,
    for paired tests), root end reasons, completion tokens per tree (mean and total; not tokens per solved task,
    which restates the success rate), wall-clock per tree (mean and median), the histograms of children per tree
    and of tree depth, per-depth node statistics, a bounded sample of its trees made small by :func:`compact_tree`
    (:func:`tree_sample`: failures and successes alternately, in task order), and why each missed task missed
    (``misses``: :func:`miss_cause` over the scored roots with a value below 1).
    """
    n = len(trees)
    vals = [verifier_value(t.root) for t in trees]
    scored = [v for v in vals if v is not None]
    succ = sum(scored) if graded else float(sum(1 for v in scored if v >= 1.0))
    lo, hi = wilson_interval(min(succ, len(scored)), len(scored))

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    def outcome(v: float | None) -> float | int | None:
        return _whole(v if graded or v is None else float(v >= 1.0))

    ends = Counter(t.root.end_reason.value for t in trees)
    kids = [x for t in trees for x in t.nodes if x.depth == 1]
    kid_vals = [v for x in kids if (v := verifier_value(x)) is not None]
    per_tree = [sum(x.num_completion_tokens for x in t.nodes) for t in trees]
    tokens = float(sum(per_tree))
    walls = [t.wall_s for t in trees]
    return EvalRow(
        mode=mode, difficulty=difficulty, n=n, unscored=n - len(scored), successes=succ,
        success=succ / len(scored) if scored else 0.0, ci_low=lo, ci_high=hi, mean_score=mean(scored),
        mean_depth=mean([float(t.depth) for t in trees]),
        delegation_rate=mean([1.0 if len(t.nodes) > 1 else 0.0 for t in trees]),
        mean_nodes=mean([float(len(t.nodes)) for t in trees]),
        mean_tokens=mean([float(k) for k in per_tree]),
        mean_context_tokens=mean([float(sum(len(x.token_ids) for x in t.nodes)) for t in trees]),
        mean_tree_wall_s=mean(walls), wall_s=wall_s, end_reasons=dict(sorted(ends.items())),
        child_nodes=len(kids), child_success=mean(kid_vals) if kid_vals else None,
        parallel_share=parallel_share(trees), tokens_per_success=tokens / succ if succ > 0 else None,
        per_task={t.task_id: outcome(v) for t, v in zip(trees, vals)}, tokens_total=int(tokens),
        median_tree_wall_s=statistics.median(walls) if walls else 0.0,
        children_per_tree=_histogram([len(t.children_of(t.root_id)) for t in trees]),
        depth_hist=_histogram([t.depth for t in trees]), per_depth=depth_stats(trees), misses=miss_counts(trees),
        sample=tree_sample(trees, keep_trees, max_chars=max_sample_chars) if keep_trees else [],
    )


def compact_tree(tree: ExecutionTree, max_chars: int = COMPACT_MAX_CHARS) -> ExecutionTree:
    """A small copy of ``tree`` to store beside a record: every node keeps its goal, turns (text, code cell,
    observation, cell status, timings), result, end reason, error, verifier value and timings; the token id
    and log-prob arrays (of nodes and turns) and the chat view (``messages``: the system prompt and the turns
    again) are emptied, and a text, code cell, observation or goal longer than ``max_chars`` keeps its first
    ``max_chars`` characters and says how many were cut. ``meta["compact"]`` names what was stripped and
    keeps each node's completion and trajectory token counts (``{node_id: tokens}``). ``tree`` is not changed;
    the copy is a valid :class:`ExecutionTree` (``model_validate`` reads it back)."""
    def cut(text: str | None) -> str | None:
        if text is None or len(text) <= max_chars:
            return text
        return f"{text[:max_chars]}... [{len(text) - max_chars} characters cut]"

    nodes = []
    for x in tree.nodes:
        turns = [t.model_copy(update={"prompt_token_ids": [], "completion_token_ids": [], "completion_logprobs": [],
                                      "text": cut(t.text), "code": cut(t.code), "observation": cut(t.observation)})
                 for t in x.turns]
        nodes.append(x.model_copy(update={"turns": turns, "token_ids": [], "assistant_mask": [],
                                          "behaviour_logprobs": [], "messages": [], "goal": cut(x.goal)}))
    compact = {"stripped": ["token_ids", "assistant_mask", "behaviour_logprobs", "messages",
                            "turns[].prompt_token_ids", "turns[].completion_token_ids", "turns[].completion_logprobs"],
               "max_chars": max_chars,
               "completion_tokens": {x.node_id: x.num_completion_tokens for x in tree.nodes},
               "trajectory_tokens": {x.node_id: len(x.token_ids) for x in tree.nodes}}
    return tree.model_copy(update={"nodes": nodes, "meta": {**tree.meta, "compact": compact}})


def tree_sample(trees: Sequence[ExecutionTree], k: int, max_chars: int = SAMPLE_MAX_CHARS,
                max_tree_chars: int = COMPACT_MAX_CHARS) -> list[ExecutionTree]:
    """Up to ``k`` of ``trees``, compacted (:func:`compact_tree` with ``max_tree_chars``), in task order:
    failed roots (value < 1 or unscored) and solved ones taken alternately from the front, a failure first,
    the other kind filling in when one runs out, so a sample of a point shows both when it has both. A tree
    whose JSON would take the sample past ``max_chars`` characters is skipped (the next one is tried)."""
    if k <= 0:
        return []
    solved = [i for i, t in enumerate(trees) if (verifier_value(t.root) or 0.0) >= 1.0]
    failed = sorted(set(range(len(trees))) - set(solved))
    order: list[int] = []
    while failed or solved:
        for side in (failed, solved):
            if side:
                order.append(side.pop(0))
    chosen: list[tuple[int, ExecutionTree]] = []
    used = 0
    for i in order:
        if len(chosen) == k:
            break
        small = compact_tree(trees[i], max_tree_chars)
        size = len(small.model_dump_json())
        if used + size <= max_chars:
            chosen.append((i, small))
            used += size
    return [t for _, t in sorted(chosen, key=lambda p: p[0])]


async def evaluate_policy(env: Environment, tasks: Sequence[Task], policy: Policy, runtime_config: RuntimeConfig,
                          *, tokenizer: Any, mode: Mode, graded: bool = True, progress: Any = None,
                          keep_trees: int = STORED_TREES, seed: int | None = None) -> EvalReport:
    """Grow one execution tree per task with ``policy`` and summarise per difficulty.

    Args:
        env: the environment (its verifier scores the roots).
        tasks: evaluation tasks; rows are grouped by ``task.difficulty`` ("" becomes "all").
        policy: any policy (endpoint or scripted).
        runtime_config: limits; ``delegation`` is forced on for ``mode='recursive'`` and off for
            ``mode='single'``, ``tree_clock`` ``'auto'`` becomes ``'own'`` (:func:`mode_runtime`; everything
            else, context window included, is kept).
        tokenizer: HF tokenizer or checkpoint folder (chat template of the served model).
        mode: 'recursive' | 'single'.
        graded: success rate = mean verifier value (default) instead of the fraction >= 1.
        progress: passed to ``run_trees`` (callback or True for a progress bar).
        keep_trees: compact trees kept per row (:func:`tree_sample`; ``EvalConfig.stored_trees``).
        seed: the evaluation seed (``eval.seed``): each tree is seeded
            ``rao_core.task_sampling.eval_tree_seed(seed, mode, task_id)``, so two checkpoints get the same
            per-request seeds on the same task (sent only by a policy that sends seeds: ``serving.request_seeds``);
            None: unseeded trees.

    Returns:
        :class:`EvalReport` with one row per difficulty (in first-seen order) and the trees.

    Raises:
        ValueError: no tasks, or an unknown mode.
    """
    cfg = mode_runtime(runtime_config, mode)
    if not tasks:
        raise ValueError("evaluate_policy needs at least one task")
    t0 = time.perf_counter()
    seeds = None
    if seed is not None:
        from rao_core.task_sampling import eval_tree_seed

        seeds = lambda task, g: eval_tree_seed(seed, mode, task.task_id)  # noqa: E731 - one tree per task
    trees = await run_trees(env, [(t, 1) for t in tasks], policy, cfg, tokenizer=tokenizer, progress=progress,
                            seeds=seeds)
    return report_from_trees(tasks, trees, mode=mode, graded=graded, wall_s=time.perf_counter() - t0,
                             keep_trees=keep_trees)


def report_from_trees(tasks: Sequence[Task], trees: Sequence[ExecutionTree], *, mode: Mode, graded: bool = True,
                      wall_s: float = 0.0, keep_trees: int = STORED_TREES) -> EvalReport:
    """The :class:`EvalReport` of one mode from its trees, ``trees[i]`` grown for ``tasks[i]`` (one each, in
    order: :func:`evaluate_policy`, or the shards of ``infra.ray_rollouts``): one row per difficulty in first-seen
    order (``""`` becomes ``"all"``), ``wall_s`` the seconds the trees took (every row's ``wall_s``), each row
    keeping ``keep_trees`` compact trees (:func:`tree_sample`) and counting its ``distinct_problems``
    (:func:`rao_core.task_sampling.task_identity`). Sets each tree's ``meta`` ``eval_mode`` and
    ``difficulty``. Raises ValueError when the counts differ."""
    if len(tasks) != len(trees):
        raise ValueError(f"{len(trees)} trees for {len(tasks)} evaluation tasks")
    by_diff: dict[str, list[ExecutionTree]] = {}
    for task, tree in zip(tasks, trees):
        tree.meta["eval_mode"] = mode
        tree.meta["difficulty"] = task.difficulty or "all"
        by_diff.setdefault(task.difficulty or "all", []).append(tree)
    from rao_core.task_sampling import task_identity

    problems: dict[str, set[str]] = {}
    for task in tasks:
        problems.setdefault(task.difficulty or "all", set()).add(task_identity(task))
    rows = [summarise(ts, mode=mode, difficulty=d, graded=graded, wall_s=wall_s, keep_trees=keep_trees)
            .model_copy(update={"distinct_problems": len(problems[d])}) for d, ts in by_diff.items()]
    return EvalReport(rows=rows, trees=list(trees), graded=graded)


def eval_tasks(env: Environment, config: EvalSpec, **generator_options: Any) -> list[Task]:
    """The evaluation tasks of ``config``: ``n_tasks`` per difficulty from ``split``, drawn by
    :func:`rao_core.task_sampling.sample_tasks` from stream ``"eval"`` with ``config.seed`` (a difficulty's
    tasks do not depend on the other difficulties listed). ``generator_options`` go to ``generate_tasks``."""
    from rao_core.task_sampling import sample_tasks

    return sample_tasks(env, seed=config.seed, stream="eval", difficulties=config.difficulties, n=config.n_tasks,
                        split=config.split, **generator_options)


def dev_tasks(env: Environment, config: EvalConfig, dev: DevSet, **generator_options: Any) -> list[Task]:
    """The development tasks of ``dev`` (:class:`DevSet`): ``dev.n_tasks`` per difficulty of ``config`` from
    its split, drawn by :func:`rao_core.task_sampling.sample_tasks` from stream ``"dev"`` with ``dev.seed``,
    skipping every task whose identity is one of the evaluation set's (:func:`eval_tasks` of ``config``;
    ``rao_core.task_sampling.task_identity``) or of an earlier development task, so the two sets are
    disjoint by construction. Raises ValueError naming the difficulty when the generator cannot give that
    many such tasks."""
    from rao_core.task_sampling import sample_tasks, task_identity

    taken = {task_identity(t) for t in eval_tasks(env, config, **generator_options)}
    out: list[Task] = []
    for d in config.difficulties:
        want, got = dev.n_tasks, []
        for factor in (2, 4, 8):  # a larger draw of the same stream starts with the same tasks
            drawn = sample_tasks(env, seed=dev.seed, stream="dev", difficulties=[d], n=want * factor,
                                 split=config.split, **generator_options)
            seen = set(taken)
            got = [t for t in drawn if task_identity(t) not in seen and not seen.add(task_identity(t))][:want]
            if len(got) == want:
                break
        if len(got) < want:
            raise ValueError(f"eval.dev: only {len(got)} of {want} {d!r} development tasks are not evaluation tasks "
                             f"(eval.seed {config.seed}, eval.dev.seed {dev.seed}); lower eval.dev.n_tasks")
        out += got
    return out


async def evaluate_suite(config: EvalSpec, *, env: Environment | str | None = None, runtime: RuntimeConfig,
                         tokenizer: Any, tasks: Sequence[Task] | None = None, policy: Policy | None = None,
                         base_url: str | None = None, model: str = "policy", api_key: str | None = None,
                         close_policy: bool = False, progress: Any = None, seeded: bool = False) -> EvalReport:
    """Evaluate a policy on held-out tasks in every mode of ``config`` (modes in turn, all tasks at once).

    Args:
        config: :class:`EvalConfig` (or the campaign's ``eval`` section, a subclass), or a :class:`Benchmark`
            of a suite, whose rows (and metric keys) then carry its name.
        env: the environment or its name (``rao_core.envs.get_env``); None: the benchmark's (``config.env``
            with its ``env_options``).
        runtime: the agent's limits (the RL rollouts' ``RuntimeConfig``); ``delegation`` is set per mode.
        tokenizer: HF tokenizer or checkpoint folder (chat template of the evaluated model).
        tasks: the tasks (e.g. a task file); None = :func:`eval_tasks` of ``config`` (with a benchmark's
            ``generator_options``).
        policy: the policy; None = an ``OpenAIPolicy(base_url, model)`` with the runtime's temperature,
            top_p and ``policy_timeout_s`` (closed at the end), which sends no seeds (this function does not
            know whether the server honours them: vLLM's CPU engine dies on some seeded requests).
        api_key: the key that policy sends (None: ``policy_client_key`` of ``base_url``).
        close_policy: also close a given ``policy`` at the end (callers that run this in ``asyncio.run``).
        progress: passed to ``run_trees`` (callback or True for a progress bar).
        seeded: seed each tree from ``config.seed`` (:func:`evaluate_policy`'s ``seed``); whether the seeds
            reach the server is the policy's choice (``OpenAIPolicy.send_seeds``).

    Returns:
        One report with a row per (mode, difficulty), modes in config order (each row's ``benchmark`` the
        benchmark's name when ``config`` is a :class:`Benchmark`); ``report.pooled(mode)`` summarises a mode
        over all difficulties.

    Raises:
        ValueError: neither ``policy`` nor ``base_url``, no tasks, no environment (``env`` None and ``config``
            not a benchmark), or an unknown environment.
    """
    from rao_core.envs import get_env

    bench = config if isinstance(config, Benchmark) else None
    if env is None:
        if bench is None:
            raise ValueError("evaluate_suite needs env unless config is a Benchmark")
        env = get_env(bench.env, **bench.env_options)
    env = get_env(env) if isinstance(env, str) else env
    gen_options = bench.generator_options if bench is not None else {}
    tasks = list(tasks) if tasks is not None else eval_tasks(env, config, **gen_options)
    own = policy is None
    if policy is None:
        if not base_url:
            raise ValueError("evaluate_suite needs a policy or the base_url of a served model")
        from rao_core.policies.openai_policy import OpenAIPolicy

        policy = OpenAIPolicy(base_url, model, api_key=api_key, temperature=runtime.temperature,
                              top_p=runtime.top_p, request_timeout_s=runtime.policy_timeout_s, send_seeds=False)
    report = EvalReport(graded=config.graded)
    try:
        for mode in config.modes:
            report = report + await evaluate_policy(env, tasks, policy, runtime, tokenizer=tokenizer, mode=mode,
                                                    graded=config.graded, progress=progress,
                                                    keep_trees=config.stored_trees,
                                                    seed=config.seed if seeded else None)
    finally:
        if own or close_policy:
            await policy.aclose()
    return report.named(bench.name) if bench is not None else report


def run_evaluation(config: EvalSpec, **kwargs: Any) -> EvalReport:
    """:func:`evaluate_suite` from synchronous code (its own event loop; a given ``policy`` is closed at
    the end). Same arguments and errors; call it from a thread without a running event loop."""
    kwargs.setdefault("close_policy", True)
    return asyncio.run(evaluate_suite(config, **kwargs))


def compare(report: EvalReport | dict[str, float], champion_metrics: dict[str, float], tolerance: float
            ) -> list[str]:
    """Regressions of ``report`` against a champion: success rates that dropped by more than ``tolerance``.

    Compares every ``eval/.../success`` key present in both (extra keys on either side
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

