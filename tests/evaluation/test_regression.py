"""The nightly regression decision (rao_core.regression): Tango's score test with hand-computed numbers, its
restricted MLE against a brute-force search, the power against a naive loop over every outcome sequence, and
the false-alarm rate and power on a seeded fake evaluation with realistic noise."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from rao_core.regression import (CPU_BUDGET_S, CPU_SECONDS_PER_TREE, DEFAULT_N_TASKS, choose_n, decide,
                                 detectable_drop, drop_lower_bound, holm_adjusted, holm_decisions, paired_outcomes,
                                 paired_test, power, tango_z)


def _pairs(n11: int, b: int, c: int, n00: int) -> list[tuple[float, float]]:
    """A 2x2 table as (champion, candidate) pairs: b = champion only, c = candidate only."""
    return [(1.0, 1.0)] * n11 + [(1.0, 0.0)] * b + [(0.0, 1.0)] * c + [(0.0, 0.0)] * n00


def test_tango_at_margin_zero_is_mcnemar():
    # t = 0: B = -(b + c), C = 0, so q = (b + c) / 2n and Z = (b - c) / sqrt(b + c) = 8 / sqrt(12) = 2.309401
    assert tango_z(40, 10, 2, 0.0) == pytest.approx(8 / math.sqrt(12))
    assert math.isnan(tango_z(40, 0, 0, 0.0))  # no discordant pair: no evidence either way


def test_tango_hand_computed_at_the_tolerance():
    # n = 100, b = 20, c = 5, t = 0.1:
    # A = 200, B = -25 + 0.1 (200 - 20 + 5) = -6.5, C = -5 * 0.1 * 0.9 = -0.45
    # B^2 - 4AC = 42.25 + 360 = 402.25, sqrt = 20.056171; q = (6.5 + 20.056171) / 400 = 0.066390
    # var = 100 (2 * 0.066390 + 0.09) = 22.278086; Z = (20 - 5 - 10) / 4.719967 = 1.059330; p = 0.144717
    z = tango_z(100, 20, 5, 0.1)
    assert z == pytest.approx(1.059330, abs=1e-5)
    t = paired_test(_pairs(30, 20, 5, 45), tolerance=0.1, alpha=0.05)
    assert t.p_value == pytest.approx(0.144717, abs=1e-5) and not t.regression
    assert (t.n, t.losses, t.wins, t.champion_successes, t.candidate_successes) == (100, 20, 5, 50.0, 35.0)
    assert t.drop == pytest.approx(0.15) and t.test == "tango-score"
    assert t.drop_bound < 0.1  # not a regression <=> the 95% lower bound does not pass the tolerance


def test_the_restricted_estimate_maximises_the_likelihood_under_the_margin():
    """q of (R2) against a brute-force search of the multinomial likelihood with pi10 = q + t, pi01 = q."""
    n, b, c, t = 60, 14, 6, 0.1

    def loglik(q: float) -> float:
        return b * math.log(q + t) + c * math.log(q) + (n - b - c) * math.log(1 - 2 * q - t)

    best = max((i / 100000 for i in range(1, 45000)), key=loglik)
    a_, b_, c_ = 2 * n, -(b + c) + t * (2 * n - b + c), -c * t * (1 - t)
    q = (-b_ + math.sqrt(b_ * b_ - 4 * a_ * c_)) / (2 * a_)
    assert q == pytest.approx(best, abs=2e-5)
    # and the statistic is (b - c - n t) / sqrt(n (2q + t(1 - t))) with that q
    assert tango_z(n, b, c, t) == pytest.approx((b - c - n * t) / math.sqrt(n * (2 * q + t * (1 - t))))


def test_a_clear_regression_and_its_bound():
    # 100 tasks, the champion solved 50, the candidate 20 (30 losses, no win): Z(0.1) = 20 / sqrt(100 (2q + .09))
    t = paired_test(_pairs(20, 30, 0, 50), tolerance=0.1)
    assert t.regression and t.p_value < 0.001 and t.drop == pytest.approx(0.3)
    assert 0.1 < t.drop_bound < 0.3
    # the bound is where the statistic equals z_0.95 = 1.644854
    assert tango_z(100, 30, 0, t.drop_bound) == pytest.approx(1.644854, abs=1e-3)


def test_decision_and_bound_agree():
    """Rejecting at tolerance t is the same as the lower bound exceeding t, table by table."""
    for b, c in itertools.product(range(0, 21, 4), range(0, 13, 3)):
        t = paired_test(_pairs(10, b, c, 50 - b - c), tolerance=0.1)
        assert t.regression == (t.drop_bound > 0.1), (b, c, t)


def test_identical_outcomes_never_regress():
    same = _pairs(5, 0, 0, 3)
    for tol in (0.0, 0.1):
        t = paired_test(same, tolerance=tol)
        assert not t.regression and t.drop == 0.0
    assert paired_test(same, tolerance=0.0).p_value == 1.0


def test_graded_outcomes_use_the_paired_mean_bound():
    # d = champion - candidate = [0.5, 0.5, 0.25, 0.75]: mean 0.5, sd = sqrt((0 + 0 + .0625 + .0625) / 3) = .204124
    # Z(0.1) = 0.4 / (0.204124 / 2) = 3.919184; p = 4.44e-5
    pairs = [(1.0, 0.5), (0.75, 0.25), (0.5, 0.25), (1.0, 0.25)]
    t = paired_test(pairs, tolerance=0.1)
    assert t.test == "paired-mean" and t.regression
    assert t.p_value == pytest.approx(0.5 * math.erfc(3.919184 / math.sqrt(2)), rel=1e-4)


def test_paired_outcomes_pair_by_task_and_leave_out_unscored():
    champ = {"a": 1.0, "b": 0.0, "c": None, "d": 1.0}
    cand = {"b": 1.0, "a": 0.0, "c": 1.0, "e": 1.0}
    assert paired_outcomes(champ, cand) == [(0.0, 1.0), (1.0, 0.0)]  # candidate order; c unscored, d/e unpaired


def test_decide_without_champion_outcomes_says_so():
    d = decide("eval/recursive/tier1/success", None, {"a": 1.0}, tolerance=0.1)
    assert d.status == "no champion outcomes" and not d.regression and d.table_row()["n"] == 0


def test_decide_table_row_shows_n_intervals_test_p_and_same_checkpoint():
    champ = {f"t{i}": float(i < 5) for i in range(10)}
    d = decide("eval/recursive/tier1/success", champ, dict(champ), tolerance=0.1, same_checkpoint="v2",
               champion_from="this run")
    row = d.table_row()
    # 5/10 = 0.5, Wilson 95% [0.24, 0.76] (p = .5, n = 10: (.692073 -/+ .360527) / 1.384146)
    assert row["champion"] == row["candidate"] == "5/10 = 0.500 [0.24, 0.76]"
    # b = c = 0 at t = 0.1: B = 0.1 * 20 = 2, C = 0, so q = 0; Z = -1 / sqrt(10 * 0.09) = -1.054093, p = 0.854099
    assert row["n"] == 10 and row["losses/wins"] == "0/0" and row["status"] == "ok" and row["p"] == 0.8541
    assert row["test"] == "tango-score, one-sided: drop > 0.1 at alpha 0.05"
    assert row["same_checkpoint"] == "v2" and row["champion_from"] == "this run"


def test_power_matches_a_naive_loop_over_every_outcome_sequence():
    """n = 5 pairs, each one of 3 cells (loss, win, other) with pi10 = p0 (1 - p1), pi01 = (1 - p0) p1: the
    power is the probability of the sequences the test rejects."""
    n, tol, alpha, p0, drop = 5, 0.0, 0.1, 0.5, 0.4
    p1 = p0 - drop
    probs = {"loss": p0 * (1 - p1), "win": (1 - p0) * p1}
    probs["other"] = 1 - probs["loss"] - probs["win"]
    total = 0.0
    for seq in itertools.product(probs, repeat=n):
        b, c = seq.count("loss"), seq.count("win")
        z = tango_z(n, b, c, tol)
        if not math.isnan(z) and 0.5 * math.erfc(z / math.sqrt(2)) < alpha:
            total += math.prod(probs[s] for s in seq)
    assert power(n, drop, tolerance=tol, alpha=alpha, p_champion=p0) == pytest.approx(total)


def test_power_at_the_tolerance_is_the_false_alarm_rate_and_grows_with_the_drop():
    at_edge = power(100, 0.1, tolerance=0.1)
    assert at_edge == pytest.approx(0.05, abs=0.006)  # the level, to the normal approximation
    assert power(100, 0.0, tolerance=0.1) < 0.005  # an unchanged checkpoint: far fewer
    assert power(100, 0.2, tolerance=0.1) < power(100, 0.3, tolerance=0.1)


def test_default_n_is_chosen_by_the_cpu_budget_and_its_power_is_stated():
    # 900 s / (2 evaluations x 4.5 s per tree) = 100 tasks
    assert choose_n(CPU_BUDGET_S, CPU_SECONDS_PER_TREE) == DEFAULT_N_TASKS == 100
    from rao_core.config import EvalSettings

    assert EvalSettings().regression_n_tasks == DEFAULT_N_TASKS and EvalSettings().regression_alpha == 0.05
    # what the config's description and docs/pipeline/nightly.md state: 0.266 at tolerance 0.1, alpha 0.05
    assert detectable_drop(100, tolerance=0.1) == pytest.approx(0.266, abs=0.002)
    assert detectable_drop(8, tolerance=0.1) is None  # the old nightly's 8 tasks cannot show a drop beyond 0.1


def _fake_evaluations(seed: int, n: int, lowered: float) -> tuple[dict[str, float], dict[str, float]]:
    """Per-task success probabilities drawn once (uniform: some tasks nearly always solved, some never), then
    two independent Bernoulli evaluations: the champion's of them, the candidate's of them lowered by
    ``lowered`` (clipped at 0)."""
    rng = random.Random(seed)
    probs = [rng.random() for _ in range(n)]
    champ = {f"task-{i}": float(rng.random() < p) for i, p in enumerate(probs)}
    cand = {f"task-{i}": float(rng.random() < max(0.0, p - lowered)) for i, p in enumerate(probs)}
    return champ, cand


@pytest.mark.parametrize("lowered,bound", [(0.0, "false alarms <= 5%"), (0.3, "caught >= 80%")])
def test_seeded_fake_evaluation_false_alarms_and_power(lowered, bound):
    """200 seeds at the default n and the cpu-smoke tolerance: an unchanged checkpoint fails on <= 5% of them
    (measured 0/200), one whose task probabilities are lowered by 0.3 fails on >= 80% (measured 177/200)."""
    fails = sum(decide("m", *_fake_evaluations(seed, DEFAULT_N_TASKS, lowered), tolerance=0.1,
                       alpha=0.05).regression for seed in range(200))
    if lowered == 0.0:
        assert fails <= 10, f"{fails}/200 false alarms"
    else:
        assert fails >= 160, f"caught {fails}/200"


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="tolerance"):
        paired_test([(1.0, 0.0)], tolerance=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        paired_test([(1.0, 0.0)], tolerance=0.1, alpha=1.5)
    with pytest.raises(ValueError, match="paired table"):
        tango_z(3, 2, 2, 0.0)
    assert drop_lower_bound([]) is None


# -- several metrics in one night: Holm's correction ------------------------------------------------------------
def test_holm_adjusted_p_values_of_a_worked_example():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06
    # (statsmodels.stats.multitest.multipletests(p, method="holm")[1] gives the same)
    assert holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjusted([0.2]) == [0.2] and holm_adjusted([]) == []  # one test: its own p
    assert holm_adjusted([0.6, 0.7]) == [1.0, 1.0]  # capped at 1, and monotone
    assert holm_adjusted([0.02, 0.02]) == pytest.approx([0.04, 0.04])  # ties
    with pytest.raises(ValueError, match="p-values must be in"):
        holm_adjusted([0.5, 1.5])


def test_holm_adjusted_rejects_what_the_step_down_rule_rejects():
    """Against the step-down rule itself (reject the k-th smallest while p_(k) < alpha / (m - k), written out
    here), on 500 seeded families of 1-6 p-values at three levels; research.records.holm (the experiments'
    rule, which reads the adjusted values) gives the same."""
    from research.records import holm

    def step_down(ps, alpha):
        out = [False] * len(ps)
        for k, i in enumerate(sorted(range(len(ps)), key=lambda i: ps[i])):
            if not ps[i] < alpha / (len(ps) - k):
                break
            out[i] = True
        return out

    rng = random.Random(3)
    for _ in range(500):
        ps = [rng.random() ** 3 for _ in range(rng.randint(1, 6))]
        for alpha in (0.01, 0.05, 0.1):
            assert [p < alpha for p in holm_adjusted(ps)] == step_down(ps, alpha) == holm(ps, alpha), (ps, alpha)


def _decision(metric: str, lost: int, n: int = 100):
    """The decision of a candidate that lost ``lost`` of ``n`` tasks the champion solved (no other change)."""
    champ = {f"t{i}": 1.0 for i in range(n)}
    return decide(metric, champ, {k: 0.0 if i < lost else 1.0 for i, k in enumerate(champ)}, tolerance=0.1)


def test_holm_decisions_decide_the_family_by_the_adjusted_p():
    """Four benchmarks in one night: the candidate lost k tasks of one of them, k the smallest loss significant on
    its own (raw p in [alpha / 4, alpha)): Holm over the four keeps it 'ok' (adjusted p = 4 p); a loss of 30 tasks
    stays a regression; a metric without champion outcomes is not in the family; one metric alone is unchanged."""
    k = next(k for k in range(101) if _decision("m", k).result.p_value < 0.05)
    alone = _decision("eval/oolong/recursive/mixed/success", k)
    assert alone.regression and 0.0125 <= alone.result.p_value < 0.05
    assert holm_decisions([alone]) == [alone.model_copy(update={"p_adjusted": alone.result.p_value})]
    family = [alone, _decision("eval/arte/recursive/easy/success", 0),
              _decision("eval/deepdive/recursive/easy/success", 0),
              _decision("eval/textcraft/recursive/tier1/success", 30),
              decide("eval/extra/recursive/x/success", None, {"a": 1.0}, tolerance=0.1)]
    out = holm_decisions(family)
    raw = [d.result.p_value for d in family[:4]]
    assert [d.p_adjusted for d in out[:4]] == pytest.approx(holm_adjusted(raw))
    assert out[0].p_adjusted == pytest.approx(min(1.0, 3 * alone.result.p_value))  # second smallest: x 3
    assert [d.status for d in out] == ["ok", "ok", "ok", "REGRESSION", "no champion outcomes"]
    assert [d.family for d in out] == [4, 4, 4, 4, 1] and out[4] == family[4]
    row = out[3].table_row()
    assert row["test"] == "tango-score, one-sided: drop > 0.1 at alpha 0.05, Holm over 4 metrics"
    assert row["p_holm"] == round(out[3].p_adjusted, 4) and row["p"] == round(family[3].result.p_value, 4)
    assert out[3].message().endswith(f", Holm over 4 metrics p = {out[3].p_adjusted:.4f})")
    assert ", Holm" not in alone.message() and alone.table_row()["p_holm"] == alone.table_row()["p"]


def test_holm_keeps_a_four_benchmark_nights_false_alarms_at_alpha():
    """Four benchmarks per night, each candidate's task probabilities lowered by the tolerance (0.1, the edge
    where a single test's false-alarm rate reaches alpha; lowered probabilities are clipped at 0, so the true drop
    is a little smaller), 200 seeded nights of four independent fake evaluations of 100 tasks (_fake_evaluations):
    a night fails when any metric regresses. Without a correction the nights fail at up to 1 - 0.95^4 = 18.5%;
    with Holm at most alpha = 5%. Measured: 26/200 nights without a correction (27 of the 800 tests alone), 8/200
    with Holm."""
    raw_nights = holm_nights = 0
    for night in range(200):
        ds = [decide(f"m{b}", *_fake_evaluations(1000 * night + b, DEFAULT_N_TASKS, 0.1), tolerance=0.1, alpha=0.05)
              for b in range(4)]
        raw_nights += any(d.regression for d in ds)
        holm_nights += any(d.regression for d in holm_decisions(ds))
    assert holm_nights <= 14, f"Holm: {holm_nights}/200 nights failed (raw: {raw_nights}/200)"
    assert raw_nights > holm_nights, f"raw {raw_nights}/200, Holm {holm_nights}/200"
