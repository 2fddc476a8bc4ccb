"""Evaluation as a benchmark suite: the config's suite (training benchmark plus ``eval.benchmarks``), metric keys
that name the benchmark, the tags and score of a registered version, and the evaluate stage running the four
standard benchmarks with their oracle policies through the real runtime (no services, no model server)."""

from __future__ import annotations

import shutil

import pytest

from rao_core.config import ConfigError, load_config
from rao_core.evaluation import (STANDARD_BENCHMARKS, Benchmark, EvalReport, EvalRow, benchmark_name, legacy_key,
                                 metric_key, named_key)
from rao_core.paths import tiny_model_path

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
TINY = tiny_model_path()  # resolved before any test moves RAO_HOME
needs_tok = pytest.mark.skipif(not (TINY / "tokenizer_config.json").exists(),
                               reason="tiny model tokenizer not prepared (make setup)")


def _names(cfg) -> list[tuple[str, str, list[str], int, str]]:
    return [(b.name, b.env, b.difficulties, b.n_tasks, b.at) for b in cfg.suite()]


# -- the suite in the config ------------------------------------------------------------------------------------
def test_the_default_suite_is_the_four_benchmarks_with_the_eval_sections_fields():
    cfg = load_config(None, {"eval.n_tasks": 3, "eval.modes": ["recursive", "single"], "eval.seed": 9})
    assert _names(cfg) == [("textcraft", "textcraft-synth", ["easy"], 3, "every"),
                           ("oolong", "oolong", ["singledoc_rolls"], 3, "every"), ("deepdive", "deepdive", ["easy"], 3, "every"),
                           ("arte", "arte", ["easy"], 3, "every")]
    assert all(b.modes == ["recursive", "single"] and b.seed == 9 and b.regression_n_tasks == 100
               for b in cfg.suite())
    assert cfg.training_benchmark_name() == cfg.primary_benchmark() == "textcraft"
    assert [b.name for b in cfg.suite_at(1)] == ["textcraft", "oolong", "deepdive", "arte"]  # at: every
    assert list(STANDARD_BENCHMARKS) == ["textcraft", "oolong", "deepdive", "arte"]


def test_the_smoke_config_evaluates_the_other_three_small_and_at_the_ends_only():
    cfg = load_config("configs/cpu-smoke.yaml")
    assert _names(cfg) == [("textcraft", "textcraft-synth", ["tier1"], 8, "every"),
                           ("oolong", "oolong", ["singledoc_rolls"], 4, "ends"), ("deepdive", "deepdive", ["easy"], 4, "ends"),
                           ("arte", "arte", ["easy"], 4, "ends")]
    assert cfg.iterations == 2
    assert [[b.name for b in cfg.suite_at(k)] for k in (0, 1, 2)] == [
        ["textcraft", "oolong", "deepdive", "arte"], ["textcraft"], ["textcraft", "oolong", "deepdive", "arte"]]
    assert [b.name for b in cfg.suite_at(None)] == [b.name for b in cfg.suite_at("iter-x")] == [
        "textcraft", "oolong", "deepdive", "arte"]  # an evaluation outside the iterations: all


def test_the_training_benchmark_is_tasks_env_and_the_standard_others_follow_it():
    cfg = load_config(None, {"tasks.env": "oolong", "tasks.difficulties": ["mixed"],
                             "eval.difficulties": ["singledoc_rolls"],
                             "tasks.generator_options": {"target_tokens": 300}})
    assert _names(cfg)[0] == ("oolong", "oolong", ["singledoc_rolls"], 8, "every")
    assert cfg.suite()[0].generator_options == {"target_tokens": 300}  # the training benchmark's, not the others'
    assert [b.name for b in cfg.suite()] == ["oolong", "textcraft", "deepdive", "arte"]
    assert [b.generator_options for b in cfg.suite()[1:]] == [{}, {}, {}]
    assert benchmark_name("arte-synth") == "arte" and benchmark_name("textcraft-synth") == "textcraft"
    assert benchmark_name("example") == "example"
    own = load_config(None, {"tasks.env": "example", "tasks.difficulties": ["easy"], "eval.difficulties": ["easy"]})
    assert _names(own) == [("example", "example", ["easy"], 8, "every")]  # one's own task: evaluated alone
    listed = load_config(None, {"tasks.env": "example", "tasks.difficulties": ["easy"], "eval.difficulties": ["easy"],
                                "eval.benchmarks": {"oolong": {}}})
    assert [b.name for b in listed.suite()] == ["example", "oolong"]


def test_listed_benchmarks_replace_the_default_ones():
    only = load_config(None, {"eval.benchmarks": {}})
    assert [b.name for b in only.suite()] == ["textcraft"]
    cfg = load_config(None, {"eval.benchmarks": {"deepdive": {"difficulties": ["k3"], "n_tasks": 2, "at": "ends"},
                                                 "x2": {"env": "textcraft-synth", "difficulties": ["tier1x2"],
                                                        "regression_n_tasks": 50}}})
    assert _names(cfg) == [("textcraft", "textcraft-synth", ["easy"], 8, "every"),
                           ("deepdive", "deepdive", ["k3"], 2, "ends"), ("x2", "textcraft-synth", ["tier1x2"], 8, "every")]
    assert [b.regression_n_tasks for b in cfg.suite()] == [100, 100, 50]
    one = load_config(None, ["eval.benchmarks.oolong.n_tasks=2"])  # --set of one entry: that entry alone
    assert [(b.name, b.n_tasks) for b in one.suite()] == [("textcraft", 8), ("oolong", 2)]
    for name in ("experiment-textcraft-cpu", "experiment-textcraft-tier1", "experiment-textcraft-deeper"):
        assert [b.name for b in load_config(f"configs/{name}.yaml", check_paths=False).suite()] == ["textcraft"]


@pytest.mark.parametrize("overrides,message", [
    ({"eval.benchmarks": {"mine": {"n_tasks": 2}}},
     "eval.benchmarks.mine: not a standard benchmark (textcraft, oolong, deepdive, arte): set its env and "
     "difficulties"),
    ({"eval.benchmarks": {"deepdive": {"difficulties": ["tier1"]}}},
     "eval.benchmarks.deepdive.difficulties = ['tier1']: unknown DeepDive difficulty 'tier1'"),
    ({"eval.benchmarks": {"arte": {"env_options": {"reward": "nope"}}}},
     "eval.benchmarks.arte: environment 'arte' with options {'reward': 'nope'}: "),
    ({"eval.benchmarks": {"mine": {"env": "nosuchenv", "difficulties": ["a"]}}},
     "eval.benchmarks.mine: environment 'nosuchenv' with options {}: unknown environment 'nosuchenv'"),
    ({"eval.benchmarks": {"textcraft": {"difficulties": ["tier1"]}}},
     "eval.benchmarks.textcraft: 'textcraft' is the training benchmark (tasks.env = 'textcraft-synth')"),
    ({"eval.benchmarks": {"Bad Name": {"env": "oolong", "difficulties": ["mixed"]}}},
     "eval.benchmarks.Bad Name: not a benchmark name"),
    ({"eval.benchmarks": {"oolong": {"modes": []}}}, "eval.benchmarks.oolong: "),
    ({"eval.primary_benchmark": "nope"}, "eval.primary_benchmark = 'nope' is not a benchmark of the suite "
                                         "(textcraft, oolong, deepdive, arte)"),
    ({"eval.primary_benchmark": "oolong", "eval.benchmarks": {"oolong": {"at": "ends"}}},
     "eval.primary_benchmark = 'oolong' is evaluated only at the ends (at: ends)"),
])
def test_a_bad_suite_is_one_config_error_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_suite_is_not_checked_when_evaluation_is_off():
    cfg = load_config(None, {"eval.enabled": False, "eval.benchmarks": {"deepdive": {"difficulties": ["tier1"]}}})
    assert cfg.eval.enabled is False


# -- metric keys name the benchmark -----------------------------------------------------------------------------
def test_metric_keys_name_the_benchmark_and_old_keys_map_to_the_training_one():
    row = EvalRow(mode="recursive", difficulty="tier1", n=8, successes=2, success=0.25, ci_low=0.07, ci_high=0.59)
    named = EvalReport(rows=[row]).named("textcraft")
    m = named.metrics()
    assert m["eval/textcraft/recursive/tier1/success"] == 0.25
    assert (m["eval/textcraft/recursive/tier1/success_ci_low"], m["eval/textcraft/recursive/tier1/success_ci_high"]) \
        == (0.07, 0.59)
    assert not [k for k in m if not k.startswith("eval/textcraft/recursive/tier1/")]
    assert "eval/recursive/tier1/success" in EvalReport(rows=[row]).metrics()  # no benchmark named: the old key
    assert named.rows[0].table_row()["benchmark"] == "textcraft" and "benchmark" not in row.table_row()
    assert named.row("recursive", "tier1", "textcraft") is named.rows[0]
    with pytest.raises(KeyError, match="of benchmark 'oolong'"):
        named.row("recursive", "tier1", "oolong")
    assert metric_key("oolong", "single", "mixed") == "eval/oolong/single/mixed/success"
    assert legacy_key("eval/textcraft/recursive/tier1/success") == "eval/recursive/tier1/success"
    assert legacy_key("eval/recursive/tier1/success") is None and legacy_key("guard/p_value") is None
    assert named_key("eval/recursive/tier1/success", "textcraft") == "eval/textcraft/recursive/tier1/success"
    assert named_key("eval/oolong/recursive/mixed/success", "textcraft") == "eval/oolong/recursive/mixed/success"
    assert Benchmark(env="arte-synth").name == "arte" and Benchmark(env="oolong", name="long").name == "long"
    with pytest.raises(ValueError, match="not a benchmark name"):
        Benchmark(env="oolong", name="a/b")


def test_the_primary_metric_and_score_of_a_campaign_and_of_an_older_record(tmp_path, monkeypatch):
    from infra.stage_io import RunContext
    from tasks.stages import benchmark_tags, primary_metric, primary_score

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    ctx = RunContext(config=load_config("configs/cpu-smoke.yaml"), s3={}, mlflow_uri="")
    metric = primary_metric(ctx)
    assert metric == "eval/textcraft/recursive/tier1/success"
    assert primary_score(ctx, {metric: 0.5, "eval/recursive/tier1/success": 0.1}, metric) == 0.5
    assert primary_score(ctx, {"eval/recursive/tier1/success": 0.25}, metric) == 0.25  # a record of before
    assert primary_score(ctx, {}, metric) is None
    explicit = RunContext(config=load_config("configs/cpu-smoke.yaml", ["eval.primary_metric=eval/single/tier1/success",
                                                                          "eval.primary_benchmark=textcraft"]),
                          s3={}, mlflow_uri="")
    assert primary_metric(explicit) == "eval/textcraft/single/tier1/success"
    oolong = RunContext(config=load_config(None, ["eval.primary_benchmark=oolong"]), s3={}, mlflow_uri="")
    assert primary_metric(oolong) == "eval/oolong/recursive/singledoc_rolls/success"
    assert primary_score(oolong, {"eval/recursive/singledoc_rolls/success": 0.5}, primary_metric(oolong)) is None  # not old
    rows = [{"benchmark": "textcraft", "mode": "recursive", "difficulty": "tier1", "success": 0.25,
             "ci95": "[0.07, 0.59]", "n": 8},
            {"benchmark": "oolong", "mode": "recursive", "difficulty": "mixed", "success": 0.0, "ci95": "[0.00, 0.49]",
             "n": 4},
            {"mode": "recursive", "difficulty": "x", "success": 1.0, "ci95": "[0.21, 1.00]", "n": 1}]
    assert benchmark_tags(rows) == {"rao.benchmark.textcraft": "recursive/tier1 0.250 [0.07, 0.59] n 8",
                                    "rao.benchmark.oolong": "recursive/mixed 0.000 [0.00, 0.49] n 4"}


# -- the evaluate stage runs the suite --------------------------------------------------------------------------
@needs_tok
def test_the_evaluate_stage_runs_the_four_benchmarks_with_their_oracles(tmp_path, monkeypatch):
    """The campaign's evaluate stage (tasks.stages.run_evaluation) on the four standard benchmarks, 2 held-out
    tasks each, every request routed to its environment's oracle (the TextCraft, DeepDive and ART-E experts; Oolong,
    which has none, answers each question with its gold answer): every benchmark scores 2/2 under keys that name
    it, each row names its benchmark, and the tasks are each benchmark's own validation tasks. At an iteration
    between the ends, the benchmarks evaluated at the ends only are not evaluated."""
    import tasks.stages as stages
    from infra.stage_io import RunContext
    from infra.stage_records import ServedEndpoint
    from rao_core.envs import canonical_name, get_env, oracle_policy
    from rao_core.policies.base import Policy
    from rao_core.policies.scripted import ReplayPolicy, cell

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    cfg = load_config(None, {"runtime.sandbox": SANDBOX, "eval.n_tasks": 2, "eval.difficulties": ["tier1"],
                             "iterations": 2, "eval.benchmarks": {
                                 "oolong": {"generator_options": {"target_tokens": 300}, "at": "ends"},
                                 "deepdive": {}, "arte": {}}})
    ctx = RunContext(config=cfg, s3={}, mlflow_uri="")
    suite = {b.name: b for b in cfg.suite()}
    oolong = stages.validation_tasks(ctx, suite["oolong"])
    env = get_env("oolong")
    gold = {env.root_goal(t).goal: t.data["answer"] for t in oolong}
    answers = ReplayPolicy(chooser=lambda node: [cell(f"finish({chr(92) + 'boxed{' + gold[node.goal] + '}'!r})")])

    class ByEnv(Policy):
        def __init__(self):
            self.by_env = {canonical_name(e): oracle_policy(e) for e in ("textcraft-synth", "deepdive", "arte")}
            self.by_env["oolong"] = answers
            self.seen: set[str] = set()

        async def generate(self, request):
            self.seen.add(canonical_name(request.env))
            return await self.by_env[canonical_name(request.env)].generate(request)

    policies: list[ByEnv] = []
    monkeypatch.setattr(stages, "_policy", lambda ctx, served: policies.append(ByEnv()) or policies[-1])
    served = ServedEndpoint(base_url="http://unused", model="policy")
    out = stages.run_evaluation(ctx, served, str(TINY), 0)
    expected = {"textcraft": "tier1", "oolong": "singledoc_rolls", "deepdive": "easy", "arte": "easy"}
    assert [(r["benchmark"], r["difficulty"], r["n"], r["successes"]) for r in out.rows] == [
        (b, d, 2, 2) for b, d in expected.items()]
    for b, d in expected.items():
        assert out.metrics[f"eval/{b}/recursive/{d}/success"] == 1.0
        assert out.metrics[f"eval/{b}/recursive/{d}/n"] == 2.0
        assert f"eval/{b}/recursive/{d}/success_ci_low" in out.metrics
    assert not [k for k in out.metrics if k.split("/")[1] not in expected]
    assert [p.seen for p in policies] == [{"textcraft-synth"}, {"oolong"}, {"deepdive"}, {"arte"}]
    assert {k for r in out.rows for k in r["per_task"]} == {
        t.task_id for b in suite.values() for t in stages.validation_tasks(ctx, b)}
    assert all(t.split == "validation" for t in oolong)
    middle = stages.run_evaluation(ctx, served, str(TINY), 1)  # oolong is evaluated at the ends only
    assert [r["benchmark"] for r in middle.rows] == ["textcraft", "deepdive", "arte"]
