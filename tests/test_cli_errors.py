"""Every CLI error, usage errors included, is ONE ``error: ...`` line and a non-zero exit (issue 16, item 2);
``RAO_DEBUG=1`` keeps the traceback."""

from __future__ import annotations

import json

import pytest

from rao_cli.main import main


def _run(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    err = capsys.readouterr().err
    return e.value.code, err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_usage_error_is_one_line(capsys, tmp_path):
    code, err = _run(capsys, "tasks", "generate", "--env", "textcraft-synth", "--n", "-1",
                     "--out", str(tmp_path / "t.jsonl"))
    line = _one_error_line(err)
    assert code == 2 and "'--n'" in line and "rao tasks generate --help" in line
    assert not (tmp_path / "t.jsonl").exists()


def test_unknown_command_and_option_are_one_line(capsys):
    code, err = _run(capsys, "nope")
    assert code == 2 and "No such command 'nope'" in _one_error_line(err)
    code, err = _run(capsys, "tasks", "generate", "--nn", "3")
    assert code == 2 and "--nn" in _one_error_line(err)


def test_missing_sandbox_file_is_one_line(capsys, tmp_path):
    code, err = _run(capsys, "sandbox", "run", str(tmp_path / "missing.py"))
    assert code != 0 and "file not found" in _one_error_line(err)


def test_task_for_another_env_is_one_line(capsys, tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"task_id": "o1", "env": "oolong", "data": {}}) + "\n")
    code, err = _run(capsys, "solve", "--env", "textcraft-synth", "--task-file", str(f))
    line = _one_error_line(err)
    assert code == 1 and f"{f}:1:" in line and "env:" in line and "'textcraft-synth'" in line


def test_bad_task_record_is_one_line(capsys, tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"task_id": 123, "env": "textcraft-synth"}) + "\n")
    code, err = _run(capsys, "solve", "--env", "textcraft-synth", "--task-file", str(f))
    assert code == 1 and "task_id: Input should be a valid string" in _one_error_line(err)


def test_unexpected_exception_is_one_line_and_debug_keeps_traceback(capsys, monkeypatch, tmp_path):
    import rao_cli.tasks_cmd as tasks_cmd

    def broken(path):
        raise KeyError("boom\nsecond line")

    monkeypatch.setattr(tasks_cmd, "task_stats", broken)
    f = tmp_path / "t.jsonl"
    f.write_text("")
    code, err = _run(capsys, "tasks", "stats", str(f))
    assert code == 1 and "KeyError" in _one_error_line(err) and "RAO_DEBUG=1" in err
    monkeypatch.setenv("RAO_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["tasks", "stats", str(f)])
    with pytest.raises(Exception, match="file not found"):
        main(["sandbox", "run", str(tmp_path / "missing.py")])
