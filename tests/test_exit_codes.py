"""One exit-code rule for every ``rao`` command (``rao_cli``'s docstring): 2 for a usage or
input error, 1 for a failure while working, 130 / 143 for an interrupt, each told in ONE ``error:`` line on
stderr. Every subcommand is run here with a bad option or input (the table covers them all: a command added
without a row fails :func:`test_the_table_covers_every_command`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rao_cli.main import main

BAD_YAML = "name: x\nalgo:\n  G: 8\n   lam: 1\n"  # line 4, column 7: `lam:` deeper than `G: 8`
YAML_WHERE = "line 4, column 7: not valid YAML: mapping values are not allowed here"


@pytest.fixture
def inputs(tmp_path) -> dict[str, str]:
    """Files of the table: a config with a YAML syntax error, a file that is no task / tree record, an empty
    task file, a folder that looks like a checkpoint."""
    (tmp_path / "bad.yaml").write_text(BAD_YAML)
    (tmp_path / "garbage.jsonl").write_text("garbage\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    return {"tmp": str(tmp_path), "bad_yaml": str(tmp_path / "bad.yaml"), "garbage": str(tmp_path / "garbage.jsonl"),
            "empty": str(tmp_path / "empty.jsonl"), "ckpt": str(tmp_path / "ckpt")}


@pytest.fixture
def in_process(tmp_path, monkeypatch):
    """Commands run in this process set environment defaults and a SIGTERM handler (``rao run``, ``rao
    evaluate``, ``rao deploy``, ``rao experiment``): a private RAO_HOME, no service to reach, and the
    environment and the handler restored afterwards."""
    saved_env, saved_term = dict(os.environ), signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAO_DEBUG", raising=False)
    for k, v in {"PREFECT_API_URL": "http://127.0.0.1:9/api", "RAO_S3_ENDPOINT": "http://127.0.0.1:9",
                 "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}.items():
        monkeypatch.setenv(k, v)
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    signal.signal(signal.SIGTERM, saved_term)


# (argv with {placeholders} of `inputs`, exit code, text the one error line holds)
CASES = [
    ("services up --no-s3 --prefect-port 99999", 2, "Invalid value for '--prefect-port'"),
    ("services up --no-s3 --model {tmp}/nope", 2, "Invalid value for '--model': {tmp}/nope does not exist"),
    ("services down --nope", 2, "No such option: --nope"),
    ("services status --nope", 2, "No such option: --nope"),
    ("tasks generate --env nosuchenv --n 1 --out {tmp}/t.jsonl", 2,
     "Invalid value for '--env': unknown environment 'nosuchenv'"),
    ("tasks stats {garbage}", 2, "error: {garbage}:1: not a valid task record: invalid JSON"),
    ("tasks stats {empty}", 2, "error: {empty}: holds no task"),
    ("sandbox run /dev/null", 2, "Invalid value for FILE: /dev/null is a character device, not a regular file"),
    ("sandbox run {empty}", 2, "Invalid value for FILE: {empty} is empty: no code to run"),
    ("judge trees --in {garbage} --out {tmp}/s.jsonl --no-judge", 2,
     "error: {garbage}:1: not a valid execution tree record"),
    ("judge trees --in {tmp}/none.jsonl --out {tmp}/s.jsonl --env nosuchenv", 2, "Invalid value for '--env'"),
    ("judge calibrate --trees {garbage} --base-url http://127.0.0.1:9/v1", 2,
     "error: {garbage}:1: not a valid execution tree record"),
    ("experiment textcraft-tier1 --arm both", 2, "Invalid value for '--arm'"),
    ("experiment textcraft-tier1x --single-max-steps 0", 2, "Invalid value for '--single-max-steps'"),
    ("experiment textcraft-ablation --single-warm-start mine", 2, "Invalid value for '--single-warm-start'"),
    ("experiment textcraft-nested --arm deeper", 2, "Invalid value for '--arm'"),
    ("experiment textcraft-deeper --single-checkpoint {tmp}/nope", 2,
     "warm_start.checkpoint = '{tmp}/nope': no checkpoint folder there"),
    ("experiment textcraft-cpu --config {bad_yaml}", 2, "error: {bad_yaml}: " + YAML_WHERE),
    ("experiment update-sweep --unit nope", 2, "error: --unit 'nope': no such unit of update-sweep"),
    ("experiment seeds no-such-experiment", 2, "no record of no-such-experiment under "),
    ("experiment rerun {tmp}/none.json {garbage}", 2, "error: record not found: {tmp}/none.json"),
    ("experiment rerun {garbage} {garbage}", 2, "error: {garbage}: not a JSON record"),
    ("experiment textcraft-generalisation --arm both", 2, "error: unknown arm 'both' (expected one of "),
    ("experiment textcraft-wallclock --setting fast", 2, "error: unknown setting 'fast' (expected one of "),
    ("experiment depth-control --record {tmp}/none.json --dry-run", 2,
     "error: record not found: {tmp}/none.json; run `rao experiment textcraft-nested` first"),
    ("solve --env nosuchenv --task-file {garbage}", 2, "Invalid value for '--env': unknown environment 'nosuchenv'"),
    ("solve --env textcraft-synth --task-file {garbage}", 2, "error: {garbage}:1: not a valid task record"),
    ("train --samples {tmp}/none.jsonl --model {ckpt} --out {tmp}/out", 2,
     "error: sample record file not found: {tmp}/none.jsonl"),
    ("train --samples {empty} --model {ckpt} --out {tmp}/out --config {bad_yaml}", 2,
     "error: {bad_yaml}: " + YAML_WHERE),
    ("sft --out {tmp}/out --config {tmp}/nope.yaml --model {tmp}/nomodel", 2, "config file not found: {tmp}/nope.yaml"),
    ("sft --env nosuchenv --model {ckpt} --out {tmp}/out", 2,
     "Invalid value for '--env': unknown environment 'nosuchenv'"),
    ("run --iterations -1", 2, "Invalid value for '--iterations': Input should be greater than or equal to 0"),
    ("run --plan --iterations -1 --gpus 8 --gpu-mem-gib 80", 2,
     "error: Invalid value for '--iterations': Input should be greater than or equal to 0 (got -1)"),
    ("run --config {bad_yaml}", 2, "error: {bad_yaml}: " + YAML_WHERE),
    ("run --plan --set serving.replicas=0", 2,  # the config mistake first, also where --gpus would be missing
     "error: --set serving.replicas=0: serving.replicas = 0: Input should be greater than or equal to 1"),
    ("evaluate --env nosuchenv", 2, "Invalid value for '--env': unknown environment 'nosuchenv'"),
    ("evaluate --config {bad_yaml}", 2, "error: {bad_yaml}: " + YAML_WHERE),
    ("deploy", 1, "error: the Prefect API at http://127.0.0.1:9/api does not answer"),  # failure, not input
    ("deploy --pool", 2, "Option '--pool' requires an argument"),
    ("eval --model {ckpt} --task-file {garbage} --mode both", 2, "Invalid value for '--mode'"),
    ("eval --model {tmp}/nope --task-file {garbage}", 2, "error: model not found: {tmp}/nope has no config.json"),
    ("campaigns list --config {bad_yaml}", 2, "error: {bad_yaml}: " + YAML_WHERE),
    ("campaigns rm Bad_Name", 2, "Invalid value for 'NAME': 'Bad_Name' is not a campaign name"),
    ("campaigns fetch Bad_Name", 2, "Invalid value for 'NAME': 'Bad_Name' is not a campaign name"),
    ("campaigns fetch smoke --iteration x", 2, "Invalid value for '--iteration'"),
]


def _command_paths() -> set[str]:
    """Every ``rao`` subcommand, as typed: ``run``, ``services up``, ..."""
    import typer

    from rao_cli.main import app

    def walk(cmd, path: list[str]):
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield " ".join(path)
            return
        for name, sub in subs.items():
            if not sub.hidden:  # a hidden alias runs the same function as the command it names
                yield from walk(sub, [*path, name])

    return set(walk(typer.main.get_command(app), []))


def _command_of(argv: list[str], paths: set[str]) -> str:
    two = " ".join(argv[:2])
    return two if two in paths else argv[0]


def test_the_table_covers_every_command():
    paths = _command_paths()
    covered = {_command_of(argv.split(), paths) for argv, _, _ in CASES}
    assert paths - covered == set(), f"commands without a bad-input case: {sorted(paths - covered)}"
    assert len(paths) >= 20  # the walk found the commands (20 today)


@pytest.mark.parametrize("argv, code, text", CASES, ids=[c[0].split(" {")[0][:60] for c in CASES])
def test_a_bad_option_or_input_is_one_line_and_its_code(capsys, inputs, in_process, argv, code, text):
    args = [a.format(**inputs) for a in argv.split()]
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert text.format(**inputs) in lines[0], lines[0]
    assert e.value.code == code, lines[0]


def test_the_plan_names_the_option_not_the_override(capsys, in_process):
    """``rao run --plan --iterations -1`` was ``--set iterations=-1: iterations = -1: ...`` (exit 1): --plan
    turned the option into an override before anything checked it."""
    for argv, text in [(["--iterations", "-1"], "--iterations"), (["--name", "../x"], "--name")]:
        with pytest.raises(SystemExit) as e:
            main(["run", "--plan", "--gpus", "8", "--gpu-mem-gib", "80", *argv])
        (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert e.value.code == 2 and line.startswith(f"error: Invalid value for '{text}': ") and "--set" not in line


def test_a_yaml_syntax_error_gives_its_line_and_column(tmp_path):
    from rao_core.config import ConfigError, read_yaml

    cases = {BAD_YAML: YAML_WHERE,
             'name: "x\n': "line 2, column 1: not valid YAML: found unexpected end of stream (while scanning a "
                           "quoted scalar)",
             "a:\tb\n\tc: 1\n": "line 1, column 3: not valid YAML: found character '\\t' that cannot start any "
                                "token (while scanning for the next token)"}
    for text, where in cases.items():
        f = tmp_path / "c.yaml"
        f.write_text(text)
        with pytest.raises(ConfigError) as e:
            read_yaml(f)
        assert str(e.value) == f"{f}: {where}"


def test_sandbox_run_says_what_is_wrong_with_the_file(capsys, tmp_path):
    """``/dev/null`` was "file not found"; a file that is missing still is."""
    for path, text in [("/dev/null", "/dev/null is a character device, not a regular file"),
                       (str(tmp_path / "missing.py"), f"file not found: {tmp_path / 'missing.py'}")]:
        with pytest.raises(SystemExit) as e:
            main(["sandbox", "run", path])
        err = capsys.readouterr().err
        assert e.value.code == 2 and text in err and (path == str(tmp_path / "missing.py")) == ("not found" in err)


def test_ctrl_c_in_any_command_is_one_line_and_130(capsys, monkeypatch, tmp_path):
    """typer turned a KeyboardInterrupt into a silent exit 130: now the line says so."""
    import rao_cli.tasks_cmd as tasks_cmd

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(tasks_cmd, "task_stats", interrupted)
    f = tmp_path / "t.jsonl"
    f.write_text("")
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL alone; in the suite, whatever an earlier test left
    with pytest.raises(SystemExit) as e:
        main(["tasks", "stats", str(f)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 130 and lines == ["error: interrupted (SIGINT)"]
    assert signal.getsignal(signal.SIGTERM) is before  # main's own SIGTERM handler is gone again


def test_sigterm_in_any_command_is_one_line_and_143(tmp_path):
    """A command without its own handler was killed by SIGTERM (no line; -15 to its parent); now it unwinds
    (``finally`` blocks run) and says so."""
    f = tmp_path / "t.jsonl"
    f.write_text("")
    script = ("import sys, time, pathlib, rao_cli.tasks_cmd as t\n"
              "def slow(path):\n"
              "    pathlib.Path(path).with_suffix('.started').write_text('1')\n"
              "    try:\n"
              "        time.sleep(60)\n"
              "    finally:\n"
              "        pathlib.Path(path).with_suffix('.cleaned').write_text('1')\n"
              "t.task_stats = slow\n"
              "from rao_cli.main import main; main(sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if k != "RAO_DEBUG"}
    proc = subprocess.Popen([sys.executable, "-c", script, "tasks", "stats", str(f)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while not f.with_suffix(".started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and [ln for ln in err.splitlines() if ln.strip()] == ["error: interrupted (SIGTERM)"]
    assert f.with_suffix(".cleaned").exists()


def test_the_rule_is_written_where_the_commands_are():
    """``rao_cli``'s docstring states the rule this file checks (``rao_cli.main.main`` applies it)."""
    import rao_cli

    doc = " ".join((rao_cli.__doc__ or "").split())
    assert "2 for a usage or input error" in doc and "1 for a failure while working" in doc and "130 / 143" in doc


def test_tasks_stats_json_line_is_not_taken_for_a_task(capsys, tmp_path):
    """A JSON record that is no task is an input error naming the field (exit 2), not a failure."""
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"task_id": 1}) + "\n")
    with pytest.raises(SystemExit) as e:
        main(["tasks", "stats", str(f)])
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and line.startswith(f"error: {f}:1: not a valid task record: ")
