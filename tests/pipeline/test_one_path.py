"""One path per capability: the pipeline's task sets, evaluation and warm start are the
library's, so they cannot drift apart. No services: direct calls of the stage bodies with scripted policies."""

from __future__ import annotations

import shutil

import pytest

from rao_core.config import load_config
from rao_core.envs import get_env
from rao_core.evaluation import eval_tasks
from rao_core.paths import tiny_model_path
from rao_core.policies.scripted import ReplayPolicy, cell
from rao_core.task_sampling import sample_tasks, split_evenly, task_seed
from rao_core.warmstart import DemoConfig, demo_tasks

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
TINY = tiny_model_path()  # resolved before any test moves RAO_HOME
needs_tok = pytest.mark.skipif(not (TINY / "tokenizer_config.json").exists(),
                               reason="tiny model tokenizer not prepared (make setup)")


def _ctx(tmp_path, monkeypatch, **overrides):
    from infra.stage_io import RunContext

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    cfg = load_config(None, {"runtime.sandbox": SANDBOX, **overrides})
    return RunContext(config=cfg, s3={}, mlflow_uri="")


def _ids(tasks) -> list[str]:
    return [t.task_id for t in tasks]


# -- one seeded task-sampling rule ---------------------------------------------------------------------------
def test_split_evenly_and_task_seed():
    assert split_evenly(5, 2) == [3, 2] and split_evenly(4, 3) == [2, 1, 1] and split_evenly(0, 2) == [0, 0]
    with pytest.raises(ValueError):
        split_evenly(3, 0)
    s = task_seed(0, "eval", "easy")
    assert s == task_seed(0, "eval", "easy") and 0 <= s < 2 ** 31
    # purposes and seeds give different generator seeds
    assert len({task_seed(0, "eval", "easy"), task_seed(0, "demos", "easy"), task_seed(0, "rl-pool", "easy"),
                task_seed(1, "eval", "easy"), task_seed(0, "eval", "medium")}) == 5


def test_sample_tasks_counts_and_errors():
    env = get_env("textcraft-synth")
    tasks = sample_tasks(env, seed=3, stream="demos", difficulties=["easy", "medium"], n=[2, 0], split="train")
    assert [t.difficulty for t in tasks] == ["easy", "easy"]
    with pytest.raises(ValueError, match="2 task counts for 1 difficulties"):
        sample_tasks(env, seed=3, stream="demos", difficulties=["easy"], n=[1, 1], split="train")


def test_same_seed_rule_for_pool_validation_demos_and_library(tmp_path, monkeypatch):
    """The RL pool, the campaign's validation tasks, the demonstrations and the library's evaluation
    tasks are all ``sample_tasks`` with their stream (before: three arithmetic seed rules)."""
    from tasks.stages import training_pool, validation_tasks

    ctx = _ctx(tmp_path, monkeypatch, seed=7, **{"tasks.difficulties": ["easy", "medium"], "tasks.pool_size": 3,
                                                 "eval.difficulties": ["easy", "medium"], "eval.n_tasks": 2,
                                                 "eval.seed": 21})
    env = get_env("textcraft-synth")
    pool = training_pool(ctx)
    assert _ids(pool) == _ids(sample_tasks(env, seed=7, stream="rl-pool", difficulties=["easy", "medium"], n=3,
                                           split="train"))
    val = validation_tasks(ctx)
    assert _ids(val) == _ids(eval_tasks(env, ctx.config.eval)) == _ids(
        sample_tasks(env, seed=21, stream="eval", difficulties=["easy", "medium"], n=2, split="validation"))
    demos = demo_tasks(env, DemoConfig(n_tasks=3, difficulties=["easy", "medium"], seed=7))
    assert _ids(demos) == _ids(sample_tasks(env, seed=7, stream="demos", difficulties=["easy", "medium"],
                                            n=[2, 1], split="train"))
    # demonstrations and the RL pool draw from the same split and master seed, yet not the same tasks
    assert not set(_ids(demos)) & set(_ids(pool))


def test_validation_cache_is_keyed_by_what_defines_the_tasks(tmp_path, monkeypatch):
    """The nightly suite evaluates several entries under one name: each gets its own validation tasks."""
    from tasks.stages import validation_tasks

    a = validation_tasks(_ctx(tmp_path, monkeypatch, **{"eval.n_tasks": 2}))
    b = validation_tasks(_ctx(tmp_path, monkeypatch, **{"eval.n_tasks": 3}))
    c = validation_tasks(_ctx(tmp_path, monkeypatch, **{"tasks.env": "oolong", "tasks.difficulties": ["mixed"],
                                                        "eval.difficulties": ["singledoc_rolls"], "eval.n_tasks": 1,
                                                        "tasks.generator_options": {"target_tokens": 300}}))
    assert (len(a), len(b), len(c)) == (2, 3, 1)
    assert _ids(b)[:2] == _ids(a) and c[0].env == "oolong"


# -- one evaluation: the pipeline keeps graded scores --------------------------------------------------------
@needs_tok
def test_pipeline_evaluation_keeps_oolong_partial_credit(tmp_path, monkeypatch):
    """The campaign's evaluation stage scores Oolong with 0.75^|delta| partial credit (before: pass/fail),
    through the library's evaluate_suite."""
    import rao_core.evaluation as evaluation
    import tasks.stages as stages
    from infra.stage_records import ServedEndpoint

    ctx = _ctx(tmp_path, monkeypatch, **{"tasks.env": "oolong", "tasks.difficulties": ["mixed"],
                                         "eval.difficulties": ["singledoc_rolls"], "eval.benchmarks": {},
                                         "eval.n_tasks": 6, "tasks.generator_options": {"target_tokens": 300},
                                         "runtime.context_window": 2048, "runtime.max_new_tokens": 128})
    tasks = stages.validation_tasks(ctx)
    env = get_env("oolong")
    replies, expected = {}, []
    for i, t in enumerate(tasks):
        gold = t.data["answer"]
        delta = i % 3 if gold.lstrip("-").isdigit() else 0
        replies[env.root_goal(t).goal] = str(int(gold) + delta) if delta else gold
        expected.append(0.75 ** delta)  # Oolong's integer rule; an exact answer scores 1
    assert len(replies) == len(tasks), "root goals must identify the tasks"
    assert min(expected) < 1.0, "the test needs at least one partially right answer"
    policy = ReplayPolicy(chooser=lambda node: [cell(f"finish({chr(92) + 'boxed{' + replies[node.goal] + '}'!r})")])
    monkeypatch.setattr(stages, "_policy", lambda ctx, served: policy)
    calls = []
    real = evaluation.evaluate_suite
    monkeypatch.setattr(evaluation, "evaluate_suite", lambda *a, **k: calls.append(1) or real(*a, **k))
    res = stages.run_evaluation(ctx, ServedEndpoint(base_url="http://unused", model="policy"), str(TINY))
    assert calls == [1]  # the library's evaluation, not a copy
    m = res.metrics
    assert m["eval/oolong/recursive/singledoc_rolls/success"] == pytest.approx(sum(expected) / len(expected))
    assert m["eval/oolong/recursive/singledoc_rolls/n"] == 6.0
    (row,) = res.rows
    assert row["successes"] == pytest.approx(sum(expected), abs=1e-4) and row["mode"] == "recursive"
    assert row["benchmark"] == "oolong"


# -- one warm start: the pipeline's task keeps the library's checks ------------------------------------------
def test_pipeline_warm_start_rejects_a_non_sft_loss(tmp_path, monkeypatch):
    from tasks.warm_start import warm_start

    ctx = _ctx(tmp_path, monkeypatch, **{"warm_start.mode": "demos", "warm_start.trainer.loss_type": "ppo",
                                         "model.path": str(TINY)})
    with pytest.raises(ValueError, match="loss_type='sft'"):
        warm_start.fn.__wrapped__(ctx)


@needs_tok
def test_pipeline_warm_start_refuses_to_train_without_a_successful_demonstration(tmp_path, monkeypatch):
    import rao_core.warmstart as warmstart
    from tasks.warm_start import warm_start

    monkeypatch.setattr(warmstart, "expert_for_tree",
                        lambda *a, **k: ReplayPolicy(default=[cell("finish('done')")]))
    ctx = _ctx(tmp_path, monkeypatch, **{"warm_start.mode": "demos", "warm_start.n_tasks": 2,
                                         "warm_start.difficulties": ["easy"], "model.path": str(TINY),
                                         "runtime.context_window": 2048, "runtime.max_new_tokens": 128})
    with pytest.raises(ValueError, match="none of the 2 demonstration trees succeeded"):
        warm_start.fn.__wrapped__(ctx)
    assert not (tmp_path / "campaigns/smoke/checkpoints/iter-0").exists()


def test_nightly_suite_entry_is_a_benchmark():
    """A suite entry is a rao_core.evaluation.Benchmark: difficulties, n_tasks and modes always its own (its
    defaults, those of the nightly's config, configs/cpu-smoke.yaml, so a new entry of the Prefect form starts from
    them; n_tasks its eval.regression_n_tasks, the decision's n), seed/split/graded only when given, else the
    config's eval section's (resolved); its name is its environment's. The default suite is the config's four
    benchmarks; the form shows neither campaign-only fields nor stored trees, and has the environment's options."""
    from flows.evaluate import EvaluateParams, SuiteEntry, champion_suite, default_suite
    from rao_core.config import load_config
    from rao_core.evaluation import Benchmark

    smoke = load_config("configs/cpu-smoke.yaml")
    d = SuiteEntry()
    assert isinstance(d, Benchmark) and d.name == "textcraft" and d.stored_trees == 0
    assert (d.env, d.difficulties, d.n_tasks, d.modes) == (smoke.tasks.env, smoke.eval.difficulties,
                                                           smoke.eval.regression_n_tasks, smoke.eval.modes)
    form = EvaluateParams.model_json_schema()["$defs"]["SuiteEntry"]["properties"]  # what "Add item" fills in
    assert (form["difficulties"]["default"], form["modes"]["default"]) == (["tier1"], ["recursive"])
    assert "every" not in form and "stored_trees" not in form and {"env_options", "generator_options", "name"} <= set(form)
    assert EvaluateParams().suite == []  # the deployment's default: the config's suite
    assert [(e.name, e.env, e.difficulties, e.n_tasks, e.seed) for e in default_suite(smoke)] == [
        ("textcraft", "textcraft-synth", ["tier1"], 100, smoke.eval.seed), ("oolong", "oolong", ["singledoc_rolls"], 100, 1234),
        ("deepdive", "deepdive", ["easy"], 100, 1234), ("arte", "arte", ["easy"], 100, 1234)]
    c = champion_suite(smoke)
    assert (c.env, c.difficulties, c.n_tasks, c.modes, c.seed) == ("textcraft-synth", ["tier1"], 100, ["recursive"],
                                                                   smoke.eval.seed)
    assert [e.n_tasks for e in default_suite(smoke, 7)] == [7] * 4
    base = load_config(None, {"eval.seed": 99, "eval.n_tasks": 4, "eval.graded": False})
    e = SuiteEntry(env="oolong", difficulties=["singledoc_rolls"]).resolved(base)
    assert (e.name, e.difficulties, e.n_tasks, e.modes, e.seed, e.graded) == ("oolong", ["singledoc_rolls"], 100,
                                                                              ["recursive"], 99, False)
    e = SuiteEntry(seed=5, graded=True, modes=["single"]).resolved(base)
    assert (e.seed, e.graded, e.modes) == (5, True, ["single"])
    with pytest.raises(ValueError):
        SuiteEntry(modes=["both"])
    with pytest.raises(ValueError, match="benchmark 'oolong' is listed twice"):
        EvaluateParams(suite=[SuiteEntry(env="oolong", difficulties=["mixed"]), {"env": "oolong",
                                                                               "difficulties": ["singledoc_rolls"]}])
