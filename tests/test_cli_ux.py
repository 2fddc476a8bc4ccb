"""What a new user meets first (fresh-user findings): an empty task file is one error line, ``rao sft`` checks
``--model`` before any work and prints progress lines where no bar is drawn, and ``--help`` that goes to a
pipe is not squeezed into 80 columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import one_error_line, run_cli


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_stats_of_a_task_file_with_no_task_isone_error_line(capsys, tmp_path, content):
    f = tmp_path / "t.jsonl"
    f.write_text(content)
    code, out, err = run_cli(capsys, "tasks", "stats", str(f))
    assert code == 2 and out == ""  # an input error (exit-code rule of rao_cli)
    assert one_error_line(err) == f"error: {f}: holds no task (no non-blank line); `rao tasks generate` writes task files"


@pytest.fixture
def warm_start_calls(monkeypatch):
    """``run_warm_start`` replaced by a recorder that reports 4 demonstration trees and writes nothing."""
    import rao_core.warmstart

    calls: list[dict] = []

    def run_warm_start(env, model_path, out_dir, **kw):
        calls.append({"model_path": Path(model_path), **kw})
        for done in range(1, 5):
            if kw.get("on_demo_progress"):
                kw["on_demo_progress"](done, 4)
        raise ValueError("stop here")  # the recorder trains nothing

    monkeypatch.setattr(rao_core.warmstart, "run_warm_start", run_warm_start)
    return calls


def test_sft_refuses_a_missing_model_before_any_work(capsys, tmp_path, warm_start_calls):
    missing, empty = tmp_path / "nope", tmp_path / "notes"
    empty.mkdir()
    (empty / "a.txt").write_text("x")
    code, out, err = run_cli(capsys, "sft", "--env", "example", "--model", str(missing), "--out", str(tmp_path / "ck"))
    assert code == 2 and out == "" and warm_start_calls == []  # no "demonstrations: ..." line, nothing built
    assert one_error_line(err) == f"error: Invalid value for '--model': {missing} does not exist (see `rao sft --help`)"
    code, out, err = run_cli(capsys, "sft", "--env", "example", "--model", str(empty), "--out", str(tmp_path / "ck"))
    assert code == 2 and out == "" and warm_start_calls == []
    assert one_error_line(err) == (f"error: Invalid value for '--model': {empty} is not a checkpoint folder (no "
                                    "config.json or adapter_config.json) (see `rao sft --help`)")
    assert not (tmp_path / "ck").exists()


def test_sft_names_a_missing_default_model(capsys, tmp_path, monkeypatch, warm_start_calls):
    monkeypatch.setenv("RAO_HOME", str(tmp_path))  # no models/ there
    code, _, err = run_cli(capsys, "sft", "--env", "example", "--out", str(tmp_path / "ck"))
    default = tmp_path / "models" / "smollm2-135m-instruct"
    assert code == 2 and warm_start_calls == []
    assert one_error_line(err) == (f"error: Invalid value for '--model': {default} does not exist (the default model; "
                                    "`make setup` installs it) (see `rao sft --help`)")


def test_sft_piped_prints_demonstration_progress(capsys, tmp_path, monkeypatch, warm_start_calls):
    """Not a terminal (pytest's captured stdout): no bar, so a line per tenth of the trees (each of 4)."""
    from rao_core.paths import tiny_model_path

    monkeypatch.delenv("RAO_PROGRESS", raising=False)
    code, out, err = run_cli(capsys, "sft", "--env", "example", "--model", str(tiny_model_path()),
                          "--out", str(tmp_path / "ck"))
    assert code == 1 and one_error_line(err) == "error: stop here"
    assert warm_start_calls[0]["model_path"] == tiny_model_path()
    assert [ln for ln in out.splitlines() if ln.startswith("demonstration trees")] == [
        "demonstration trees 1/4", "demonstration trees 2/4", "demonstration trees 3/4", "demonstration trees 4/4"]


def test_piped_help_is_wider_than_80_columns(capsys, monkeypatch):
    """In 80 columns rich elided option names (``--no-mlflow-ser…``) and wrapped every help text."""
    from typer import rich_utils

    from rao_cli import PIPED_HELP_WIDTH

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    typer_width = rich_utils.MAX_WIDTH
    code, out, _ = run_cli(capsys, "services", "up", "--help")
    assert code == 0 and max(len(ln) for ln in out.splitlines()) == PIPED_HELP_WIDTH
    assert "…" not in out and "--no-mlflow-server" in out and "--no-prefect-server" in out
    assert rich_utils.MAX_WIDTH == typer_width  # typer's own setting is back after the command
    code, out, _ = run_cli(capsys, "sft", "--help")
    assert code == 0 and any("--model" in ln and "Checkpoint to fine-tune (default: SmolLM2-135M)." in ln
                             for ln in out.splitlines()), out
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and max(len(ln) for ln in out.splitlines()) == PIPED_HELP_WIDTH


def test_help_width_set_by_the_user_is_kept(capsys, monkeypatch):
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run_cli(capsys, "sft", "--help")
    assert code == 0 and max(len(ln) for ln in out.splitlines()) == 100


def test_no_command_help_shows_rst_markup():
    """``--help`` is read in a terminal: a docstring's reST double backticks would show literally (a new-user
    trial found ``error:`` and ``n`` in `rao evaluate --help` and `rao tasks generate --help`)."""
    import typer

    from rao_cli.main import app

    def walk(cmd, path):
        yield path, cmd.help or ""
        for p in cmd.params:
            yield f"{path} {p.name}", getattr(p, "help", None) or ""
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, f"{path} {name}")

    shown = list(walk(typer.main.get_command(app), "rao"))
    assert len(shown) > 100  # every command and option was walked
    assert [where for where, text in shown if "``" in text] == []
