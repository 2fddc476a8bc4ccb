"""The nightly regression decision: a paired test on per-task outcomes, with a known false-alarm rate.

Champion and candidate are evaluated on the same held-out tasks, so each task gives a pair of root outcomes
(``rao_core.evaluation.EvalRow.per_task``). One-sided, with the tolerance ``t`` as margin, at level ``alpha``:
``H0: Delta <= t`` vs ``H1: Delta > t``, ``Delta = p_champion - p_candidate``, by Tango's score test for paired
proportions (Eqs. R1, R2 in :func:`tango_z`; McNemar's at ``t = 0``); graded outcomes use a normal bound on the
mean paired difference. False alarms: at most ``alpha`` for every candidate whose true drop is at most ``t``
(simulated in ``tests/evaluation/test_regression.py``, measured by ``scripts/bench_nightly_false_alarms.py``).
Power (:func:`power`, :func:`detectable_drop`) is exact under a stated conservative model: the two evaluations
independent given the rates, a champion rate of 0.5. Several metrics in one night (a benchmark suite) are decided
with Holm's correction over them (:func:`holm_decisions`), so the night's false-alarm rate stays at most
``alpha``. Pure functions: no I/O, no Prefect, no MLflow.
Docs: docs/pipeline/nightly.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

from pydantic import BaseModel, Field

__all__ = ["CPU_BUDGET_S", "CPU_SECONDS_PER_TREE", "DEFAULT_ALPHA", "DEFAULT_N_TASKS", "PairedTest",
           "RegressionDecision", "choose_n", "decide", "detectable_drop", "drop_lower_bound", "holm_adjusted",
           "holm_decisions", "paired_outcomes", "paired_test", "power", "power_table", "tango_z"]

DEFAULT_ALPHA = 0.05  # false-alarm rate allowed for a candidate within the tolerance (eval.regression_alpha)
# The CPU budget of one nightly (cpu-smoke on a 2-core machine): the evaluation of 8 tier1 tasks took 36-37 s
# (docs/benchmarks/pipeline.md, fresh-clone make run), ~4.5 s per tree with the trees growing at once; a night may
# evaluate both checkpoints (the champion when it has no stored evaluation of these tasks), within 15 minutes.
CPU_SECONDS_PER_TREE = 4.5
CPU_BUDGET_S = 900.0
DEFAULT_N_TASKS = 100  # choose_n(CPU_BUDGET_S, CPU_SECONDS_PER_TREE): tests/evaluation/test_regression.py


def _phi_upper(z: float) -> float:
    """``1 - Phi(z)``, the upper tail of the standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def _z_quantile(p: float) -> float:
    """``Phi^{-1}(p)`` by bisection on :func:`_phi_upper` (p in (0, 1))."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1 - _phi_upper(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def tango_z(n: int, b: int, c: int, margin: float) -> float:
    """Tango's score statistic (R1, R2) of ``H0: Delta = margin`` from ``n`` pairs, ``b`` losses and ``c`` wins.

    For 0/1 outcomes the pairs reduce to a 2x2 table: ``b`` tasks only the champion solved (losses), ``c`` tasks
    only the candidate solved (wins); the candidate's drop is ``Delta = pi10 - pi01`` (the probabilities of those
    two cells). Tango 1998, "Equivalence test and confidence interval for the difference in proportions for the
    paired-sample design", Stat Med 17:891-908::

        Z(t) = (b - c - n t) / sqrt(n (2 q + t (1 - t)))                                  (R1)
        q = (-B + sqrt(B^2 - 4 A C)) / (2 A),                                               (R2)
            A = 2n,  B = -(b + c) + t (2n - b + c),  C = -c t (1 - t)

    ``q`` is the maximum-likelihood ``pi01`` under ``Delta = t`` (the root of ``A q^2 + B q + C = 0`` in [0, 1]).
    ``p = 1 - Phi(Z(t))``; the candidate regressed when ``p < alpha``, i.e. when the one-sided ``1 - alpha``
    lower confidence bound of ``Delta`` (:func:`drop_lower_bound`) exceeds ``t``. With ``t = 0`` (R1) is
    McNemar's ``(b - c) / sqrt(b + c)``.

    Large when the candidate lost more tasks than ``margin * n`` beyond those it won. ``nan`` when the variance
    is 0 (``margin`` 0 and no discordant pair: no evidence either way). Raises ValueError for counts that are
    not a table (``b + c > n``) or a margin outside (-1, 1)."""
    if n < 1 or b < 0 or c < 0 or b + c > n:
        raise ValueError(f"not a paired table: n={n}, b={b}, c={c}")
    if not -1 < margin < 1:
        raise ValueError(f"margin must be in (-1, 1), got {margin}")
    a_, b_, c_ = 2 * n, -(b + c) + margin * (2 * n - b + c), -c * margin * (1 - margin)  # (R2)
    q = (-b_ + math.sqrt(max(0.0, b_ * b_ - 4 * a_ * c_))) / (2 * a_)
    var = n * (2 * q + margin * (1 - margin))
    if var <= 1e-15:
        return float("nan")
    return (b - c - n * margin) / math.sqrt(var)  # (R1)


def _graded_z(diffs: Sequence[float], margin: float) -> float:
    """``(mean(d) - margin) / (sd(d) / sqrt(n))`` over the paired differences ``d_i = x_i - y_i`` of graded
    outcomes (values other than 0 and 1, e.g. Oolong's partial credit), sample sd; +-inf when every difference is
    the same."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    if sd == 0:
        return math.inf if mean > margin + 1e-12 else (-math.inf if mean < margin - 1e-12 else float("nan"))
    return (mean - margin) / (sd / math.sqrt(n))


class PairedTest(BaseModel):
    """The paired test of one metric (:func:`paired_test`): counts, observed drop, p and the lower bound."""

    test: str = Field(description="'tango-score' (0/1 outcomes; McNemar's test at tolerance 0) or "
                      "'paired-mean' (graded outcomes).")
    n: int = Field(description="Tasks scored in both evaluations (the pairs).")
    champion_successes: float
    candidate_successes: float
    losses: int = Field(0, description="b: tasks the champion solved and the candidate did not (0/1 outcomes).")
    wins: int = Field(0, description="c: tasks the candidate solved and the champion did not (0/1 outcomes).")
    drop: float = Field(description="Observed drop, champion rate minus candidate rate over the pairs.")
    drop_bound: float | None = Field(description="One-sided 1 - alpha lower confidence bound of the drop (None "
                                     "without pairs).")
    p_value: float = Field(description="One-sided p of H0 'drop <= tolerance'; 1.0 without evidence.")
    tolerance: float
    alpha: float

    @property
    def regression(self) -> bool:
        """The decision: H0 rejected at ``alpha``."""
        return self.n > 0 and self.p_value < self.alpha


def paired_outcomes(champion: Mapping[str, float | None], candidate: Mapping[str, float | None]
                    ) -> list[tuple[float, float]]:
    """``(champion, candidate)`` outcome pairs of the tasks scored in both (task ids in the candidate's order);
    a task unscored (None) or missing on either side is left out."""
    return [(float(champion[k]), float(v)) for k, v in candidate.items()
            if v is not None and champion.get(k) is not None]


def _z(pairs: Sequence[tuple[float, float]], margin: float) -> float:
    if all(x in (0.0, 1.0) and y in (0.0, 1.0) for x, y in pairs):
        b = sum(1 for x, y in pairs if x == 1.0 and y == 0.0)
        c = sum(1 for x, y in pairs if x == 0.0 and y == 1.0)
        return tango_z(len(pairs), b, c, margin)
    return _graded_z([x - y for x, y in pairs], margin)


def drop_lower_bound(pairs: Sequence[tuple[float, float]], alpha: float = DEFAULT_ALPHA) -> float | None:
    """The one-sided ``1 - alpha`` lower confidence bound of the drop: the margin ``d`` at which the statistic
    equals ``z_{1-alpha}`` (bisection; the statistic decreases in ``d``), in [-1, 1]. None without pairs."""
    if not pairs:
        return None
    z = _z_quantile(1 - alpha)
    lo, hi = -1 + 1e-9, 1 - 1e-9
    if not _z(pairs, lo) > z:  # not even a gain of 1 excluded: the bound is -1
        return -1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        s = _z(pairs, mid)
        if s > z:
            lo = mid
        else:
            hi = mid
    return round(lo, 6)


def paired_test(pairs: Sequence[tuple[float, float]], tolerance: float, alpha: float = DEFAULT_ALPHA) -> PairedTest:
    """The one-sided test of the module (H0: drop <= ``tolerance``) on ``(champion, candidate)`` outcome pairs
    (:func:`paired_outcomes`).

    Outcomes all 0 or 1: Tango's score test ('tango-score'); otherwise the paired-mean bound ('paired-mean').
    No pairs, no discordant pair at tolerance 0, or a tolerance of 1 or more: p = 1 (no regression can be
    shown). Raises ValueError for a negative tolerance or an alpha outside (0, 1)."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    n = len(pairs)
    binary = all(x in (0.0, 1.0) and y in (0.0, 1.0) for x, y in pairs)
    champ, cand = sum(x for x, _ in pairs), sum(y for _, y in pairs)
    b = sum(1 for x, y in pairs if x == 1.0 and y == 0.0) if binary else 0
    c = sum(1 for x, y in pairs if x == 0.0 and y == 1.0) if binary else 0
    p = 1.0
    if n and tolerance < 1 and (binary or n > 1):
        z = _z(pairs, tolerance)
        p = 1.0 if math.isnan(z) else _phi_upper(z)
    return PairedTest(test="tango-score" if binary else "paired-mean", n=n, champion_successes=champ,
                      candidate_successes=cand, losses=b, wins=c, drop=(champ - cand) / n if n else 0.0,
                      drop_bound=drop_lower_bound(pairs, alpha) if (binary or n > 1) else None,
                      p_value=p, tolerance=tolerance, alpha=alpha)


# -- power -------------------------------------------------------------------------------------------------
@lru_cache(maxsize=64)
def _rejected(n: int, tolerance: float, alpha: float) -> tuple[tuple[int, int], ...]:
    """Every table ``(b, c)`` of ``n`` pairs that the 0/1 test rejects at ``alpha``."""
    z = _z_quantile(1 - alpha)
    out = []
    for b in range(n + 1):
        for c in range(n - b + 1):
            s = tango_z(n, b, c, tolerance)
            if not math.isnan(s) and s > z:
                out.append((b, c))
    return tuple(out)


def power(n: int, drop: float, *, tolerance: float, alpha: float = DEFAULT_ALPHA, p_champion: float = 0.5) -> float:
    """Probability that the 0/1 test flags a candidate whose success rate is ``p_champion - drop``, with ``n``
    pairs: the multinomial probability of the rejected tables, the two evaluations independent given the rates
    (``pi10 = p0 (1 - p1)``, ``pi01 = (1 - p0) p1``). At ``drop <= tolerance`` this is the false-alarm rate.
    Raises ValueError when ``p_champion - drop`` is outside [0, 1]."""
    p0, p1 = p_champion, p_champion - drop
    if not (0 <= p0 <= 1 and 0 <= p1 <= 1):
        raise ValueError(f"success rates {p0} -> {p1} outside [0, 1]")
    pi10, pi01 = p0 * (1 - p1), (1 - p0) * p1
    rest = 1 - pi10 - pi01
    logs = [math.log(x) if x > 0 else -math.inf for x in (pi10, pi01, rest)]
    lf = [math.lgamma(k + 1) for k in range(n + 1)]
    total = 0.0
    for b, c in _rejected(n, round(tolerance, 12), round(alpha, 12)):
        terms = (b * logs[0] if b else 0.0) + (c * logs[1] if c else 0.0) + ((n - b - c) * logs[2] if n - b - c else 0.0)
        if terms > -math.inf:
            total += math.exp(lf[n] - lf[b] - lf[c] - lf[n - b - c] + terms)
    return min(1.0, total)


def detectable_drop(n: int, *, tolerance: float, alpha: float = DEFAULT_ALPHA, target: float = 0.8,
                    p_champion: float = 0.5) -> float | None:
    """The smallest drop flagged with probability ``target`` (default 80%) by the test on ``n`` pairs
    (:func:`power`, bisection to 0.001); None when not even a drop to 0 (``p_champion``) reaches it."""
    if power(n, p_champion, tolerance=tolerance, alpha=alpha, p_champion=p_champion) < target:
        return None
    lo, hi = 0.0, p_champion
    while hi - lo > 5e-4:
        mid = (lo + hi) / 2
        if power(n, mid, tolerance=tolerance, alpha=alpha, p_champion=p_champion) >= target:
            hi = mid
        else:
            lo = mid
    return round(hi, 3)


def power_table(ns: Sequence[int], *, tolerance: float, alpha: float = DEFAULT_ALPHA,
                seconds_per_tree: float = CPU_SECONDS_PER_TREE) -> list[dict[str, float | int | None]]:
    """One row per n: the detectable drop (80% power), the false-alarm bound at the tolerance's edge
    (``power`` at ``drop = tolerance``) and of an unchanged checkpoint (``drop = 0``), and the evaluation
    minutes of both checkpoints at ``seconds_per_tree``."""
    return [{"n": n, "detectable_drop": detectable_drop(n, tolerance=tolerance, alpha=alpha),
             "false_alarm_at_tolerance": round(power(n, tolerance, tolerance=tolerance, alpha=alpha), 4),
             "false_alarm_unchanged": round(power(n, 0.0, tolerance=tolerance, alpha=alpha), 4),
             "minutes_both": round(2 * n * seconds_per_tree / 60, 1)} for n in ns]


def choose_n(budget_s: float = CPU_BUDGET_S, seconds_per_tree: float = CPU_SECONDS_PER_TREE,
             evaluations: int = 2, step: int = 25) -> int:
    """The nightly's task count: the most tasks, a multiple of ``step``, whose ``evaluations`` evaluations
    (candidate and champion) fit ``budget_s`` at ``seconds_per_tree``; the power comes with it
    (:func:`detectable_drop`), since more tasks always detect a smaller drop. At least ``step``."""
    return max(step, int(budget_s / (evaluations * seconds_per_tree)) // step * step)


# -- the decision of one metric -----------------------------------------------------------------------------
class RegressionDecision(BaseModel):
    """The nightly's decision for one ``/success`` metric: the paired test, both rates with Wilson 95%
    intervals, whether candidate and champion are the same checkpoint and, when the night tested several
    metrics, the Holm-adjusted p that decides (:func:`holm_decisions`)."""

    metric: str
    status: str = Field(description="'REGRESSION', 'ok', or 'no champion outcomes' (nothing to pair with).")
    same_checkpoint: str = Field("", description="Non-empty when candidate and champion are one checkpoint: "
                                 "what they share (e.g. 'v2', or the folder).")
    champion_from: str = Field("", description="Where the champion's outcomes come from (this run, or a stored "
                               "evaluation).")
    result: PairedTest | None = None
    p_adjusted: float | None = Field(None, description="Holm-adjusted p over the night's tested metrics "
                                     "(holm_decisions); None: not adjusted (the raw p decides).")
    family: int = Field(1, description="Tests the Holm correction was over (1: none).")

    @property
    def regression(self) -> bool:
        return self.status == "REGRESSION"

    def table_row(self) -> dict[str, object]:
        """The row of the comparison table: n, successes and Wilson 95% intervals of both, losses/wins, drop,
        its lower bound, the test, p, the Holm-adjusted p (``p_holm``: the p that decides; the raw p when
        not adjusted), status and the same-checkpoint note."""
        from rao_core.evaluation import wilson_interval

        r = self.result
        if r is None:
            return {"metric": self.metric, "n": 0, "champion": "", "candidate": "", "losses/wins": "", "drop": "",
                    "drop_bound": "", "test": "", "p": "", "p_holm": "", "status": self.status,
                    "same_checkpoint": self.same_checkpoint, "champion_from": self.champion_from}

        def rate(s: float) -> str:
            lo, hi = wilson_interval(min(s, r.n), r.n)
            return f"{s:g}/{r.n} = {s / r.n:.3f} [{lo:.2f}, {hi:.2f}]" if r.n else "-"

        holm = r.p_value if self.p_adjusted is None else self.p_adjusted
        return {"metric": self.metric, "n": r.n, "champion": rate(r.champion_successes),
                "candidate": rate(r.candidate_successes),
                "losses/wins": f"{r.losses}/{r.wins}" if r.test == "tango-score" else "",
                "drop": round(r.drop, 3), "drop_bound": "" if r.drop_bound is None else round(r.drop_bound, 3),
                "test": f"{r.test}, one-sided: drop > {r.tolerance:g} at alpha {r.alpha:g}"
                        + (f", Holm over {self.family} metrics" if self.family > 1 else ""),
                "p": round(r.p_value, 4), "p_holm": round(holm, 4), "status": self.status,
                "same_checkpoint": self.same_checkpoint, "champion_from": self.champion_from}

    def message(self) -> str:
        """One line for a regression error, e.g. ``eval/textcraft/recursive/tier1/success: 20/100 vs champion
        50/100 (drop 0.300, 95% lower bound 0.19 > tolerance 0.1; tango-score p = 0.0001)``, ending ``, Holm over
        4 metrics p = 0.0004`` when the night tested several."""
        r = self.result
        if r is None:
            return f"{self.metric}: {self.status}"
        holm = (f", Holm over {self.family} metrics p = {self.p_adjusted:.4f}"
                if self.p_adjusted is not None and self.family > 1 else "")
        return (f"{self.metric}: {r.candidate_successes:g}/{r.n} vs champion {r.champion_successes:g}/{r.n} "
                f"(drop {r.drop:.3f}, {1 - r.alpha:.0%} lower bound {r.drop_bound:.3f} > tolerance {r.tolerance:g}; "
                f"{r.test} p = {r.p_value:.4f}{holm})")


def decide(metric: str, champion: Mapping[str, float | None] | None, candidate: Mapping[str, float | None], *,
           tolerance: float, alpha: float = DEFAULT_ALPHA, same_checkpoint: str = "", champion_from: str = ""
           ) -> RegressionDecision:
    """The decision for ``metric`` from per-task outcomes (task id -> outcome, None unscored) of the champion
    and the candidate: :func:`paired_test` on :func:`paired_outcomes`. ``champion`` None or without a task in
    common: status 'no champion outcomes' (no regression can be shown, and the caller says so)."""
    pairs = paired_outcomes(champion or {}, candidate)
    if not pairs:
        return RegressionDecision(metric=metric, status="no champion outcomes", same_checkpoint=same_checkpoint,
                                  champion_from=champion_from)
    t = paired_test(pairs, tolerance, alpha)
    return RegressionDecision(metric=metric, status="REGRESSION" if t.regression else "ok",
                              same_checkpoint=same_checkpoint, champion_from=champion_from, result=t)


# -- several metrics in one night: Holm's correction -----------------------------------------------------------
def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test
    procedure", Scand J Stat 6:65-70), in the input's order: with the ``m`` p-values sorted ascending,
    ``p_(1) <= ... <= p_(m)``::

        adj_(k) = min(1, max_{j <= k} (m - j + 1) p_(j))                                         (H1)

    Rejecting where ``adj < alpha`` rejects ``p_(k)`` while every ``p_(j) < alpha / (m - j + 1)``, j <= k, and
    keeps the family-wise false-alarm rate at most ``alpha`` whatever the dependence between the tests. E.g.
    ``[0.01, 0.04, 0.03, 0.005]`` -> ``[0.03, 0.06, 0.06, 0.02]``; one p-value is its own adjusted value.
    (statsmodels' ``multipletests(method="holm")`` computes the same; it is not a dependency here.) Raises
    ValueError for a p-value outside [0, 1]."""
    for p in p_values:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p-values must be in [0, 1], got {p}")
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [1.0] * m
    running = 0.0
    for k, i in enumerate(order):  # k = 0 for the smallest: multiplier m - k
        running = max(running, min(1.0, (m - k) * p_values[i]))
        out[i] = running
    return out


def holm_decisions(decisions: Sequence[RegressionDecision]) -> list[RegressionDecision]:
    """``decisions`` (one per metric of one night, :func:`decide`) with Holm's correction (:func:`holm_adjusted`)
    over those that were tested (``result`` not None): each gets ``p_adjusted``, ``family`` (the number of tests
    corrected over) and the status of its adjusted p (``REGRESSION`` when ``p_adjusted < alpha``), so that the
    night's false-alarm rate for candidates within the tolerance on every metric stays at most ``alpha``, however
    many benchmarks it compares. The others are returned unchanged; with one test nothing changes."""
    tested = [i for i, d in enumerate(decisions) if d.result is not None]
    adjusted = holm_adjusted([decisions[i].result.p_value for i in tested])
    out = list(decisions)
    for i, p in zip(tested, adjusted):
        d = decisions[i]
        regression = d.result.n > 0 and p < d.result.alpha
        out[i] = d.model_copy(update={"p_adjusted": p, "family": len(tested),
                                      "status": "REGRESSION" if regression else "ok"})
    return out
