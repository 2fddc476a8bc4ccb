"""``rao tasks generate`` / ``rao tasks stats``."""

from __future__ import annotations

from typer.testing import CliRunner

from rao_cli.tasks_cmd import app, task_stats
from rao_core.envs import load_tasks

runner = CliRunner()


def test_generate_is_byte_identical_and_stats_summarise(tmp_path):
    args = ["generate", "--env", "textcraft-synth", "--n", "5", "--seed", "4", "--difficulty", "medium"]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert runner.invoke(app, [*args, "--out", str(a)]).exit_code == 0
    assert runner.invoke(app, [*args, "--out", str(b)]).exit_code == 0
    assert a.read_bytes() == b.read_bytes() and len(load_tasks(a)) == 5
    rows = task_stats(a)
    assert list(rows) == ["textcraft-synth/train/medium"] and rows["textcraft-synth/train/medium"]["n"] == 5
    res = runner.invoke(app, ["stats", str(a)])
    assert res.exit_code == 0 and "textcraft-synth" in res.output


def test_generate_passes_options_and_reports_errors(tmp_path):
    out = tmp_path / "o.jsonl"
    res = runner.invoke(app, ["generate", "--env", "oolong", "--n", "2", "--split", "validation",
                              "-o", "target_tokens=600", "--out", str(out)])
    assert res.exit_code == 0, res.output
    tasks = load_tasks(out)
    assert all(t.split == "validation" and t.data["context_tokens"] >= 600 for t in tasks)
    bad = runner.invoke(app, ["generate", "--env", "textcraft-synth", "--n", "1", "--difficulty", "nope",
                              "--out", str(tmp_path / "x.jsonl")])
    assert bad.exit_code == 2 and "unknown difficulty" in bad.output
    bad_env = runner.invoke(app, ["generate", "--env", "minecraft", "--n", "1", "--out", str(tmp_path / "y.jsonl")])
    assert bad_env.exit_code == 2 and "unknown environment" in bad_env.output
