"""`rao sft` end to end on the tiny model (2 easy demonstrations, 1 epoch)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rao_core.paths import tiny_model_path
from rao_core.train.checkpoint import read_manifest
from rao_core.tree import read_trees

pytestmark = pytest.mark.skipif(not (tiny_model_path() / "tokenizer_config.json").exists(),
                                reason="tiny model not prepared (make setup)")


@pytest.mark.slow
def test_rao_sft_builds_demos_and_writes_a_checkpoint(tmp_path):
    from rao_cli.main import app

    cfg = tmp_path / "c.yaml"
    cfg.write_text("warm_start:\n  difficulties: [easy]\n  trainer:\n    micro_batch_tokens: 4096\n"
                   "runtime:\n  sandbox: none\n")
    out = tmp_path / "ckpt"
    res = CliRunner().invoke(app, ["sft", "--n-tasks", "2", "--seed", "3", "--model", str(tiny_model_path()),
                                   "--out", str(out), "--epochs", "1", "--lr", "1e-3", "--config", str(cfg),
                                   "--trees", str(tmp_path / "demos.jsonl")])
    assert res.exit_code == 0, res.output
    assert f"checkpoint: {out}" in res.output
    stats = json.loads(res.output[res.output.index("{"):res.output.rindex("}") + 1])
    assert stats["stats"]["trees"] == 2 and stats["samples"] >= 2
    man = read_manifest(out)
    assert man["config"]["loss_type"] == "sft" and man["config"]["lr"] == 1e-3 and man["num_samples"] == stats["samples"]
    assert len(read_trees(tmp_path / "demos.jsonl")) == 2


def test_rao_sft_rejects_bad_config(tmp_path):
    from rao_cli.main import app

    cfg = tmp_path / "c.yaml"
    cfg.write_text("warm_start:\n  parallel_prob: 3\n")
    res = CliRunner().invoke(app, ["sft", "--out", str(tmp_path / "x"), "--config", str(cfg)])
    assert res.exit_code != 0 and "parallel_prob" in res.output


def test_rao_sft_reads_a_campaign_config_and_refuses_zero_tasks(tmp_path):
    """cpu-smoke's warm_start section (mode, options) is understood; --n-tasks 0 is refused, not taken as unset."""
    from rao_cli.main import app

    res = CliRunner().invoke(app, ["sft", "--out", str(tmp_path / "x"), "--config", "configs/cpu-smoke.yaml",
                                   "--n-tasks", "0"])
    assert res.exit_code == 2, res.output
    assert "n_tasks: Input should be greater than or equal to 1" in res.output
    assert "Extra inputs" not in res.output and not (tmp_path / "x").exists()
