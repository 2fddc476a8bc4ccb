"""The authors' released setting is the default (docs/algorithm.md "Defaults: the authors' released setting"):
per-environment delegation caps, the zero-variance filter, and what a fully solved group trains on."""

import pytest

from rao_core.envs import env_class
from rao_core.samples import AlgoSettings, build_samples
from research.stable_rao import ARMS, arm_samples, mcnemar

from tests.algo.helpers import node, tree

# environment -> the cap the authors ship (platoon 0.4.0 platoon/rewards.py: 0.0 for textcraft-synth@1;
# ApGa/platoon 01fcd20 train_areal*.py: TextCraft-Synth 0.0, DeepDive 0.0, Oolong 0.4, ART-E 0.4)
AUTHORS_CAP = {"textcraft-synth": 0.0, "deepdive": 0.0, "oolong": 0.4, "arte": 0.4}


@pytest.mark.parametrize("env", sorted(AUTHORS_CAP))
def test_the_default_cap_of_each_environment_is_the_authors(env):
    assert env_class(env).delegation_cap == AUTHORS_CAP[env]
    assert AlgoSettings().bonus_weight(env) == AUTHORS_CAP[env]


def test_the_defaults_filter_as_the_authors_do():
    algo = AlgoSettings()
    assert algo.filter_zero_variance_groups and algo.filter_errors
    assert (algo.advantage, algo.depth_weights, algo.bonus) == ("leave_one_out", True, "useful")


def _solved_group(g: int = 4):
    """G trees of one RL task, each a root with two children, every node solved."""
    return [tree(f"t{k}", "task", [node("r", None, 0, 1.0), node("a", "r", 1, 1.0), node("b", "r", 1, 1.0)])
            for k in range(g)]


def test_a_group_where_every_node_succeeded_moves_nothing_under_the_default():
    algo = AlgoSettings()
    cap = algo.bonus_weight("textcraft-synth")
    unfiltered = build_samples(_solved_group(), cap, bonus=algo.bonus)
    assert [s.advantage for s in unfiltered.samples] == [0.0] * 12  # roots and children alike
    kept = build_samples(_solved_group(), cap, bonus=algo.bonus,
                         filter_zero_variance_groups=algo.filter_zero_variance_groups)
    assert len(kept) == 0 and kept.stats.dropped_uniform_groups == 1
    # the old setting (cap 0.4, no filter): every root R = 1.4 = its baseline, every solved child pushed down by 0.4
    old = build_samples(_solved_group(), 0.4, bonus="useful")
    assert sorted({round(s.advantage, 6) for s in old.samples}) == [-0.4, 0.0]
    assert old.stats.mean_advantage_solved_per_depth == {0: pytest.approx(0.0), 1: pytest.approx(-0.4)}


class _Cfg:
    """The two fields of a campaign config that arm_samples reads."""

    def __init__(self) -> None:
        self.algo = AlgoSettings()
        self.tasks = type("T", (), {"env": "textcraft-synth"})()


def test_the_check_arms_rebuild_the_shared_trees_with_their_own_credit():
    trees = _solved_group() + [tree("f", "task2", [node("r", None, 0, 0.0), node("a", "r", 1, 1.0)]),
                               tree("s", "task2", [node("r", None, 0, 1.0), node("a", "r", 1, 1.0)])]
    old, default, useful = (arm_samples(trees, arm, _Cfg()) for arm in ("old", "default", "useful"))
    assert len(old) == 16 and old.stats.dropped_uniform_groups == 0  # every node of both groups
    # default: the solved group is dropped; task2 (no bonus): tree f's baseline is s's root (1), s's is f's (0):
    # f's root 0 - 1, f's solved child 1 - 1, s's root and child 1 - 0
    assert default.stats.dropped_uniform_groups == 1
    assert sorted(round(s.advantage, 6) for s in default.samples) == [-1.0, 0.0, 1.0, 1.0]
    # useful (cap 0.4): in the solved group roots have R 1.4 and children 1.0, so it is not uniform: not dropped,
    # and its solved children get 1.0 - 1.4 = -0.4
    assert useful.stats.dropped_uniform_groups == 0
    assert useful.stats.mean_advantage_solved_per_depth[1] < 0
    assert ARMS["default"][1]["steps_per_batch"] == 1 and ARMS["old"][1]["max_steps"] == 12


def test_mcnemar_pairs_tasks_by_id_and_tests_the_discordant_ones():
    first = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0, "e": None, "f": 1.0}
    second = {"a": 0.0, "b": 0.0, "c": 1.0, "d": 1.0, "e": 1.0, "g": 0.0}
    r = mcnemar(first, second)
    assert (r["paired_tasks"], r["up"], r["down"]) == (4, 1, 2)
    assert r["p_two_sided"] == pytest.approx(1.0)  # binomial(3, 1/2): P(X <= 1) * 2 = 1
    assert mcnemar({"a": 1.0}, {"a": 1.0})["p_two_sided"] == 1.0
    many = mcnemar({str(k): 1.0 for k in range(10)}, {str(k): 0.0 for k in range(10)})
    assert many["down"] == 10 and many["p_two_sided"] == pytest.approx(2 / 1024, abs=1e-6)


def test_the_check_table_reads_every_figure_from_the_record():
    from research.stable_rao import check_markdown

    rec = {"points": [{"checkpoint": "warm_start", "successes": 97.0, "n": 100, "ci95": [0.9152, 0.9897]},
                      {"checkpoint": "old-s0", "successes": 40.0, "n": 100, "ci95": [0.31, 0.50]}],
           "training": {"old-s0": {"optimizer_steps": 12, "samples": 144, "signal_samples": 140,
                                   "mean_advantage_solved_per_depth": {"0": 0.05, "1": -0.349}}},
           "comparisons": [{"checkpoint": "old-s0", "vs": "warm_start", "up": 1, "down": 58, "p_two_sided": 1.2e-15},
                           {"checkpoint": "old-s0", "vs": "default-s0", "up": 0, "down": 50, "p_two_sided": 0.0123}]}
    lines = check_markdown(rec).splitlines()
    assert lines[2] == "| warm_start | - | - | - | 97/100 [0.92, 0.99] | - | - |"
    assert lines[3] == ("| old-s0 | 12 | 144 (140) | +0.05 / -0.35 | 40/100 [0.31, 0.50] | +1 / -58, p = 1.2e-15 "
                        "| +0 / -50 (default-s0), p = 0.012 |")


def test_comparisons_pair_each_arm_with_the_warm_start_and_the_default_of_its_seed_or_seed_0():
    from research.stable_rao import comparisons

    pt = lambda label, outs: {"checkpoint": label, "per_task": dict(enumerate(outs))}  # noqa: E731
    rec = {"points": [pt("warm_start", [1, 1, 1, 1]), pt("default-s0", [1, 1, 1, 0]), pt("old-s1", [0, 0, 0, 0])]}
    rows = {(r["checkpoint"], r["vs"]): (r["up"], r["down"]) for r in comparisons(rec)}
    assert rows == {("default-s0", "warm_start"): (0, 1), ("old-s1", "warm_start"): (0, 4),
                    ("old-s1", "default-s0"): (0, 3)}


def test_the_check_plot_is_written_at_its_size(tmp_path):
    import matplotlib.image

    from research.stable_rao import check_png

    rec = {"difficulty": "nest1", "points": [
        {"checkpoint": "warm_start", "success": 0.97, "ci95": [0.92, 0.99], "n": 100, "delegation_rate": 0.99},
        {"checkpoint": "old-s0", "success": 0.01, "ci95": [0.0, 0.05], "n": 100, "delegation_rate": 0.08}]}
    img = matplotlib.image.imread(check_png(rec, tmp_path / "c.png"))
    assert img.shape[:2] == (385, 770)  # 7 x 3.5 inches at 110 dpi
