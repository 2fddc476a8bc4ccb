"""The preregistered update sweep (configs/experiment-update-sweep.yaml, docs/experiments/update-sweep.md) as units:
six variants of the recursive arm (lr x minibatches per batch) from one warm start, each with its own update and the
same task stream and rollout budget, all evaluated on 100 training-split problems no unit trains on; each unit's
estimate within 90 minutes."""

from __future__ import annotations

import pytest

from tests.cli import one_error_line, run_cli

CONFIG = "configs/experiment-update-sweep.yaml"
#: variant -> (trainer.lr, trainer.steps_per_batch, trainer.target_kl), as the page's table says
VARIANTS = {"lr1e-5-mb1": (1e-5, 1, None), "lr3e-5-mb1": (3e-5, 1, None), "lr1e-4-mb1": (1e-4, 1, None),
            "lr1e-5-mb4": (1e-5, 4, 0.02), "lr3e-5-mb4": (3e-5, 4, 0.02), "lr1e-4-mb4": (1e-4, 4, 0.02)}


@pytest.fixture(scope="module")
def plan():
    from research.units import plan_units

    return plan_units("update-sweep", CONFIG)


def test_one_unit_per_variant_each_with_its_update_and_the_same_budget(plan):
    """The units: the warm start, then the six variants in the page's order; each variant's config carries its lr,
    minibatches and KL stop and is otherwise the same as every other's (seed 0: the same task pool and stream;
    12 tasks x G 4 x 5 iterations = 240 rollout trees; the same runtime and evaluation); the warm start is the
    cpu-smoke recipe with cpu-smoke's runtime, and every variant shares its evaluation."""
    from rao_core.config import load_config

    assert [u.name for u in plan.units] == ["warm-recursive", *(f"{v}-seed0" for v in VARIANTS)]
    rest = {}
    for v, (lr, mb, kl) in VARIANTS.items():
        cfg = plan.configs[f"{v}-seed0"]
        assert (cfg.trainer.lr, cfg.trainer.steps_per_batch, cfg.trainer.target_kl) == (lr, mb, kl), v
        assert (cfg.seed, cfg.tasks.tasks_per_iteration * cfg.algo.G * cfg.iterations) == (0, 240), v
        dump = cfg.model_dump(mode="json")
        for k in ("lr", "steps_per_batch", "target_kl"):
            dump["trainer"].pop(k)
        rest[v] = dump
    assert all(d == rest["lr1e-5-mb1"] for d in rest.values())
    assert plan.shares_warm_eval == {f"{v}-seed0": True for v in VARIANTS}
    smoke = load_config("configs/cpu-smoke.yaml", check_paths=False)
    warm = plan.configs["warm-recursive"]
    assert warm.warm_start == smoke.warm_start and warm.runtime == smoke.runtime
    assert (warm.tasks.difficulties, warm.tasks.pool_size, warm.algo.G) == (["tier1"], 64, 4)


def test_the_sweep_set_is_100_training_split_problems_that_no_unit_trains_on(plan):
    from rao_core.task_sampling import task_identity
    from rao_core.task_sets import training_problems

    ids = {task_identity(t) for t in plan.eval_tasks}
    assert len(plan.eval_tasks) == len(ids) == 100
    assert {(t.split, t.difficulty) for t in plan.eval_tasks} == {("train", "tier1")}
    for name, cfg in plan.configs.items():
        assert not ids & training_problems(cfg), name
        assert (cfg.eval.split, cfg.eval.seed, cfg.eval.modes) == ("train", 20261220, ["recursive"]), name


def test_status_lists_the_units_each_estimated_within_90_minutes(capsys):
    """`rao experiment update-sweep --status`: warm-recursive 34 min (32 x 2 x 16 s SFT + 120 s + 160 s + 100 trees x
    7.5 s), each variant 83 min (the same + a vLLM start and 5 x (48 trees x 4.0 s + 283 s + 82 s)), 98 min if its
    rebuilt warm start differs; the variants, their overrides and the sweep set listed."""
    code, out, err = run_cli(capsys, "experiment", "update-sweep", "--status")
    assert code == 0, err
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0].endswith(
        ("-recursive", "-seed0"))}
    assert list(rows) == ["warm-recursive", *(f"{v}-seed0" for v in VARIANTS)]
    assert rows["warm-recursive"][1:5] == ["to", "do", "34", "est."]
    for v in VARIANTS:
        assert rows[f"{v}-seed0"][1:7] == ["to", "do", "83", "est.", "98", "est."], v
    assert "7 units (1 warm start(s) with their evaluation, 6 variant x seed)" in out
    assert "lr1e-4-mb4       trainer.lr=1.0e-4 trainer.steps_per_batch=4 trainer.target_kl=0.02" in out
    assert "lr3e-5-mb1       trainer.lr=3.0e-5 trainer.steps_per_batch=1\n" in out
    assert ("evaluation set: 100 problems of the training split (eval.seed 20261220, tier1, recursive mode), none "
            "of them in any unit's RL task pool or demonstrations") in out
    assert "next: rao experiment update-sweep --unit warm-recursive" in out
    assert "every unit's time is within 100 min" in out and "5 RL iteration(s) per arm unit" in out


def test_the_sweep_runs_as_units_only_and_is_not_read_as_seeds(capsys, no_server, tmp_path, monkeypatch):
    code, _, err = run_cli(capsys, "experiment", "update-sweep")
    assert code == 2
    assert one_error_line(err) == ("error: update-sweep runs as units only: give --status (the units and the next "
                                   "command) or --unit UNIT")
    code, _, err = run_cli(capsys, "experiment", "update-sweep", "--unit", "lr1e-5-mb2-seed0")
    assert code == 2
    assert one_error_line(err).startswith("error: --unit 'lr1e-5-mb2-seed0': no such unit of update-sweep (units: "
                                          "warm-recursive, lr1e-5-mb1-seed0, lr3e-5-mb1-seed0,")
    import rao_cli.experiment_cmd as experiment_cmd

    (tmp_path / "docs/results/units/update-sweep").mkdir(parents=True)
    monkeypatch.setattr(experiment_cmd, "REPO_ROOT", tmp_path)
    code, _, err = run_cli(capsys, "experiment", "seeds", "update-sweep")
    assert code == 2
    assert one_error_line(err).startswith("error: update-sweep is a sweep of config variants: it is read by its "
                                          "preregistered decision rule (docs/experiments/update-sweep.md)")


def test_the_decision_rule_is_read_from_the_unit_records(plan, tmp_path):
    """research.sweep applies the preregistered rule to the unit records. The warm start solved 40 of the 100; no
    decision before every variant has its record; then lr1e-4-mb4 (20 lost, none gained: p = 0.5^20) is out, the
    largest gain is lr1e-4-mb1's +9, and the variants within 3 problems of it tie: fewer minibatches first, then
    the lr closest to 1.6e-5, so lr3e-5-mb1 (+7: 7 gained, none lost, p = 0.5^7 < 0.10) is chosen and learns. A unit
    whose rebuilt warm start differed is paired with its own iteration 0."""
    import research.units as ru
    from research.sweep import sweep_reading

    ids = [t.task_id for t in plan.eval_tasks]

    def point(iteration, solved):
        return {"iteration": iteration, "difficulty": "tier1", "mode": "recursive",
                "per_task": {k: float(i in solved) for i, k in enumerate(ids)}}

    def write(unit, points):
        ru.write_record(ru.record_path("update-sweep", unit, tmp_path),
                        {"unit": unit, "complete": True, "wall_s": 1.0, "points": points})

    write("warm-recursive", [point(0, set(range(40)))])
    lasts = {"lr1e-5-mb1": set(range(45)), "lr3e-5-mb1": set(range(47)), "lr1e-4-mb1": set(range(49)),
             "lr1e-5-mb4": set(range(48)), "lr3e-5-mb4": set(range(5, 52)), "lr1e-4-mb4": set(range(20))}
    for v in list(VARIANTS)[:5]:
        write(f"{v}-seed0", [point(5, lasts[v])])
    reading = sweep_reading(plan, tmp_path)
    assert (reading["complete"], reading["chosen"], len(reading["rows"])) == (False, None, 5)
    write("lr1e-4-mb4-seed0", [point(5, lasts["lr1e-4-mb4"])])
    reading = sweep_reading(plan, tmp_path)
    rows = {r["variant"]: r for r in reading["rows"]}
    assert [(rows[v]["gain"], rows[v]["gained"], rows[v]["lost"]) for v in VARIANTS] == [
        (5, 5, 0), (7, 7, 0), (9, 9, 0), (8, 8, 0), (7, 12, 5), (-20, 0, 20)]
    assert (rows["lr3e-5-mb1"]["warm"], rows["lr3e-5-mb1"]["last"], rows["lr3e-5-mb1"]["n"]) == (40, 47, 100)
    assert rows["lr1e-4-mb4"]["p_decrease"] == 0.5 ** 20 and rows["lr3e-5-mb1"]["p_increase"] == 0.5 ** 7
    assert reading["out"] == ["lr1e-4-mb4"] and reading["complete"]
    assert reading["tied"] == ["lr3e-5-mb1", "lr1e-4-mb1", "lr1e-5-mb4", "lr3e-5-mb4"]
    assert (reading["chosen"], reading["learns"]) == ("lr3e-5-mb1", True)
    assert {r["warm_start_from"] for r in reading["rows"]} == {"warm-start unit"}
    # lr1e-5-mb1's rebuilt warm start differed: its own iteration 0 (30 solved) is its pair, +15, now the choice
    write("lr1e-5-mb1-seed0", [point(0, set(range(30))), point(5, lasts["lr1e-5-mb1"])])
    reading = sweep_reading(plan, tmp_path)
    assert reading["rows"][0]["warm_start_from"] == "this unit" and reading["rows"][0]["gain"] == 15
    assert (reading["tied"], reading["chosen"], reading["learns"]) == (["lr1e-5-mb1"], "lr1e-5-mb1", True)


def test_ties_go_to_the_rate_closest_to_the_authors_scaled_one_and_learning_needs_p_below_010():
    """A tie within 3 problems goes to the lr closest to 1.6e-5 (1e-5 before 3e-5), even against a larger gain; the
    choice then learns only with p < 0.10 (3 gained, 1 lost: p = 5/16 does not; 0.06 does); every variant out: no
    choice."""
    from research.sweep import choose

    row = {"minibatches": 1, "out": False}
    rows = [{**row, "variant": "a", "lr": 1e-5, "gain": 2, "p_increase": 5 / 16},
            {**row, "variant": "b", "lr": 3e-5, "gain": 4, "p_increase": 0.06}]
    assert choose(rows) == {"out": [], "tied": ["a", "b"], "chosen": "a", "learns": False}
    assert choose(rows[1:])["learns"] is True  # p = 0.06: below the screening level 0.10
    assert choose([{**rows[1], "out": True}]) == {"out": ["b"], "tied": [], "chosen": None, "learns": False}
