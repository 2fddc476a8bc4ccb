"""The experiment flow's pure parts: per-arm overrides, table rows, markdown and plot (no services)."""

from __future__ import annotations

import pytest

from flows.campaign import CampaignParams
from flows.experiment import ExperimentParams, _rows, arm_overrides, learning_curve_png, results_markdown

CONFIG = "configs/experiment-textcraft-cpu.yaml"


def test_arm_overrides_share_the_warm_start_and_separate_the_registry():
    rec = arm_overrides("recursive", ["algo.G=2"], "rao-policy-x", None)
    assert rec == ["algo.G=2", "eval.modes=[recursive]"]
    single = arm_overrides("single", [], "rao-policy-x", "/ckpt/iter-0")
    cfg = CampaignParams(config=CONFIG, overrides=single).resolve()
    assert cfg.runtime.delegation is False and cfg.runtime.effective_max_depth == 0
    assert cfg.eval.modes == ["single"] and cfg.model.registered_model.endswith("-single")
    assert cfg.warm_start.mode == "checkpoint" and cfg.warm_start.checkpoint == "/ckpt/iter-0"
    first = CampaignParams(config=CONFIG, overrides=rec).resolve()
    assert first.warm_start.mode == "demos" and first.runtime.delegation is True and first.algo.G == 2
    with pytest.raises(ValueError, match="unknown arm"):
        arm_overrides("tree", [], "m", None)
    with pytest.raises(ValueError):
        ExperimentParams(arms=["recursive", "singel"])


def _row(mode: str, diff: str, success: float) -> dict:
    return {"mode": mode, "difficulty": diff, "n": 10, "success": success, "ci95": "[0.00, 0.40]",
            "mean_depth": 0.5, "delegation_rate": 0.3}


def test_rows_markdown_and_plot(tmp_path):
    summary = {"base_eval": [_row("recursive", "medium", 0.1)],
               "iterations": [{"iteration": 1, "times": {"generate_s": 100.0, "train_s": 20.5},
                               "eval_rows": [_row("recursive", "medium", 0.3)]}]}
    rows = _rows("recursive", summary) + _rows("single", {"base_eval": [_row("single", "medium", 0.0)],
                                                          "iterations": []})
    assert [(r["arm"], r["iteration"], r["success"]) for r in rows] == [
        ("recursive", 0, 0.1), ("recursive", 1, 0.3), ("single", 0, 0.0)]
    assert rows[1]["iteration_wall_s"] == 120.5 and "iteration_wall_s" not in rows[0]
    md = results_markdown(rows, {"command": "rao experiment textcraft-cpu", "config": CONFIG, "seed": 0,
                                 "commit": "abc1234", "date": "2026-11-29", "wall_s": 600.0, "n_tasks": 10})
    assert md.startswith("## Learning curve: recursive vs single agent")
    assert "| recursive | 1 | recursive | medium | 10 | 0.30 | [0.00, 0.40] | 0.5 | 0.3 | 120.5 |" in md
    assert "commit `abc1234`" in md and "10.0 min" in md
    png = learning_curve_png(rows, tmp_path / "img" / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
