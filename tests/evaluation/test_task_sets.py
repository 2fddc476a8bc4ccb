"""Three sets of tasks, never mixed. The evaluation and development sets share no task (a TextCraft
task is its target multiset) with the training pool, the demonstrations or each other; the experiment checks
it before any campaign starts (tests/pipeline/test_experiment.py). The preregistered endpoint and the
development set are config blocks."""

from __future__ import annotations

import pytest

from rao_core.config import ConfigError, load_config
from rao_core.envs import get_env
from rao_core.envs.base import Task, write_tasks
from rao_core.evaluation import DevSet, EvalConfig, dev_tasks, eval_tasks
from rao_core.task_sampling import check_disjoint, task_identity
from rao_core.task_sets import campaign_task_sets, check_task_sets

TIER1X = "configs/experiment-textcraft-tier1x.yaml"
TIER1 = "configs/experiment-textcraft-tier1.yaml"


def _task(tid: str, targets: dict[str, int]) -> Task:
    return Task(task_id=tid, env="textcraft-synth", data={"targets": targets})


def test_identity_is_the_target_multiset_not_the_id():
    a, b = _task("x-1", {"m1_i2": 1, "c1_i3": 2}), _task("y-9", {"c1_i3": 2, "m1_i2": 1})
    assert task_identity(a) == task_identity(b) == "targets c1_i3 x2, m1_i2 x1"
    assert task_identity(_task("z", {"c1_i3": 1, "m1_i2": 1})) != task_identity(a)  # counts count
    other = Task(task_id="o", env="oolong", data={"question": "q", "answer": "1"})
    assert task_identity(other).startswith("data sha256:") and task_identity(other) == task_identity(
        Task(task_id="o2", env="oolong", data={"answer": "1", "question": "q"}))


def test_check_disjoint_names_each_overlap():
    ev = [_task("ev-0", {"a": 1}), _task("ev-1", {"b": 2}), _task("ev-2", {"c": 3})]
    train = [_task("tr-0", {"b": 2}), _task("tr-1", {"d": 1})]
    demos = [_task("de-0", {"d": 1})]  # training sets may share tasks with each other
    dev = [_task("dv-0", {"a": 1})]
    assert check_disjoint({"evaluation": ev, "development": [_task("dv-1", {"a": 2})]},
                          {"training": train[1:], "demonstrations": demos}) == {
        "evaluation": 3, "development": 1, "training": 1, "demonstrations": 1}
    with pytest.raises(ValueError) as e:
        check_disjoint({"evaluation": ev, "development": dev}, {"training": train, "demonstrations": demos})
    msg = str(e.value)
    assert "evaluation and training share 1 task(s): targets b x2 (ev-1 / tr-0)" in msg
    assert "evaluation and development share 1 task(s): targets a x1 (ev-0 / dv-0)" in msg
    assert "demonstrations" not in msg and "\n" not in msg  # one line


def test_a_disjoint_config_passes_and_an_overlapping_one_names_the_overlap(tmp_path):
    # disjoint: held-out targets come from the validation split, the pool and demonstrations from train
    cfg = load_config(TIER1X, ["eval.dev={seed: 77, n_tasks: 10}"], check_paths=False)
    counts = check_task_sets(cfg)
    assert counts == {"evaluation (eval.seed 1234)": 100, "development (eval.dev.seed 77)": 20,
                      "training (seed 0)": 200, "demonstrations (seed 0)": 48}
    # overlapping: the evaluation drawn from the train split (tier1: one or two targets, few multisets)
    bad = load_config(TIER1, ["eval.split=train"], check_paths=False)
    with pytest.raises(ValueError, match=r"evaluation \(eval.seed 1234\) and training \(seed 0\) share \d+ task"):
        check_task_sets(bad)
    # overlapping: a task file that holds evaluation tasks (ids differ, targets do not)
    held, _ = campaign_task_sets(cfg)
    ev = held["evaluation (eval.seed 1234)"]
    write_tasks(tmp_path / "train.jsonl", [t.model_copy(update={"task_id": f"mine-{i}", "split": "train"})
                                           for i, t in enumerate(ev[:3])])
    leaked = load_config(TIER1X, [f"tasks.train_file={tmp_path / 'train.jsonl'}"])
    with pytest.raises(ValueError, match="share 3 task"):
        check_task_sets(leaked)


def test_dev_set_has_its_own_seed_and_no_evaluation_task(monkeypatch):
    env = get_env("textcraft-synth")
    ev = EvalConfig(difficulties=["tier1"], n_tasks=50, seed=1234)
    dev = dev_tasks(env, ev, DevSet(seed=5, n_tasks=40))
    assert len(dev) == 40 and all(t.split == "validation" for t in dev)
    taken = {task_identity(t) for t in eval_tasks(env, ev)}
    assert not taken & {task_identity(t) for t in dev}
    # drawn from stream "dev": without the filter, this seed's first tier1 tasks do collide (25 items x 3 counts)
    from rao_core.task_sampling import sample_tasks

    raw = sample_tasks(env, seed=5, stream="dev", difficulties=["tier1"], n=40, split="validation")
    assert taken & {task_identity(t) for t in raw}
    assert dev_tasks(env, ev, DevSet(seed=5, n_tasks=40)) == dev  # seeded
    assert len({task_identity(t) for t in dev}) == 40  # distinct among themselves too
    # a generator that can only repeat the evaluation tasks: too few development tasks, said so
    import rao_core.task_sampling as ts

    small = EvalConfig(difficulties=["tier1"], n_tasks=8, seed=1)
    held_out = eval_tasks(env, small)
    monkeypatch.setattr(ts, "sample_tasks", lambda env, **kw: list(held_out))
    with pytest.raises(ValueError, match="only 0 of 5 'tier1' development tasks are not evaluation tasks"):
        dev_tasks(env, small, DevSet(seed=2, n_tasks=5))


def test_endpoint_and_dev_blocks_are_validated():
    ep = ("eval.endpoint={arm: recursive, difficulty: tier1x2, mode: recursive, iteration: last, "
          "against: warm_start, test: two_proportion_z, n: 100}")
    cfg = load_config(TIER1X, [ep, "eval.dev={seed: 9}"], check_paths=False)
    assert cfg.eval.endpoint.model_dump() == {"arm": "recursive", "difficulty": "tier1x2", "mode": "recursive",
                                              "iteration": "last", "against": "warm_start",
                                              "test": "two_proportion_z", "n": 100, "min_difference": None}
    assert cfg.eval.dev.n_tasks == 20 and load_config(TIER1X, check_paths=False).eval.endpoint is None
    with pytest.raises(ConfigError, match="eval.endpoint.difficulty = 'tier1x9' is not one of"):
        load_config(TIER1X, [ep.replace("difficulty: tier1x2", "difficulty: tier1x9")], check_paths=False)
    with pytest.raises(ConfigError, match="eval.dev.seed = 1234 is eval.seed"):
        load_config(TIER1X, ["eval.dev={seed: 1234}"], check_paths=False)
    with pytest.raises(ConfigError, match="eval.endpoint.iteration"):
        load_config(TIER1X, [ep.replace("iteration: last", "iteration: -1")], check_paths=False)
    with pytest.raises(ConfigError, match="eval.endpoint.n"):
        load_config(TIER1X, [ep.replace("n: 100", "n: 0")], check_paths=False)



def test_every_set_of_a_campaign_comes_from_its_generator_options():
    """``tasks.generator_options`` (here a larger recipe graph) reach the RL pool, the evaluation AND the
    demonstrations: a warm start on another graph would demonstrate problems the campaign never poses."""
    cfg = load_config("configs/experiment-textcraft-nested.yaml",
                      ["tasks.generator_options={items_per_tier: 40}", "tasks.pool_size=4", "eval.n_tasks=3"],
                      check_paths=False)
    held, train = campaign_task_sets(cfg)
    sets = {**held, **train}
    assert any(name.startswith("demonstrations") for name in sets)
    for name, tasks in sets.items():
        assert tasks and {t.data["graph"]["items_per_tier"] for t in tasks} == {40}, name


def test_the_deeper_design_draws_100_distinct_held_out_problems_per_level():
    """configs/experiment-textcraft-deeper.yaml's preregistration: each evaluation point draws 100 distinct
    problems per level (a problem is its target multiset), disjoint from the RL pool and the demonstrations,
    and the demonstrations come from the same (larger) recipe graph."""
    cfg = load_config("configs/experiment-textcraft-deeper.yaml", check_paths=False)
    held, train = campaign_task_sets(cfg)
    (evaluation,) = held.values()
    for level in ("nest1", "nest2"):
        tasks = [t for t in evaluation if t.difficulty == level]
        assert len(tasks) == 100 and len({task_identity(t) for t in tasks}) == 100, level
    assert {t.data["graph"]["items_per_tier"] for ts in (*held.values(), *train.values()) for t in ts} == {300}
    assert check_task_sets(cfg)  # raises on any shared problem
    assert cfg.eval.evaluated_iterations(cfg.iterations) == [0, 3]  # the units' 3 iterations


def test_an_evaluation_on_the_training_split_skips_the_training_problems(monkeypatch):
    """rao_core.task_sets.evaluation_tasks: drawn from the training split, tier1's few multisets collide with the RL
    pool and the demonstrations (the plain draw shares problems with them); with those problems skipped the set keeps
    eval.n_tasks distinct problems of the split, seeded, the plain draw's kept tasks first and in order, and passes
    the disjointness check. Nothing to skip: the plain draw. A generator that cannot give that many: said so."""
    import rao_core.task_sets as task_sets
    from rao_core.task_sets import evaluation_tasks, training_problems

    cfg = load_config(TIER1, ["eval.split=train"], check_paths=False)
    plain = eval_tasks(get_env("textcraft-synth"), cfg.eval)
    trained = training_problems(cfg)
    assert {task_identity(t) for t in plain} & trained  # the plain draw collides
    assert evaluation_tasks(cfg) == plain
    got = evaluation_tasks(cfg, trained)
    ids = [task_identity(t) for t in got]
    assert len(got) == len(set(ids)) == 50 and not set(ids) & trained and {t.split for t in got} == {"train"}
    kept = [t for t in plain if task_identity(t) not in trained]
    assert 0 < len(kept) < 50 and got[:len(kept)] == kept
    assert evaluation_tasks(cfg, trained) == got
    _, train = campaign_task_sets(cfg)
    assert check_disjoint({"evaluation": got}, train) == {"evaluation": 50, **{k: len(v) for k, v in train.items()}}
    monkeypatch.setattr(task_sets, "sample_tasks", lambda env, **kw: list(plain))
    with pytest.raises(ValueError, match=rf"only {len(kept)} of 50 'tier1' evaluation tasks \(split train, eval.seed "
                                         rf"1234\) are not among the {len(trained)} problems to skip"):
        evaluation_tasks(cfg, trained)
