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


def test_generate_replaces_a_task_file_but_refuses_any_other_existing_file(tmp_path):
    """A new user's `--out README.md` replaced the README with tasks: only a task file (or an empty one) is
    replaced; any other file is refused with one line, exit 2, and keeps its bytes."""
    args = ["generate", "--env", "textcraft-synth", "--n", "2", "--seed", "1"]
    tasks = tmp_path / "t.jsonl"
    assert runner.invoke(app, [*args, "--out", str(tasks)]).exit_code == 0
    assert runner.invoke(app, [*args[:4], "3", *args[5:], "--out", str(tasks)]).exit_code == 0
    assert len(load_tasks(tasks)) == 3  # a task file is regenerated in place
    notes = tmp_path / "notes.md"
    notes.write_text("precious\n")
    res = runner.invoke(app, [*args, "--out", str(notes)])
    assert res.exit_code == 2 and notes.read_text() == "precious\n"
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --out {notes} exists and is not a task file ("), lines
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert runner.invoke(app, [*args, "--out", str(empty)]).exit_code == 0 and len(load_tasks(empty)) == 2


def test_stats_piped_keeps_every_column_whole(capsys, monkeypatch, tmp_path):
    """Piped output (not a terminal) is not cut to rich's default 80 columns: every header whole."""
    import pytest

    from rao_cli.main import main

    monkeypatch.delenv("COLUMNS", raising=False)
    f = tmp_path / "t.jsonl"
    with pytest.raises(SystemExit):
        main(["tasks", "generate", "--env", "textcraft-synth", "--n", "3", "--seed", "1", "--out", str(f)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["tasks", "stats", str(f)])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "…" not in out
    header = next(line for line in out.splitlines() if "group" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == [
        "group", "n", "median_gold_crafts", "median_inventory_items", "median_inventory_units"]
    assert len(header) > 80
