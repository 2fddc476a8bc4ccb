"""The preregistered verdict over seeds (research/records.py ``primary_verdict``, ``holm``), the depth-limited
control pooled over seeds and named after its experiment (research/studies.py), and the seeds section that
writes both (research/experiment.py ``write_seeds_section``): values worked out by hand."""

from __future__ import annotations

import json

import pytest

from rao_core.config import ConfigError, load_config
from research.designs import ARM_MODES
from research.experiment import write_seeds_section
from research.records import holm, paired_sign_test, primary_verdict, verdict_markdown
from research.studies import control_name, depth_control_pooled, depth_control_seeds_markdown

P1 = {"arm": "recursive", "against": "warm_start", "difficulty": "nest2"}
P2 = {"arm": "recursive", "against": "single", "difficulty": "nest2"}


def _record(seed: int, outcomes: dict[tuple[str, int], list[int]], experiment: str = "deep") -> dict:
    """A seed's record: for each (arm, iteration) the 0/1 outcomes of tasks t0, t1, ... on nest2; the config
    preregisters P1 with P2 as co-primary."""
    pts = [{"arm": a, "iteration": i, "difficulty": "nest2", "mode": ARM_MODES[a], "n": len(v),
            "successes": float(sum(v)), "success": sum(v) / len(v), "per_task": {f"t{k}": x for k, x in enumerate(v)}}
           for (a, i), v in outcomes.items()]
    return {"seed": seed, "experiment": experiment if seed == 0 else f"{experiment}-seed{seed}", "points": pts,
            "endpoint": dict(P1, mode="recursive"), "config_values": {"eval": {"co_primary": [dict(P2)]}}}


def _seeds(rec_last: list[int], warm: list[int], single: list[int], seeds=(0, 1, 2)) -> list[dict]:
    return [_record(s, {("recursive", 0): warm, ("recursive", 12): rec_last, ("single", 12): single}) for s in seeds]


def test_holm_by_hand():
    assert holm([0.01, 0.04]) == [True, True]  # 0.01 < 0.025, then 0.04 < 0.05
    assert holm([0.04, 0.01]) == [True, True]  # the input's order is kept
    assert holm([0.03, 0.04]) == [False, False]  # the smaller fails 0.025: both kept
    assert holm([0.001, 0.2]) == [True, False]
    assert holm([0.01, 0.02, 0.04]) == [True, True, True]  # 0.01 < 0.05/3, 0.02 < 0.05/2, 0.04 < 0.05
    assert holm([0.02, 0.02, 0.02]) == [False, False, False]  # 0.02 >= 0.05/3
    assert holm([0.05]) == [False] and holm([]) == []  # strict: p = alpha is not rejected


def test_paired_sign_test_by_hand():
    # 2 seeds, tasks a-d: a better in both, b better in one and worse in the other (D = 0), c worse in one
    t = paired_sign_test([({"a": 1, "b": 1, "c": 0, "d": 1}, {"a": 0, "b": 0, "c": 1, "d": 1}),
                          ({"a": 1, "b": 0, "c": 0, "d": 1, "e": 1}, {"a": 0, "b": 1, "c": 0, "d": 1, "e": 0})])
    assert (t["tasks_paired"], t["tasks_arm_better"], t["tasks_against_better"]) == (4, 1, 1)  # e: one seed only
    assert t["p"] == pytest.approx(0.75)  # P(X >= 1 | n = 2, 1/2)
    assert paired_sign_test([({"a": 1}, {"a": 1})])["p"] == 1.0 and paired_sign_test([])["tasks_paired"] == 0


def test_both_primaries_hold_supported_one_mixed_none_not():
    # 10 tasks: the recursive arm solves t0-t7 at iteration 12, t0-t1 at its warm start, the single arm t0-t6
    v = primary_verdict(_seeds([1] * 8 + [0] * 2, [1] * 2 + [0] * 8, [1] * 7 + [0] * 3), [P1, P2])
    p1, p2 = v["primaries"]
    assert p1["comparison"]["p_tasks_sign_test"] == pytest.approx(0.5 ** 6)  # 6 of 6 better: 0.0156 < 0.025
    assert p2["comparison"]["p_tasks_sign_test"] == pytest.approx(0.5)  # 1 of 1 better
    assert (p1["holm_rejected"], p1["holds"], p2["holm_rejected"], p2["holds"]) == (True, True, False, False)
    assert v["verdict"] == "mixed"
    # the single arm at the warm start's level: 6 of 6 better on both -> both p = 1/64 < 0.025: supported
    v = primary_verdict(_seeds([1] * 8 + [0] * 2, [1] * 2 + [0] * 8, [1] * 2 + [0] * 8), [P1, P2])
    assert [r["holds"] for r in v["primaries"]] == [True, True] and v["verdict"] == "supported"
    md = verdict_markdown(v).splitlines()
    assert md[-1] == "**Verdict: supported.**"
    assert "| recursive vs single | nest2 | 24/30 | 6/30 | +0.60, +0.60, +0.60 | 0.0156 | yes | yes |" in md
    # nothing learned: neither holds
    assert primary_verdict(_seeds([1] * 2 + [0] * 8, [1] * 2 + [0] * 8, [1] * 2 + [0] * 8),
                           [P1, P2])["verdict"] == "not supported"


def test_a_seed_going_the_other_way_breaks_a_primary_even_with_a_small_p():
    # seeds 0 and 1 solve t0-t9 at iteration 12 (warm start none); seed 2 solves none and its warm start t0
    recs = [_record(s, {("recursive", 0): [0] * 10, ("recursive", 12): [1] * 10, ("single", 12): [0] * 10})
            for s in (0, 1)]
    recs.append(_record(2, {("recursive", 0): [1] + [0] * 9, ("recursive", 12): [0] * 10, ("single", 12): [0] * 10}))
    v = primary_verdict(recs, [P1, P2])
    p1 = v["primaries"][0]
    assert p1["comparison"]["tasks_arm_better"] == 10 and p1["holm_rejected"] is True  # t0: (1 + 1 - 1) / 3 > 0 ...
    assert p1["all_seeds_positive"] is False and p1["holds"] is False  # ... but seed 2 fell by 0.10


def test_an_arm_not_run_yet_is_incomplete_and_said_so():
    recs = [_record(s, {("recursive", 0): [0] * 4, ("recursive", 12): [1] * 4}) for s in (0, 1)]
    v = primary_verdict(recs, [P1, P2])
    assert v["verdict"] == "incomplete" and v["primaries"][1]["comparison"] is None
    md = verdict_markdown(v)
    assert "| recursive vs single | nest2 | not run |" in md and "| 0.0625 | - | - |" in md
    assert primary_verdict(recs, []) is None


def test_control_named_after_its_experiment_and_seed():
    assert control_name({"experiment": "textcraft-nested"}) == "textcraft-nested-control"
    assert control_name({"experiment": "textcraft-nested-seed1"}) == "textcraft-nested-control-seed1"
    assert control_name({"experiment": "textcraft-deeper-seed2"}) == "textcraft-deeper-control-seed2"
    assert control_name({}) == "textcraft-nested-control"


def _control(full: list[int], ctrl: list[int], iteration: int = 12) -> dict:
    ids = [f"t{k}" for k in range(len(full))]
    return {"reference": {str(iteration): {"n": len(full), "successes": sum(full), "success": sum(full) / len(full),
                                           "ci95": "[0, 1]", "per_task": dict(zip(ids, full))}},
            "points": [{"iteration": 0, "n": 1, "successes": 0, "success": 0.0, "ci95": [0, 1], "per_task": {"t0": 0}},
                       {"iteration": iteration, "n": len(ctrl), "successes": sum(ctrl),
                        "success": sum(ctrl) / len(ctrl), "ci95": [0, 1], "per_task": dict(zip(ids, ctrl))}]}


def test_the_control_pooled_over_seeds_by_hand(tmp_path):
    folder = tmp_path / "docs/results"
    folder.mkdir(parents=True)
    # seed 0: full depth solves t0-t4, the control t0; seed 1: full t0-t3, control t0-t1 and t5
    (folder / "deep-control.json").write_text(json.dumps(_control([1] * 5 + [0] * 3, [1] + [0] * 7)))
    (folder / "deep-control-seed1.json").write_text(json.dumps(_control([1] * 4 + [0] * 4, [1, 1, 0, 0, 0, 1, 0, 0])))
    recs = [{"experiment": "deep", "seed": 0}, {"experiment": "deep-seed1", "seed": 1},
            {"experiment": "deep-seed2", "seed": 2}]  # seed 2 has no control record: left out
    c = depth_control_pooled(recs, root=tmp_path)
    assert c["seeds"] == [0, 1] and c["full"] == [9, 16] and c["control"] == [4, 16]
    assert [s["iteration"] for s in c["per_seed"]] == [12, 12]  # the last controlled iteration, not the warm start
    # per task D: t1 (1-0 + 1-1)/2 > 0, t2 and t3 > 0, t4 (1 + 0)/2 > 0, t5 (0 - 1)/2 < 0
    assert (c["tasks_paired"], c["tasks_arm_better"], c["tasks_against_better"]) == (8, 4, 1)
    assert c["p"] == pytest.approx(6 / 32) and c["depth_shown"] is False  # P(X >= 4 | 5, 1/2)
    assert depth_control_pooled(recs[2:], root=tmp_path) is None
    md = depth_control_seeds_markdown(recs, root=tmp_path).splitlines()
    assert md[-1] == ("Pooled over seeds 0, 1 (last controlled iteration): full depth 9/16, max_depth 1 4/16; tasks "
                      "full depth solved more / fewer 4 / 1 of 8, p = 0.1875 (one-sided sign test): depth is not "
                      "shown to be what solved them.")


def test_the_seeds_section_writes_the_verdict_record_only_with_co_primaries(tmp_path):
    (tmp_path / "docs/results").mkdir(parents=True)
    (tmp_path / "docs/results.md").write_text("# Results\n")
    recs = _seeds([1] * 8 + [0] * 2, [1] * 2 + [0] * 8, [1] * 2 + [0] * 8)
    md = write_seeds_section("deep", recs, root=tmp_path)
    assert "### Preregistered verdict" in md and "**Verdict: supported.**" in md
    v = json.loads((tmp_path / "docs/results/deep-verdict.json").read_text())
    assert v["verdict"] == "supported" and v["seeds"] == [0, 1, 2] and v["control"] is None
    assert v["records"] == ["docs/results/deep.json", "docs/results/deep-seed1.json", "docs/results/deep-seed2.json"]
    assert v["primaries"][1]["comparison"]["pooled"]["arm"] == [24.0, 30]  # a figure the claims table can link
    for r in recs:  # one endpoint alone: the seeds table judges it; no verdict, no record
        r["config_values"] = {}
    (tmp_path / "docs/results/deep-verdict.json").unlink()
    assert "Preregistered verdict" not in write_seeds_section("deep", recs, root=tmp_path)
    assert not (tmp_path / "docs/results/deep-verdict.json").exists()


def test_co_primary_needs_an_endpoint_and_an_evaluated_difficulty():
    base = "configs/experiment-textcraft-deeper.yaml"
    assert [e.against for e in load_config(base).eval.co_primary] == ["single"]
    with pytest.raises(ConfigError, match="co_primary is set without eval.endpoint"):
        load_config(base, ["eval.endpoint=null"])
    with pytest.raises(ConfigError, match=r"co_primary\[0\].difficulty = 'nest3'"):
        load_config(base, ["eval.co_primary=[{arm: recursive, difficulty: nest3, mode: recursive, against: single, "
                           "test: sign, n: 100}]"])


def test_an_endpoint_names_an_evaluated_iteration():
    """eval.every 3 of 3 evaluates after 0 and 3: an endpoint at 2 or 4 would have no point to judge."""
    base = "configs/experiment-textcraft-deeper.yaml"
    assert load_config(base, ["eval.endpoint.iteration=3"]).eval.endpoint.iteration == 3
    for it in (2, 4):
        with pytest.raises(ConfigError, match=rf"eval.endpoint.iteration = {it} is not evaluated: a campaign of 3 "
                                              r"iterations with eval.every 3 evaluates after \[0, 3\]"):
            load_config(base, [f"eval.endpoint.iteration={it}"])
    with pytest.raises(ConfigError, match=r"co_primary\[0\].iteration = 7 is not evaluated"):
        load_config(base, ["eval.co_primary=[{arm: recursive, difficulty: nest2, mode: recursive, against: single, "
                           "iteration: 7, test: sign, n: 100}]"])
    assert load_config(base, ["eval.endpoint.iteration=2", "eval.every=1"]).eval.endpoint.iteration == 2
