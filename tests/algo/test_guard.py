"""The collapse guard's decision (rao_core.guard) with hand-computed values: the one-sided exact sign test on the
discordant tasks, the Bonferroni level over evaluation rows, the minimum drop, the missing reference, the
per-depth diagnostic, and the config section that sets it (rao_core.config.GuardSettings)."""

from __future__ import annotations

import math

import pytest

from rao_core.guard import judge_iteration, sign_test_p


def _row(outcomes: list[float | None], difficulty: str = "nest1", mode: str = "recursive") -> dict:
    """An evaluation row (EvalRow.table_row's fields the guard reads): task ``t<i>`` has outcome ``outcomes[i]``."""
    return {"mode": mode, "difficulty": difficulty, "per_task": {f"t{i}": v for i, v in enumerate(outcomes)}}


def test_the_sign_test_is_the_binomial_tail_by_hand():
    assert sign_test_p(5, 0) == pytest.approx(1 / 32)  # P(X >= 5), X ~ Bin(5, 1/2)
    assert sign_test_p(2, 1) == pytest.approx(4 / 8)  # (C(3,2) + C(3,3)) / 2^3
    assert sign_test_p(6, 1) == pytest.approx(8 / 128)  # (C(7,6) + C(7,7)) / 2^7
    assert sign_test_p(0, 9) == pytest.approx(1.0)  # a rise: every outcome at least as likely as this
    assert sign_test_p(90, 0) == pytest.approx(2.0 ** -90, rel=1e-9)
    assert sign_test_p(0, 0) == 1.0
    with pytest.raises(ValueError, match="task counts must be >= 0"):
        sign_test_p(-1, 2)


def test_a_clear_drop_is_a_collapse_with_its_numbers_and_line():
    """9 of 10 solved, then none: 9 tasks lost, 0 gained, p = 2^-9 = 0.00195 < 0.05, drop 0.9 >= 0.1."""
    v = judge_iteration(2, [_row([1] * 9 + [0])], [_row([0] * 10)], reference=1,
                        solved_advantage={"0": 0.12, "1": -0.31})  # JSON keys, as the validate marker stores them
    assert v.status == "collapse" and v.collapsed and v.reference == 1
    w = v.worst
    assert (w.n, w.before, w.after, w.lost, w.gained) == (10, 9.0, 0.0, 9, 0)
    assert w.p_value == pytest.approx(2.0 ** -9) and w.drop == pytest.approx(0.9)
    assert (v.level, v.pushed_down, v.solved_advantage) == (0.05, [1], {0: 0.12, 1: -0.31})
    assert v.line("iter-2 (rao-policy-smoke v3)", "rollback: iteration 3 trains from iteration 1's checkpoint") == (
        "collapse guard: iteration 2 held-out success 0.90 -> 0.00 on recursive/nest1 (paired exact sign test, "
        "9 tasks lost vs 0 gained of 10, p = 0.002 < 0.05; solved nodes' mean advantage < 0 at depth 1 (-0.31)): "
        "checkpoint iter-2 (rao-policy-smoke v3) is not promoted; rollback: iteration 3 trains from iteration 1's "
        "checkpoint")
    m = v.metrics()
    assert m["guard/collapsed"] == 1.0 and m["guard/has_reference"] == 1.0
    assert (m["guard/lost"], m["guard/gained"], m["guard/n"], m["guard/rows_tested"]) == (9.0, 0.0, 10.0, 1.0)
    assert m["guard/success_before"] == pytest.approx(0.9) and m["guard/success_after"] == 0.0
    assert m["guard/p_value"] == pytest.approx(0.001953125) and m["guard/solved_advantage_depth_1"] == -0.31


def test_the_collapse_the_campaign_saw_90_of_100_to_0():
    v = judge_iteration(2, [_row([1] * 90 + [0] * 10)], [_row([0] * 100)])
    assert v.collapsed and (v.worst.lost, v.worst.gained) == (90, 0)
    assert v.worst.p_value == pytest.approx(8.08e-28, rel=1e-2)  # 2^-90
    assert "0.90 -> 0.00" in v.line("iter-2") and "90 tasks lost vs 0 gained of 100, p = 8.1e-28 < 0.05" in v.line(
        "iter-2")


def test_noise_is_not_a_collapse():
    """2 lost, 1 gained of 10: p = P(Bin(3, 1/2) >= 2) = 0.5; the drop (0.1) alone decides nothing."""
    before = [1, 1, 1, 1, 0, 0, 0, 0, 1, 0]
    after = [0, 0, 1, 1, 1, 0, 0, 0, 1, 0]
    v = judge_iteration(3, [_row(before)], [_row(after)])
    assert v.status == "pass" and not v.collapsed
    assert (v.worst.lost, v.worst.gained) == (2, 1) and v.worst.p_value == pytest.approx(0.5)
    assert v.worst.drop == pytest.approx(0.1)
    with pytest.raises(ValueError, match="no collapse to report"):
        v.line("iter-3")


def test_a_rise_is_not_a_collapse():
    v = judge_iteration(1, [_row([0] * 10)], [_row([1] * 9 + [0])])
    assert v.status == "pass" and (v.worst.lost, v.worst.gained) == (0, 9)
    assert v.worst.p_value == pytest.approx(1.0) and v.worst.drop == pytest.approx(-0.9)
    assert v.metrics()["guard/collapsed"] == 0.0


def test_a_significant_dip_below_min_drop_is_not_a_collapse():
    """6 lost, 0 gained of 100: p = 2^-6 = 0.0156 < 0.05, but the drop is 0.06: a collapse only with a min_drop
    of at most 0.06."""
    before, after = [1] * 50 + [0] * 50, [0] * 6 + [1] * 44 + [0] * 50
    v = judge_iteration(4, [_row(before)], [_row(after)])
    assert v.worst.p_value == pytest.approx(1 / 64) and v.worst.drop == pytest.approx(0.06)
    assert v.status == "pass"
    assert judge_iteration(4, [_row(before)], [_row(after)], min_drop=0.05).collapsed


def test_the_level_is_shared_by_the_rows_bonferroni():
    """5 lost, 0 gained: p = 1/32 = 0.031 < 0.05 on one row, but not < 0.05 / 2 with a second (unchanged) row."""
    drop = ([1] * 5 + [0] * 5, [0] * 10)
    steady = [1, 0] * 5
    alone = judge_iteration(2, [_row(drop[0])], [_row(drop[1])])
    assert alone.collapsed and alone.level == 0.05
    two = judge_iteration(2, [_row(drop[0]), _row(steady, "nest2")], [_row(drop[1]), _row(steady, "nest2")])
    assert two.status == "pass" and two.level == pytest.approx(0.025) and len(two.rows) == 2
    assert two.worst.difficulty == "nest1" and two.worst.p_value == pytest.approx(1 / 32)
    assert "p = 0.031 >= 0.05/2" in two.test_text()


def test_the_collapsed_row_is_found_beside_a_steady_primary_one():
    """The champion rule reads one metric (the first difficulty); the guard tests every row, so a skill lost on
    the second difficulty is caught while the first holds."""
    steady = [1, 0] * 10
    v = judge_iteration(2, [_row(steady, "tier1"), _row([1] * 18 + [0] * 2, "tier1x2")],
                        [_row(steady, "tier1"), _row([0] * 20, "tier1x2")])
    assert v.collapsed and v.worst.name == "recursive/tier1x2" and v.level == pytest.approx(0.025)
    assert v.worst.p_value == pytest.approx(2.0 ** -18)


def test_unscored_and_unpaired_tasks_are_left_out():
    """Task t2 unscored in the new evaluation and t9 missing from it: 8 pairs, of which 6 lost."""
    before = {"mode": "recursive", "difficulty": "nest1", "per_task": {f"t{i}": 1 for i in range(10)}}
    after = {"mode": "recursive", "difficulty": "nest1",
             "per_task": {**{f"t{i}": 0 for i in range(6)}, "t2": None, "t6": 1, "t7": 1, "t8": 1}}
    w = judge_iteration(1, [before], [after]).worst
    assert (w.n, w.lost, w.gained, w.before, w.after) == (8, 5, 0, 8.0, 3.0)  # t0, t1, t3, t4, t5 lost
    assert w.p_value == pytest.approx(1 / 32)


def test_graded_outcomes_count_by_their_sign():
    v = judge_iteration(1, [_row([0.8, 0.5, 0.5, 1.0, 0.9])], [_row([0.3, 0.5, 0.2, 0.1, 0.0])])
    assert (v.worst.lost, v.worst.gained) == (4, 0) and v.worst.p_value == pytest.approx(1 / 16)
    assert v.worst.drop == pytest.approx((3.7 - 1.1) / 5)


@pytest.mark.parametrize("before, reason", [
    (None, "no reference evaluation"),
    ([{"mode": "recursive", "difficulty": "nest1", "per_task": {}}], "the reference evaluation has no per-task "
                                                                    "outcomes"),
    ([_row([1, 1], "other")], "no task scored in both evaluations"),
])
def test_a_missing_previous_evaluation_is_no_reference_and_no_collapse(before, reason):
    v = judge_iteration(1, before, [_row([0, 0])], reference=0, solved_advantage={1: -0.2})
    assert (v.status, v.reason, v.collapsed, v.worst, v.rows) == ("no_reference", reason, False, None, [])
    assert v.metrics() == {"guard/collapsed": 0.0, "guard/has_reference": 0.0, "guard/solved_advantage_depth_1": -0.2}


@pytest.mark.parametrize("kw, match", [
    ({"alpha": 0.0}, r"alpha must be in \(0, 1\), got 0.0"),
    ({"alpha": 1.0}, r"alpha must be in \(0, 1\)"),
    ({"min_drop": 1.5}, r"min_drop must be in \[0, 1\], got 1.5"),
    ({"solved_advantage": {"root": 0.1}}, "depths must be integers"),
])
def test_bad_settings_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        judge_iteration(1, [_row([1])], [_row([0])], **kw)


@pytest.mark.parametrize("value", [2.0, -0.5, math.nan, "1"])
def test_an_outcome_outside_0_1_is_refused_naming_the_task(value):
    with pytest.raises(ValueError, match=r"new evaluation recursive/nest1, task t1: outcome .* is not a number in "
                                         r"\[0, 1\]"):
        judge_iteration(1, [_row([1, 1])], [_row([1, value])])


def test_the_config_section_defaults_and_one_line_errors():
    from rao_core.config import CampaignConfig, ConfigError, load_config

    g = CampaignConfig().guard
    assert (g.enabled, g.alpha, g.min_drop, g.action) == (True, 0.05, 0.1, "rollback")
    assert all(f.description for f in type(g).model_fields.values())
    cfg = load_config("configs/cpu-smoke.yaml", {"guard.action": "stop", "guard.alpha": 0.01})
    assert (cfg.guard.action, cfg.guard.alpha) == ("stop", 0.01)
    with pytest.raises(ConfigError, match=r"guard\.action.*'rollback', 'stop' or 'warn'"):
        load_config("configs/cpu-smoke.yaml", {"guard.action": "retry"})
    with pytest.raises(ConfigError, match=r"guard\.alpha"):
        load_config("configs/cpu-smoke.yaml", {"guard.alpha": 0})


def _bench(benchmark: str, outcomes: list[float | None], difficulty: str = "easy") -> dict:
    """An evaluation row of ``benchmark`` (EvalRow.table_row with its benchmark named)."""
    return {"benchmark": benchmark, **_row(outcomes, difficulty)}


def test_only_the_deciding_benchmarks_rows_are_tested_and_the_others_are_reported():
    """A suite of three benchmarks: Oolong loses 9 of 10 tasks (p = 2^-9), TextCraft and DeepDive hold. Deciding on
    TextCraft the iteration passes, tested at alpha / 1, and Oolong's loss is reported with its numbers; deciding
    on Oolong it is a collapse named by its benchmark. A row without a benchmark (a record written before rows
    named theirs) is the deciding benchmark's and pairs with its new row."""
    before = [_bench("textcraft", [1, 0] * 5, "tier1"), _bench("oolong", [1] * 9 + [0], "mixed"),
              _bench("deepdive", [1, 1, 0, 0])]
    after = [_bench("textcraft", [1, 0] * 5, "tier1"), _bench("oolong", [0] * 10, "mixed"),
             _bench("deepdive", [1, 1, 0, 0])]
    v = judge_iteration(2, before, after, benchmark="textcraft")
    assert v.status == "pass" and v.level == 0.05 and [r.name for r in v.rows] == ["textcraft/recursive/tier1"]
    assert [r.name for r in v.reported] == ["oolong/recursive/mixed", "deepdive/recursive/easy"]
    oolong = v.reported[0]
    assert (oolong.lost, oolong.gained, oolong.n) == (9, 0, 10) and oolong.p_value == pytest.approx(2.0 ** -9)
    assert v.reported_text() == ("reported, not deciding: oolong/recursive/mixed 0.90 -> 0.00 (9 lost vs 0 gained "
                                 "of 10, p = 0.002); deepdive/recursive/easy 0.50 -> 0.50 (0 lost vs 0 gained of 4, "
                                 "p = 1)")
    v = judge_iteration(2, before, after, benchmark="oolong")
    assert v.collapsed and v.worst.name == "oolong/recursive/mixed" and "on oolong/recursive/mixed (" in v.line("x")
    assert [r.name for r in v.reported] == ["textcraft/recursive/tier1", "deepdive/recursive/easy"]
    old = [{k: x for k, x in r.items() if k != "benchmark"} for r in before[:1]]  # the training benchmark's, unnamed
    v = judge_iteration(2, old, after, benchmark="textcraft")
    assert v.status == "pass" and [r.name for r in v.rows] == ["textcraft/recursive/tier1"] and v.reported == []
    v = judge_iteration(2, before[1:], after, benchmark="textcraft")  # no deciding row in the reference
    assert v.status == "no_reference" and v.reason == "the reference evaluation has no per-task outcomes"
    assert [r.name for r in v.reported] == ["oolong/recursive/mixed", "deepdive/recursive/easy"]
    assert judge_iteration(2, before, after, benchmark="").collapsed  # no deciding benchmark named: every row tests
