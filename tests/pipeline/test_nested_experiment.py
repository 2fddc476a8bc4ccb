"""``rao experiment textcraft-nested`` (train on nest1, trees of depth 1; evaluate on nest1 and
nest2, depth 2): its config, its command, its plan, and what its record, tables and plots say per depth, from
hand-built trees of depth 2 (no services)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flows.campaign import CampaignParams
from research.designs import arm_overrides
from research.experiment import ExperimentParams
from rao_core.config import load_config
from rao_core.evaluation import summarise
from rao_core.tree import EndReason, ExecutionTree, Node, Turn
from research.records import (comparisons_markdown, deep_config, depth_markdown, depth_png, depth_reach,
                              depth_seeds_markdown, experiment_record, iteration_stats, seed_comparison)

CONFIG = "configs/experiment-textcraft-nested.yaml"
F, CO, MS = EndReason.FINISHED, EndReason.CONTEXT_OVERFLOW, EndReason.MAX_STEPS


def _tree(tid: str, spec: list[tuple[str, str | None, float | None, EndReason]]) -> ExecutionTree:
    """A tree from ``(node_id, parent_id, verifier, end_reason)`` rows (depth from the parents), 4 tokens each."""
    depth: dict[str, int] = {}
    nodes = []
    for nid, parent, v, end in spec:
        depth[nid] = 0 if parent is None else depth[parent] + 1
        turn = Turn(prompt_token_ids=[1], completion_token_ids=[3] * 4, completion_logprobs=[-0.5] * 4, text="t",
                    code="print(1)", observation="1")
        nodes.append(Node(node_id=nid, parent_id=parent, depth=depth[nid], goal=f"goal {nid}", verifier=v,
                          end_reason=end, token_ids=[1] + [3] * 4, assistant_mask=[0] + [1] * 4,
                          behaviour_logprobs=[0.0] + [-0.5] * 4, turns=[turn]))
    for n in nodes:
        if n.parent_id is not None:
            next(p for p in nodes if p.node_id == n.parent_id).children.append(n.node_id)
    return ExecutionTree(tree_id=tid, env="textcraft-synth", task_id=f"task-{tid}", root_id="0", nodes=nodes,
                         wall_s=1.0)


def _nest2_trees() -> list[ExecutionTree]:
    """A: every node of a 7-node tree solves its goal (depth 2). B: the root fails; its first child delegated
    and overflowed (one grandchild solved, one ran out of steps), its second child crafted alone (depth 2).
    C: the root alone, out of its window (depth 0)."""
    a = _tree("a", [("0", None, 1.0, F), ("0.0", "0", 1.0, F), ("0.1", "0", 1.0, F), ("0.0.0", "0.0", 1.0, F),
                    ("0.0.1", "0.0", 1.0, F), ("0.1.0", "0.1", 1.0, F), ("0.1.1", "0.1", 1.0, F)])
    b = _tree("b", [("0", None, 0.0, F), ("0.0", "0", 0.0, CO), ("0.1", "0", 1.0, F), ("0.0.0", "0.0", 1.0, F),
                    ("0.0.1", "0.0", 0.0, MS)])
    c = _tree("c", [("0", None, 0.0, CO)])
    return [a, b, c]


def _nest1_trees() -> list[ExecutionTree]:
    return [_tree("d", [("0", None, 1.0, F), ("0.0", "0", 1.0, F), ("0.1", "0", 1.0, F)]),
            _tree("e", [("0", None, 0.0, F), ("0.0", "0", 1.0, F), ("0.1", "0", 0.0, MS)])]


def _rows(iteration: int, nest2: list[ExecutionTree] | None = None) -> list[dict]:
    out = []
    for diff, trees in (("nest1", _nest1_trees()), ("nest2", nest2 or _nest2_trees())):
        row = summarise(trees, mode="recursive", difficulty=diff).table_row()
        out.append({"arm": "recursive", "iteration": iteration, **row})
    return out


def test_the_config_loads_trains_one_level_and_evaluates_two():
    cfg = load_config(CONFIG, check_paths=False)
    assert cfg.name == "textcraft-nested" and cfg.tasks.difficulties == ["nest1"]
    assert cfg.warm_start.mode == "demos" and cfg.warm_start.difficulties == ["nest1"]
    assert cfg.warm_start.options["recurse"] is True and cfg.warm_start.options["single_agent_fraction"] == 0.0
    assert (cfg.runtime.max_depth, cfg.runtime.context_window, cfg.runtime.max_new_tokens) == (4, 1344, 256)
    assert cfg.serving.max_model_len == 1344 and cfg.runtime.delegation is True
    assert cfg.eval.difficulties == ["nest1", "nest2"] and cfg.eval.n_tasks >= 100 and cfg.eval.seed == 20261205
    ep = cfg.eval.endpoint
    assert (ep.arm, ep.difficulty, ep.mode, ep.iteration, ep.against, ep.n, ep.min_difference) == (
        "recursive", "nest1", "recursive", "last", "warm_start", 100, 0.15)
    assert deep_config(cfg.model_dump(mode="json")) is True
    assert deep_config(load_config("configs/experiment-textcraft-ablation.yaml").model_dump(mode="json")) is False
    # the evaluation seed is fresh: no other config or record names it (this experiment's own records do)
    root = Path(__file__).resolve().parents[2]
    others = [p for p in [*root.glob("configs/*.yaml"), *root.glob("docs/results/*.json")]
              if p.name != Path(CONFIG).name and not p.name.startswith("textcraft-nested")]
    assert not [p for p in others if "20261205" in p.read_text()]
    # the preregistration is written in the file's header, before any setting
    head = Path(root / CONFIG).read_text().split("\nname:")[0]
    assert "PREREGISTERED" in head and "20261205" in head and ">= 0.15" in head


def test_the_endpoint_refuses_an_impossible_difference():
    from rao_core.config import ConfigError

    with pytest.raises(ConfigError, match="min_difference"):
        load_config(CONFIG, ["eval.endpoint.min_difference=1.5"], check_paths=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_plan_resolves_for_every_seed_and_its_task_sets_are_disjoint(seed):
    """What ``rao experiment textcraft-nested --seed S`` runs: one recursive arm, its seeds set everywhere, the
    evaluation set the same for every seed and disjoint from the pool and the demonstrations."""
    from rao_core.task_sets import check_task_sets

    p = ExperimentParams(experiment="textcraft-nested", config=CONFIG, arms=["recursive"], seed=seed)
    base = CampaignParams(config=CONFIG, overrides=p.seed_overrides()).resolve()
    extra = arm_overrides("recursive", p.seed_overrides(), base.model.registered_model, None)
    cfg = CampaignParams(config=CONFIG, name="textcraft-nested-recursive", overrides=extra).resolve()
    assert (cfg.seed, cfg.trainer.seed, cfg.warm_start.trainer.seed) == (seed, seed, seed)
    assert cfg.eval.modes == ["recursive"] and cfg.warm_start.mode == "demos" and cfg.runtime.max_depth == 4
    assert p.seeded_name(0) == ("textcraft-nested" if seed == 0 else f"textcraft-nested-seed{seed}")
    assert check_task_sets(cfg) == {"evaluation (eval.seed 20261205)": 200, f"training (seed {seed})": 200,
                                    f"demonstrations (seed {seed})": 20}


def test_the_warm_start_demonstrates_the_expert_that_recurses():
    from rao_core.runtime import RuntimeConfig
    from rao_core.warmstart import DemoConfig, expert_for_tree

    cfg = load_config(CONFIG, check_paths=False)
    demo = DemoConfig(n_tasks=cfg.warm_start.n_tasks, difficulties=cfg.warm_start.difficulties, seed=cfg.seed,
                      **cfg.warm_start.options)
    e = expert_for_tree("textcraft-synth", demo, 3, cfg.runtime)
    assert e.recurse is True and e.max_depth == 4 and e.child_steps == 6
    assert expert_for_tree("textcraft-synth", DemoConfig(), 3, RuntimeConfig()).recurse is False  # the default
    from scripts.shape_fit import expert  # the fit script's recursing expert is the warm start's

    assert vars(expert("textcraft-synth", DemoConfig(), 3, cfg.runtime, recurse=True)) == vars(
        expert_for_tree("textcraft-synth", DemoConfig(recurse=True), 3, cfg.runtime))


def test_the_command_is_listed_with_its_config(capsys):
    from rao_cli.main import main

    for argv in (["experiment", "--help"], ["experiment", "textcraft-nested", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        out = capsys.readouterr().out
        assert e.value.code == 0 and "textcraft-nested" in out
    assert "configs/experiment-textcraft-nested.yaml" in out and "--seed" in out and "nest2" in out


def test_the_record_keeps_every_depth_of_hand_built_trees():
    rows = _rows(0) + _rows(1)
    rec = experiment_record("textcraft-nested", rows, {"command": "c", "config": CONFIG, "seed": 0, "commit": "x",
                                                       "date": "d", "wall_s": 1.0}, {}, {})
    p = next(q for q in rec["points"] if q["difficulty"] == "nest2" and q["iteration"] == 0)
    assert (p["n"], p["successes"], p["depth_hist"], p["children_per_tree"]) == (3, 1.0, {"0": 1, "2": 2},
                                                                                 {"0": 1, "2": 2})
    assert p["end_reasons"] == {"context_overflow": 1, "finished": 2}
    d = p["per_depth"]
    assert d["0"] == {"nodes": 3, "scored": 3, "success": round(1 / 3, 6), "delegation_rate": round(2 / 3, 6),
                      "children_per_node": round(4 / 3, 6), "end_reasons": {"context_overflow": 1, "finished": 2}}
    # depth 1: A's two children and B's (1, 1, 0, 1); three of them delegated two each
    assert d["1"] == {"nodes": 4, "scored": 4, "success": 0.75, "delegation_rate": 0.75, "children_per_node": 1.5,
                      "end_reasons": {"context_overflow": 1, "finished": 3}}
    # depth 2: A's four grandchildren (solved) and B's two (one solved, one out of steps)
    assert d["2"] == {"nodes": 6, "scored": 6, "success": round(5 / 6, 6), "delegation_rate": 0.0,
                      "children_per_node": 0.0, "end_reasons": {"finished": 5, "max_steps": 1}}
    assert p["child_success"] == 0.75 and p["child_nodes"] == 4  # the depth-1 columns agree with per_depth
    assert json.loads(json.dumps(rec)) == rec
    assert depth_reach(p["depth_hist"], 1) == depth_reach(p["depth_hist"], 2) == (2, 3)
    assert depth_reach(p["depth_hist"], 3) == (0, 3) and depth_reach({}, 1) == (0, 0)


def test_the_depth_tables_and_plot(tmp_path):
    rows = _rows(0) + _rows(1, nest2=_nest2_trees()[:2])
    md = depth_markdown(rows)
    assert "| recursive | 0 | recursive | nest2 | 2 | 6 | 0.833 | 0.000 | 0.000 | finished 5, max_steps 1 |" in md
    assert "| recursive | 0 | recursive | nest1 | 1 | 4 | 0.750 | 0.000 | 0.000 | finished 3, max_steps 1 |" in md
    # the depth histogram, with the share of trees reaching each depth (Wilson 95%)
    assert re.search(r"\| recursive \| 0 \| recursive \| nest2 \| 0: 1, 2: 2 \| 2/3 = 0\.67 \[0\.\d\d, 0\.\d\d\] \| "
                     r"2/3 = 0\.67 \[", md)
    assert "| recursive | 1 | recursive | nest2 | 2: 2 | 2/2 = 1.00 [" in md
    assert depth_markdown([{"arm": "a", "iteration": 0}]) == ""  # rows without per-depth statistics
    path = depth_png(rows, tmp_path / "d.png")
    assert path == tmp_path / "d.png" and path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5000
    assert depth_png([{"arm": "a"}], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_rollout_success_per_depth_is_kept():
    s = iteration_stats({"success/root": 0.5, "success/depth_1": 0.6, "success/depth_2": 0.25,
                         "success/depth_10": 0.1, "success/depth_x": 1.0})
    assert s["rollout_success_per_depth"] == {"1": 0.6, "2": 0.25, "10": 0.1}  # numeric order, digits only
    assert s["rollout_depth1_success"] == 0.6 and iteration_stats({})["rollout_success_per_depth"] == {}


def _seed_record(seed: int, base: list[int], last: list[int], diff: str = "nest1") -> dict:
    pts = []
    for it, v in ((0, base), (3, last)):
        hist = {"1": len(v)} if diff == "nest1" else {"1": 1, "2": len(v) - 1}
        pts.append({"arm": "recursive", "iteration": it, "difficulty": diff, "mode": "recursive", "n": len(v),
                    "successes": float(sum(v)), "success": sum(v) / len(v), "depth_hist": hist,
                    "per_task": {f"t{k}": x for k, x in enumerate(v)},
                    "per_depth": {"0": {"nodes": len(v), "scored": len(v), "success": sum(v) / len(v)},
                                  "1": {"nodes": 2 * len(v), "scored": 2 * len(v), "success": 0.5 + 0.1 * it / 3}}})
    return {"seed": seed, "experiment": "textcraft-nested", "points": pts,
            "endpoint": {"arm": "recursive", "against": "warm_start", "difficulty": "nest1", "min_difference": 0.15},
            "config_values": {"runtime": {"max_depth": 4, "delegation": True}}}


def test_the_endpoint_needs_its_pooled_difference_and_the_seeds_section_has_depths(tmp_path):
    from research.experiment import write_seeds_section

    # 10 tasks; the warm start solves 2, the last iteration 4, in every seed: +0.2, but only 2 tasks differ
    recs = [_seed_record(s, [1] * 2 + [0] * 8, [1] * 4 + [0] * 6) for s in (0, 1, 2)]
    c = seed_comparison(recs, "recursive", "warm_start", "nest1", min_difference=0.15)
    assert c["pooled_difference"] == pytest.approx(0.2) and c["min_difference"] == 0.15
    assert c["p_tasks_sign_test"] == pytest.approx(0.25) and c["supported"] is False  # 2 tasks: p = 1/4
    # 40 tasks, +0.125 in every seed: significant over tasks, but below the preregistered 0.15
    small = [_seed_record(s, [0] * 40, [1] * 5 + [0] * 35) for s in (0, 1, 2)]
    c2 = seed_comparison(small, "recursive", "warm_start", "nest1", min_difference=0.15)
    assert c2["p_tasks_sign_test"] < 0.05 and c2["pooled_difference"] == pytest.approx(0.125)
    assert c2["supported"] is False
    assert seed_comparison(small, "recursive", "warm_start", "nest1")["supported"] is True  # no threshold
    big = [_seed_record(s, [0] * 40, [1] * 7 + [0] * 33) for s in (0, 1, 2)]  # +0.175
    assert seed_comparison(big, "recursive", "warm_start", "nest1", min_difference=0.15)["supported"] is True
    # both difficulties get a block; the endpoint is marked (and judged) on its own difficulty only
    both = [{**r, "points": r["points"] + _seed_record(r["seed"], [0] * 40, [0] * 40, "nest2")["points"]}
            for r in small]
    md = comparisons_markdown("textcraft-nested", both)
    assert md.count("Difficulty nest") == 2 and md.count("(preregistered)") == 1
    assert "| recursive vs warm_start (preregistered) | 3 |" in md and "no (pooled difference >= 0.15: +0.12) |" in md
    out = write_seeds_section("textcraft-nested", both, write_docs=False, root=tmp_path)
    assert "### Per depth over seeds" in out
    # per seed: root success and trees at depth >= 1 and 2 with intervals, the depth-1 nodes' success
    assert re.search(r"\| recursive \| nest2 \| 1 \| 3 \| 0/40 = 0\.00 \[0\.00, 0\.\d\d\] \| 40/40 = 1\.00 \[0\.\d\d, "
                     r"1\.00\] \| 39/40 = 0\.97 \[0\.87, 1\.00\] \| 0\.60 \(80\) \|  \|", out)
    assert re.search(r"\| recursive \| nest1 \| pooled \(3 seeds\) \| last \| 15/120 = 0\.12 \[0\.\d\d, 0\.\d\d\] \| "
                     r"120/120 = 1\.00 \[0\.\d\d, 1\.00\] \| 0/120 = 0\.00 \[0\.00, 0\.\d\d\] \| 0\.60 \(240 scored\) \|",
                     out)
    one_level = [{**r, "config_values": {"runtime": {"max_depth": 1}}} for r in both]  # the ablation: unchanged
    assert "Per depth" not in write_seeds_section("textcraft-nested", one_level, write_docs=False, root=tmp_path)


def test_the_flow_writes_the_depth_record_tables_and_plot(tmp_path, monkeypatch):
    """``rao_experiment`` for textcraft-nested with the campaign replaced by a summary of hand-built trees: the
    record has every depth of both splits, the results section its per-depth tables, and the depth plot exists."""
    import logging

    import mlflow

    import research.experiment as fe
    from research.records import write_results

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    run_id = mlflow.MlflowClient().create_run(mlflow.create_experiment("e")).info.run_id
    seen = []

    def campaign(params):
        seen.append(params)
        strip = [{k: v for k, v in r.items() if k not in ("arm", "iteration")} for r in _rows(0)]
        return {"mlflow_run_id": run_id, "warm_start": {"mode": "demos", "checkpoint_local": None},
                "base_eval": strip, "iterations": [{"iteration": 1, "times": {"generate": 1.0},
                                                    "metrics": {"success/depth_2": 0.5}, "eval_rows": strip}]}

    monkeypatch.setattr(fe, "rao_campaign", campaign)
    monkeypatch.setattr(fe, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(fe, "write_results", lambda *a, **k: write_results.fn(*a, **{**k, "out_root": tmp_path}))
    out = fe.rao_experiment.fn(ExperimentParams(experiment="textcraft-nested", config=CONFIG, arms=["recursive"],
                                                seed=1, write_docs=False))
    assert [p.name for p in seen] == ["textcraft-nested-seed1-recursive"]
    rec = json.loads((tmp_path / "docs/results/textcraft-nested-seed1.json").read_text())
    assert rec == out["record"] and rec["arms"] == ["recursive"] and (rec["seed"], rec["eval_seed"]) == (1, 20261205)
    assert rec["command"].startswith("rao experiment textcraft-nested --config " + CONFIG + " --seed 1 --arm recursive")
    assert rec["endpoint"]["min_difference"] == 0.15 and rec["config_values"]["runtime"]["max_depth"] == 4
    assert rec["training"][0]["rollout_success_per_depth"] == {"2": 0.5}
    nest2 = [p for p in rec["points"] if p["difficulty"] == "nest2"]
    assert [p["iteration"] for p in nest2] == [0, 1] and all(p["per_depth"]["2"]["nodes"] == 6 for p in nest2)
    assert rec["test"]["difficulty"] == "nest1"  # the per-run test is on the training level
    assert (tmp_path / "docs/img/textcraft-nested-seed1-depth.png").stat().st_size > 5000
    assert "### Per depth" in out["markdown"] and "img/textcraft-nested-seed1-depth.png" in out["markdown"]
