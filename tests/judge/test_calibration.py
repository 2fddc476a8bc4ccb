"""Calibration against the exact verifier on a fabricated TextCraft tree file."""

from __future__ import annotations

import math

import pytest

from rao_core.judge import calibrate_sync
from rao_core.tree import read_trees, write_trees
from tests.judge.conftest import node, tree
from tests.judge.fake_openai import FakeOpenAI


def says_yes_if_claimed(body, _idx):
    """A naive judge: believes the agent's final message ('crafted' -> yes)."""
    result = body["messages"][1]["content"].split("## Agent's final message")[1].split("##")[0]
    return 200, '{"verdict": "yes"}' if "crafted" in result else "VERDICT: no", {}


def test_calibration_counts(config, tmp_path):
    # truth (verifier) vs judge (believes 'crafted'):
    #   r  1.0  crafted -> TP      a  1.0 crafted -> TP      b 0.0 crafted (false claim) -> FP
    #   c  0.0  failed  -> TN      d  1.0 'ok'    -> FN      e 0.0 unfinished -> rule, not counted
    t1 = tree("textcraft-synth", [
        node("r", None, verifier=1.0, result="crafted all"),
        node("a", "r", depth=1, verifier=1.0, result="crafted 2 m1_i3"),
        node("b", "r", depth=1, verifier=0.0, result="crafted 4 c2_i1"),
        node("c", "a", depth=2, verifier=0.0, result="failed: missing m0_i1"),
    ], tree_id="t1")
    t2 = tree("textcraft-synth", [node("r", None, verifier=1.0, result="ok"),
                                  node("e", "r", depth=1, verifier=0.0, finished=False)], tree_id="t2")
    path = write_trees(tmp_path / "trees.jsonl", [t1, t2])
    with FakeOpenAI(says_yes_if_claimed) as srv:
        rep = calibrate_sync(read_trees(path), config.model_copy(update={"base_url": srv.base_url}))
    o = rep.overall
    assert (o.tp, o.fp, o.tn, o.fn) == (2, 1, 1, 1) and o.n == 5 and len(srv.requests) == 5
    assert o.accuracy == pytest.approx(3 / 5)
    assert o.false_positive_rate == pytest.approx(1 / 2)  # FP / (FP + TN)
    assert o.false_negative_rate == pytest.approx(1 / 3)  # FN / (FN + TP)
    assert rep.unfinished_rule == 1 and rep.nodes_with_truth == 6 and rep.failures == 0
    assert (rep.by_depth[0].tp, rep.by_depth[0].fn) == (1, 1) and rep.by_depth[2].tn == 1
    assert rep.prompt_version.startswith("textcraft-synth/v1#")


def test_calibration_needs_truth(config):
    with pytest.raises(ValueError, match="nothing to calibrate"):
        calibrate_sync([tree("oolong", [node("r", None)])], config)


def test_empty_confusion_rates_are_nan():
    from rao_core.judge import Confusion

    c = Confusion(tp=3)
    assert c.accuracy == 1.0 and c.false_negative_rate == 0.0 and math.isnan(c.false_positive_rate)
    assert math.isnan(Confusion().accuracy)
