"""The collapse guard: did one RL iteration erase a skill the held-out evaluation had measured?

Iteration ``k``'s held-out evaluation is compared task by task with that of the checkpoint it trained from (the
same evaluation seed, so the tasks pair). Per evaluation row (mode, difficulty) of the deciding benchmark (the
campaign's training benchmark unless configured; the other benchmarks' rows are compared alike and reported, never
tested), over the tasks scored in both (``rao_core.regression.paired_outcomes``), with ``L`` tasks lost, ``W``
gained and ``n`` paired::

    p = P(Bin(L + W, 1/2) >= L)        one-sided exact sign test (McNemar's exact for 0/1 outcomes)   (G1)
    drop = (sum of reference outcomes - sum of new outcomes) / n                                       (G2)
    collapse  <=>  some row has  p < alpha / m  and  drop >= min_drop,  m = rows tested (Bonferroni)  (G3)

A project addition (the paper has no guard); the solved nodes' mean advantage per depth is reported beside the
verdict and does not decide. Pure functions: no I/O, no Prefect, no MLflow.
Docs: docs/pipeline/evaluation.md#collapse-guard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from rao_core.regression import paired_outcomes

__all__ = ["GuardRow", "GuardVerdict", "judge_iteration", "sign_test_p"]

Outcomes = Mapping[str, float | None]


def sign_test_p(lost: int, gained: int) -> float:
    """One-sided exact sign test (G1): ``P(X >= lost)`` for ``X ~ Bin(lost + gained, 1/2)``; 1.0 without a
    discordant task. E.g. ``sign_test_p(5, 0) = 1/32``, ``sign_test_p(2, 1) = 1/2``. Raises ValueError for a
    negative count."""
    if lost < 0 or gained < 0:
        raise ValueError(f"task counts must be >= 0, got lost={lost}, gained={gained}")
    if lost + gained == 0:
        return 1.0
    from scipy import stats

    return float(stats.binomtest(lost, lost + gained, 0.5, alternative="greater").pvalue)


class GuardRow(BaseModel):
    """The paired comparison of one evaluation row (benchmark, mode, difficulty): counts over the paired tasks."""

    benchmark: str = ""
    mode: str
    difficulty: str
    n: int = Field(description="Tasks scored in both evaluations (the pairs).")
    before: float = Field(description="Sum of the reference evaluation's outcomes over the pairs (successes).")
    after: float = Field(description="Sum of the new evaluation's outcomes over the pairs.")
    lost: int = Field(description="L: tasks whose outcome fell.")
    gained: int = Field(description="W: tasks whose outcome rose.")
    p_value: float = Field(description="One-sided exact sign test (G1): P(Bin(L + W, 1/2) >= L).")
    drop: float = Field(description="(before - after) / n (G2), success-rate units; negative for a rise.")

    @property
    def name(self) -> str:
        """``textcraft/recursive/nest1`` (``recursive/nest1`` for a row of no named benchmark): the row as the
        campaign's tables name it."""
        return "/".join([*([self.benchmark] if self.benchmark else []), self.mode, self.difficulty])

    @property
    def rate_before(self) -> float:
        """Reference success rate over the pairs (0 without pairs)."""
        return self.before / self.n if self.n else 0.0

    @property
    def rate_after(self) -> float:
        """New success rate over the pairs (0 without pairs)."""
        return self.after / self.n if self.n else 0.0


class GuardVerdict(BaseModel):
    """The guard's verdict on one RL iteration (G1-G3 of the module docstring)."""

    iteration: int = Field(description="The RL iteration judged.")
    reference: int | None = Field(description="The iteration whose evaluation it was compared with (its "
                                  "checkpoint is the one iteration was trained from or, when that one was not "
                                  "evaluated (eval.every), the last evaluated one it descends from); None without "
                                  "one.")
    status: Literal["collapse", "pass", "no_reference"] = Field(description="'collapse' (G3 holds), 'pass', or "
                                                                "'no_reference' (nothing to compare with).")
    reason: str = Field("", description="Why there was nothing to compare (status 'no_reference').")
    alpha: float
    min_drop: float
    level: float = Field(description="alpha / rows tested: the level each row's p is compared with (G3).")
    rows: list[GuardRow] = Field(default_factory=list, description="Every row tested, in evaluation order: the rows "
                                 "of the deciding benchmark (judge_iteration's benchmark).")
    reported: list[GuardRow] = Field(default_factory=list, description="The other benchmarks' rows, compared "
                                     "the same way and reported, not tested: they never make a collapse.")
    worst: GuardRow | None = Field(None, description="The row reported: the collapsed row with the smallest p, "
                                   "else the row with the smallest p (None without rows).")
    solved_advantage: dict[int, float] = Field(default_factory=dict, description="Depth -> mean advantage of "
                                               "the iteration's solved training nodes.")
    pushed_down: list[int] = Field(default_factory=list, description="Depths whose solved nodes' mean advantage "
                                   "is negative (ascending).")

    @property
    def collapsed(self) -> bool:
        """The decision: the iteration collapsed (its checkpoint must not be promoted)."""
        return self.status == "collapse"

    def test_text(self) -> str:
        """``paired exact sign test, 90 tasks lost vs 0 gained of 100, p = 8.1e-28 < 0.05``: the reported row's
        test (empty without one); the level is written ``alpha/m`` when ``m`` rows were tested."""
        w = self.worst
        if w is None:
            return ""
        m = len(self.rows)
        level = f"{self.alpha:g}" if m == 1 else f"{self.alpha:g}/{m}"
        cmp = "<" if w.p_value < self.level else ">="
        return (f"paired exact sign test, {w.lost} tasks lost vs {w.gained} gained of {w.n}, "
                f"p = {w.p_value:.2g} {cmp} {level}")

    def depth_text(self) -> str:
        """``solved nodes' mean advantage < 0 at depth 1 (-0.31)``: the pushed-down depths (empty if none)."""
        if not self.pushed_down:
            return ""
        parts = ", ".join(f"{d} ({self.solved_advantage[d]:+.2f})" for d in self.pushed_down)
        return f"solved nodes' mean advantage < 0 at depth {parts}"

    def line(self, checkpoint: str, consequence: str = "") -> str:
        """The campaign's one line for a collapse: ``collapse guard: iteration 2 held-out success 0.90 -> 0.00
        on recursive/nest1 (<test_text>; <depth_text>): checkpoint <checkpoint> is not promoted[; consequence]``.
        Raises ValueError when the verdict is not a collapse."""
        if not self.collapsed or self.worst is None:
            raise ValueError(f"iteration {self.iteration}: no collapse to report (status {self.status})")
        w = self.worst
        detail = "; ".join(t for t in (self.test_text(), self.depth_text()) if t)
        out = (f"collapse guard: iteration {self.iteration} held-out success {w.rate_before:.2f} -> "
               f"{w.rate_after:.2f} on {w.name} ({detail}): checkpoint {checkpoint} is not promoted")
        return out + (f"; {consequence}" if consequence else "")

    def reported_text(self) -> str:
        """``reported, not deciding: oolong/recursive/mixed 0.50 -> 0.25 (2 lost vs 0 gained of 4, p = 0.25)``:
        the other benchmarks' comparisons (empty without any)."""
        if not self.reported:
            return ""
        return "reported, not deciding: " + "; ".join(
            f"{r.name} {r.rate_before:.2f} -> {r.rate_after:.2f} ({r.lost} lost vs {r.gained} gained of {r.n}, "
            f"p = {r.p_value:.2g})" for r in self.reported)

    def metrics(self) -> dict[str, float]:
        """MLflow metrics under ``guard/``: ``collapsed`` (0/1), ``has_reference`` (0/1), and with a reported row
        ``p_value``, ``drop``, ``success_before``, ``success_after``, ``lost``, ``gained``, ``n``,
        ``rows_tested``, ``level``; per depth ``solved_advantage_depth_<d>``."""
        m: dict[str, float] = {"guard/collapsed": float(self.collapsed),
                               "guard/has_reference": float(self.status != "no_reference")}
        w = self.worst
        if w is not None:
            m.update({"guard/p_value": w.p_value, "guard/drop": w.drop, "guard/success_before": w.rate_before,
                      "guard/success_after": w.rate_after, "guard/lost": float(w.lost),
                      "guard/gained": float(w.gained), "guard/n": float(w.n),
                      "guard/rows_tested": float(len(self.rows)), "guard/level": self.level})
        m.update({f"guard/solved_advantage_depth_{d}": v for d, v in self.solved_advantage.items()})
        return m


Key = tuple[str, str, str]  # (benchmark, mode, difficulty)


def _outcomes(rows: Sequence[Mapping[str, Any]] | None, which: str, benchmark: str
              ) -> dict[Key, tuple[Outcomes, str]]:
    """(benchmark, mode, difficulty) -> (per-task outcomes, the row's own ``benchmark`` field or "") of the rows
    that have them, a row without a ``benchmark`` being ``benchmark``'s (rows recorded before rows named their
    benchmark: the training one's); ValueError for a row without a mode or difficulty, or an outcome that is not
    a finite number in [0, 1] (or None)."""
    out: dict[Key, tuple[Outcomes, str]] = {}
    for i, r in enumerate(rows or []):
        if not r.get("mode") or not r.get("difficulty"):
            raise ValueError(f"{which} evaluation row {i}: no mode or difficulty")
        per_task = r.get("per_task") or {}
        for task, v in per_task.items():
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"{which} evaluation {r['mode']}/{r['difficulty']}, task {task}: outcome {v!r} is "
                                 "not a number in [0, 1]")
        if per_task:
            own = str(r.get("benchmark") or "")
            out[(own or benchmark, str(r["mode"]), str(r["difficulty"]))] = (per_task, own)
    return out


def _row(key: Key, before: Outcomes, after: Outcomes, name: str) -> GuardRow:
    """G1-G2 of one row (``name``: its benchmark as the new evaluation names it, "" for none); a graded outcome
    (e.g. partial credit) counts as lost or gained by its sign."""
    pairs = paired_outcomes(before, after)  # (reference, new) of the tasks scored in both
    lost = sum(1 for x, y in pairs if y < x)
    gained = sum(1 for x, y in pairs if y > x)
    s0, s1 = sum(x for x, _ in pairs), sum(y for _, y in pairs)
    return GuardRow(benchmark=name, mode=key[1], difficulty=key[2], n=len(pairs), before=s0, after=s1, lost=lost,
                    gained=gained, p_value=sign_test_p(lost, gained), drop=(s0 - s1) / len(pairs) if pairs else 0.0)


def judge_iteration(iteration: int, before: Sequence[Mapping[str, Any]] | None, after: Sequence[Mapping[str, Any]],
                    *, alpha: float = 0.05, min_drop: float = 0.1, reference: int | None = None,
                    solved_advantage: Mapping[int | str, float] | None = None, benchmark: str = "") -> GuardVerdict:
    """The verdict on RL iteration ``iteration`` (module docstring: G1-G3).

    Args:
        iteration: the RL iteration judged.
        before: the reference evaluation's rows (``EvalRow.table_row()`` dicts: ``benchmark`` (optional),
            ``mode``, ``difficulty``, ``per_task`` {task id: outcome in [0, 1] or None}); None or no row with
            per-task outcomes: status 'no_reference'.
        after: the iteration's evaluation rows, same shape.
        alpha: one-sided level of the family of rows, in (0, 1).
        min_drop: smallest drop of success rate (G2) that counts, in [0, 1].
        reference: the iteration ``before`` belongs to (recorded in the verdict).
        solved_advantage: depth -> mean advantage of the solved training nodes
            (``SampleStats.mean_advantage_solved_per_depth``; string keys, as JSON stores them, are read as ints).
        benchmark: the deciding benchmark (the campaign's ``eval.primary_benchmark``): only its rows are tested
            (G3); the other benchmarks' rows are compared alike and listed in ``reported``. A row without a
            ``benchmark`` field is the deciding benchmark's. "" (rows of no named benchmark): every row decides.

    Returns: a :class:`GuardVerdict`; rows of one evaluation without a partner, or with no task scored in both,
    are not tested.

    Raises ValueError for ``alpha`` outside (0, 1), ``min_drop`` outside [0, 1], a row without a mode or
    difficulty, an outcome that is not a number in [0, 1], or a depth that is not an integer.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0 <= min_drop <= 1:
        raise ValueError(f"min_drop must be in [0, 1], got {min_drop}")
    try:
        adv = {int(d): float(v) for d, v in (solved_advantage or {}).items()}
    except ValueError:
        raise ValueError(f"solved_advantage: depths must be integers, got {sorted(solved_advantage or {})}") from None
    adv = dict(sorted(adv.items()))
    common = dict(iteration=iteration, reference=reference, alpha=alpha, min_drop=min_drop, solved_advantage=adv,
                  pushed_down=[d for d, v in adv.items() if v < 0])
    ref, new = _outcomes(before, "reference", benchmark), _outcomes(after, "new", benchmark)
    compared = [(key, r) for key in new if key in ref and (r := _row(key, ref[key][0], *new[key])).n > 0]
    rows = [r for key, r in compared if not benchmark or key[0] == benchmark]
    reported = [r for key, r in compared if benchmark and key[0] != benchmark]

    def deciding(outcomes: dict[Key, tuple[Outcomes, str]]) -> bool:
        return any(not benchmark or k[0] == benchmark for k in outcomes)

    why = ("no reference evaluation" if before is None else
           "the reference evaluation has no per-task outcomes" if not deciding(ref) else
           "the new evaluation has no per-task outcomes" if not deciding(new) else "")
    if not why and not rows:
        why = "no task scored in both evaluations"
    if why:
        return GuardVerdict(status="no_reference", reason=why, level=alpha, reported=reported, **common)
    level = alpha / len(rows)
    flagged = [r for r in rows if r.p_value < level and r.drop >= min_drop - 1e-12]
    worst = min(flagged or rows, key=lambda r: (r.p_value, -r.drop))
    return GuardVerdict(status="collapse" if flagged else "pass", level=level, rows=rows, reported=reported,
                        worst=worst, **common)
