"""Our delegation bonus and baselines checked against the authors' reference code, platoon 0.4.0.

platoon needs Python >= 3.12 and is never installed here. ``make setup`` (scripts/setup.sh, step 4) downloads its
wheel to var/reference/; these tests read ``platoon/rewards.py`` straight out of it (the module has no runtime
imports) and run its reward processor ``delegation_capped`` (``reward_processor: platoon-delegation``) on scripted
trajectories, in the shape platoon's trace gives it: the spawning step of each child carries
``reward/subagent_launched`` += 1 and ``reward/subagent_succeeded`` += the child's grade
(platoon/harness/agents.py), the last step ``reward/success``. Its score is
``success + DELEGATION_REWARD_CAP * succeeded / launched``; ours is
``rao_core.rewards.local_node_reward(s, children, cap, bonus="useful")``. Their module constant is 0.0 in 0.4.0;
it is monkeypatched to 0.4 (the cap of ApGa/platoon's older reward processors) and 0.0.

Their baselines live in modules that import tinker and torch, so they are restated here as pure functions,
each citing its file (marked "restatement"), and compared with ``rao_core.advantages.group_baselines``.
The table these tests pin: docs/algorithm/authors-code.md, "Ours vs the authors' code vs the paper".
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from rao_core.advantages import group_baselines
from rao_core.rewards import local_node_reward

ROOT = Path(__file__).resolve().parents[2]
WHEEL = ROOT / "var" / "reference" / "platoon-0.4.0-py3-none-any.whl"
#: sha256 of the wheel PyPI serves for platoon==0.4.0 (checked when the reference comparison was written).
WHEEL_SHA256 = "dab1dbe30721f54928b443967bac2a25b0d87806c56a078aebe91b8da85c50c5"
CAPS = (0.4, 0.0)


@pytest.fixture(scope="module")
def ref() -> ModuleType:
    """platoon 0.4.0's ``platoon/rewards.py``, executed from the wheel as module ``platoon_rewards_ref``."""
    if not WHEEL.is_file():
        pytest.fail(f"{WHEEL.relative_to(ROOT)} is missing: run `make setup` (scripts/setup.sh downloads the "
                    "authors' reference wheel, platoon 0.4.0, from PyPI), then run this test again")
    digest = hashlib.sha256(WHEEL.read_bytes()).hexdigest()
    assert digest == WHEEL_SHA256, f"{WHEEL.name}: sha256 {digest}, expected {WHEEL_SHA256}; delete it, run make setup"
    with zipfile.ZipFile(WHEEL) as z:
        source = z.read("platoon/rewards.py").decode()
    spec = importlib.util.spec_from_loader("platoon_rewards_ref", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{WHEEL}/platoon/rewards.py", "exec"), module.__dict__)  # noqa: S102 - pinned file
    return module


def trajectory(success: float, children: list[float], *, same_step: bool = False) -> dict:
    """A trajectory dict as ``delegation_capped`` reads it: one spawning step per child (or one step for all of
    them, an ``asyncio.gather``), then the last step with the agent's grade ``reward/success``.
    ``children``: each launched child's grade (0.0 for one that never finished: platoon counts it launched and
    adds ``float(outcome.reward)`` or 0.0, platoon/harness/agents.py)."""
    if same_step and children:
        spawn = [{"reward/subagent_launched": len(children), "reward/subagent_succeeded": float(sum(children))}]
    else:
        spawn = [{"reward/subagent_launched": 1, "reward/subagent_succeeded": float(s)} for s in children]
    steps = [{"misc": {"reward_misc": rm}} for rm in spawn]
    steps.append({"misc": {"reward_misc": {"reward/success": float(success)}}})
    return {"reward": float(success), "steps": steps}


def theirs(ref: ModuleType, monkeypatch: pytest.MonkeyPatch, cap: float, success: float, children: list[float],
           **kw: bool) -> float:
    monkeypatch.setattr(ref, "DELEGATION_REWARD_CAP", cap)
    score, components = ref.delegation_capped(trajectory(success, children, **kw))
    assert set(ref.COMPONENTS) <= set(components)
    return score


def test_reference_wheel_pins_the_facts_of_the_table(ref):
    # docs/algorithm.md: platoon 0.4.0 ships the processor with cap 0, so textcraft-synth@1 trains on success alone
    assert ref.DELEGATION_REWARD_CAP == 0.0
    assert ref.COMPONENTS == ("reward/success", "reward/subagent_launched", "reward/subagent_succeeded")
    # a trajectory without reward_misc scores its reward; every component is reported (0 by default)
    assert ref.delegation_capped({"reward": 0.7, "steps": []}) == (
        0.7, {"reward/success": 0.7, "reward/subagent_launched": 0.0, "reward/subagent_succeeded": 0.0})


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize(("name", "success", "children", "by_hand_at_04"), [
    ("direct solve", 1.0, [], 1.0),                            # no child: the success alone
    ("direct failure", 0.0, [], 0.0),
    ("forward, child succeeds", 1.0, [1.0], 1.4),               # 1 + 0.4 * 1/1
    ("padding: 5 trivial successful children", 1.0, [1.0] * 5, 1.4),  # 1 + 0.4 * 5/5
    ("padding a failed task", 0.0, [1.0] * 5, 0.4),            # 0 + 0.4 * 5/5
    ("forward, then fail", 0.0, [0.0], 0.0),                    # 0 + 0.4 * 0/1
    ("one child never finished", 1.0, [1.0, 0.0], 1.2),        # launched 2, succeeded 1: 1 + 0.4 * 1/2
    ("graded 0.5", 1.0, [0.5, 1.0], 1.3),                       # 1 + 0.4 * 1.5/2
])
def test_useful_rule_with_every_child_credited_is_their_delegation_capped(ref, monkeypatch, cap, name, success,
                                                                          children, by_hand_at_04):
    expected = by_hand_at_04 if cap == 0.4 else success  # cap 0: the success alone
    ours = local_node_reward(success, children, cap, bonus="useful", credited=[True] * len(children))
    assert ours == pytest.approx(expected), name
    assert theirs(ref, monkeypatch, cap, success, children) == pytest.approx(expected), name
    # children launched together in one cell (one spawning step) score the same in theirs
    assert theirs(ref, monkeypatch, cap, success, children, same_step=True) == pytest.approx(expected), name


@pytest.mark.parametrize(("name", "success", "children", "credited", "ours_by_hand", "theirs_by_hand"), [
    # forwarding the whole goal to one child that solves it: theirs credits it in full (1 + 0.4 * 1/1);
    # ours, with the environment's verdict at launch (Node.no_bonus -> credited False), gives no bonus
    ("forward, child succeeds", 1.0, [1.0], [False], 1.0, 1.4),
    # padding a solved task with 5 trivial successful children: theirs 1 + 0.4 * 5/5, ours 1 + 0.4 * 0/5
    ("padding a solved task", 1.0, [1.0] * 5, [False] * 5, 1.0, 1.4),
    # padding a failed task: theirs 0 + 0.4 * 5/5 = 0.4 for a failure; ours 0
    ("padding a failed task", 0.0, [1.0] * 5, [False] * 5, 0.0, 0.4),
    # one useful child and 5 padding children: padding dilutes ours (1 + 0.4 * 1/6) and gains nothing in theirs
    ("useful child + 5 padding", 1.0, [1.0] * 6, [True] + [False] * 5, 1.0 + 0.4 / 6, 1.4),
])
def test_our_anti_farming_rule_is_where_we_depart(ref, monkeypatch, name, success, children, credited,
                                                  ours_by_hand, theirs_by_hand):
    # Nothing in their platoon/rewards.py refuses a forwarded goal or a padding child: theirs relies on the cap
    # (0 for textcraft-synth@1 in 0.4.0) and on judges (under agents.child_grading: verifier, the behaviour judge
    # of platoon/harness/verify.py can zero a child's score) to keep farming from paying. Ours decides it exactly
    # at launch (Environment.bonus_exclusion), so the credited flag is the only difference here.
    ours = local_node_reward(success, children, 0.4, bonus="useful", credited=credited)
    assert ours == pytest.approx(ours_by_hand), name
    honest = [s for s, c in zip(children, credited) if c]  # the same node without its farming children
    assert ours <= local_node_reward(success, honest, 0.4, bonus="useful"), f"{name}: farming pays"
    assert theirs(ref, monkeypatch, 0.4, success, children) == pytest.approx(theirs_by_hand), name


def test_unscored_child_is_ours_alone(ref, monkeypatch):
    # A failed judgement (None) is left out of our numerator and denominator: 1 + 0.4 * 1/1. Theirs has no
    # unscored child: a child whose outcome has no reward adds 0.0 to succeeded and 1 to launched (agents.py),
    # which is our "never finished" case above: 1 + 0.4 * 1/2.
    assert local_node_reward(1.0, [1.0, None], 0.4, bonus="useful") == pytest.approx(1.4)
    assert theirs(ref, monkeypatch, 0.4, 1.0, [1.0, 0.0]) == pytest.approx(1.2)


# ---- baselines: pure restatements of the authors' code (not imported: those modules need tinker / torch) ----

def platoon040_group_baselines(task_rewards: list[float], valid: list[bool], *, leave_one_out: bool) -> list[float]:
    """Restatement of platoon 0.4.0 platoon/train/tinker/workflows/group_rollout_workflow.py ``group_baselines``:
    completed roots only; the group mean, or with ``leave_one_out_baseline`` the mean of the other completed
    roots; a singleton completed root is centered on itself; an interrupted root gets the completed mean."""
    completed = [r for r, v in zip(task_rewards, valid, strict=True) if v]
    if not completed:
        raise ValueError("a group baseline needs at least one completed root reward")
    total, mean = sum(completed), sum(completed) / len(completed)
    if not leave_one_out:
        return [mean] * len(task_rewards)
    if len(completed) == 1:
        return [r if v else mean for r, v in zip(task_rewards, valid)]
    return [(total - r) / (len(completed) - 1) if v else mean for r, v in zip(task_rewards, valid)]


def snapshot_97e7601_baseline(task_rewards: list[float]) -> float:
    """Restatement of ApGa/platoon 97e7601 platoon/train/areal/workflows/step_wise.py (and tinker/workflows/
    group_rollout_workflow.py): ``rewards - mean(task_reward)`` over the rollouts that returned a result."""
    return sum(task_rewards) / len(task_rewards)


# four trees of one task, root rewards as Eq. 1 gives them with cap 0.4: solved, failed, solved with one
# successful child (1 + 0.4), failed. S = 2.4, V = 4.
ROOTS = [1.0, 0.0, 1.4, 0.0]


def test_leave_one_out_is_their_leave_one_out_baseline():
    # b_g = (S - r_g) / (V - 1): (2.4 - 1) / 3, 2.4 / 3, (2.4 - 1.4) / 3, 2.4 / 3
    by_hand = [1.4 / 3, 0.8, 1.0 / 3, 0.8]
    ours = [b for b, sigma in group_baselines(ROOTS, "leave_one_out")]
    assert ours == pytest.approx(by_hand)
    assert platoon040_group_baselines(ROOTS, [True] * 4, leave_one_out=True) == pytest.approx(by_hand)
    assert all(sigma == 1.0 for _, sigma in group_baselines(ROOTS, "leave_one_out"))  # no std scaling in either


def test_group_mean_is_their_default_baseline_in_both_versions():
    # b = S / V = 0.6 for every tree: platoon 0.4.0's default (leave_one_out_baseline: false) and the snapshot's
    ours = [b for b, _ in group_baselines(ROOTS, "group_mean")]
    assert ours == pytest.approx([0.6] * 4)
    assert platoon040_group_baselines(ROOTS, [True] * 4, leave_one_out=False) == pytest.approx([0.6] * 4)
    assert snapshot_97e7601_baseline(ROOTS) == pytest.approx(0.6)


def test_where_our_failure_rules_depart_from_theirs():
    # An unscored / interrupted root: ours drops the tree (NaN baseline) and leaves it out of the others';
    # platoon 0.4.0 also leaves it out of the others' baselines but gives it the completed mean, so its
    # completed children still train. Completed/scored roots get the same baseline in both: (1.4 + 0) / 2.
    roots, valid = [1.0, None, 1.4, 0.0], [True, False, True, True]
    ours = [b for b, _ in group_baselines(roots, "leave_one_out")]
    theirs_b = platoon040_group_baselines([1.0, 0.3, 1.4, 0.0], valid, leave_one_out=True)
    assert ours[0] == pytest.approx(0.7) and theirs_b[0] == pytest.approx(0.7)
    assert ours[2] == pytest.approx(0.5) and theirs_b[2] == pytest.approx(0.5)
    assert math.isnan(ours[1]) and theirs_b[1] == pytest.approx(2.4 / 3)
    # One scored root: ours has no baseline (the group is dropped, ValueError); theirs centers it on itself
    # (advantage 0 for the root, R(n) - r for its other nodes).
    with pytest.raises(ValueError, match="at least 2 scored roots"):
        group_baselines([1.0, None], "leave_one_out")
    assert platoon040_group_baselines([1.0, 0.0], [True, False], leave_one_out=True) == [1.0, 1.0]
