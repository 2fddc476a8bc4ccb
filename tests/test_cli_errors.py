"""Every CLI error, usage errors included, is ONE ``error: ...`` line and a non-zero exit;
``RAO_DEBUG=1`` keeps the traceback."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from rao_cli.main import main
from tests.cli import one_error_line, run_cli


def test_usage_error_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "tasks", "generate", "--env", "textcraft-synth", "--n", "-1",
                     "--out", str(tmp_path / "t.jsonl"))
    line = one_error_line(err)
    assert code == 2 and "'--n'" in line and "rao tasks generate --help" in line
    assert not (tmp_path / "t.jsonl").exists()


def test_unknown_command_and_option_are_one_line(capsys):
    code, _, err = run_cli(capsys, "nope")
    assert code == 2 and "No such command 'nope'" in one_error_line(err)
    code, _, err = run_cli(capsys, "tasks", "generate", "--nn", "3")
    assert code == 2 and "--nn" in one_error_line(err)


def test_missing_sandbox_file_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "sandbox", "run", str(tmp_path / "missing.py"))
    assert code != 0 and "file not found" in one_error_line(err)


def test_task_for_another_env_is_one_line(capsys, tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"task_id": "o1", "env": "oolong", "data": {}}) + "\n")
    code, _, err = run_cli(capsys, "solve", "--env", "textcraft-synth", "--task-file", str(f))
    line = one_error_line(err)
    assert code == 2 and f"{f}:1:" in line and "env:" in line and "'textcraft-synth'" in line  # input: exit 2


def test_bad_task_record_is_one_line(capsys, tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"task_id": 123, "env": "textcraft-synth"}) + "\n")
    code, _, err = run_cli(capsys, "solve", "--env", "textcraft-synth", "--task-file", str(f))
    assert code == 2 and "task_id: Input should be a valid string" in one_error_line(err)


def test_unexpected_exception_is_one_line_and_debug_keeps_traceback(capsys, monkeypatch, tmp_path):
    import rao_cli.tasks_cmd as tasks_cmd

    def broken(path):
        raise KeyError("boom\nsecond line")

    monkeypatch.setattr(tasks_cmd, "task_stats", broken)
    f = tmp_path / "t.jsonl"
    f.write_text("")
    code, _, err = run_cli(capsys, "tasks", "stats", str(f))
    assert code == 1 and "KeyError" in one_error_line(err) and "RAO_DEBUG=1" in err
    monkeypatch.setenv("RAO_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["tasks", "stats", str(f)])
    with pytest.raises(Exception, match="file not found"):
        main(["sandbox", "run", str(tmp_path / "missing.py")])


# --- input checked before anything is written or started (fresh-user findings) ---------------------

def _generate(capsys, out, *opts: str) -> tuple[int, str, str]:
    return run_cli(capsys, "tasks", "generate", "--env", "textcraft-synth", "--n", "2", *opts, "--out", str(out))


@pytest.mark.parametrize("option, expected", [
    ("graph_seed=abc", "graph_seed: Input should be a valid integer (got 'abc')"),
    ("graph_seed=1.5", "graph_seed: Input should be a valid integer (got 1.5)"),
    ("items_per_tier=1000000", "items_per_tier: Input should be less than or equal to 400 (got 1000000)"),
    ("items_per_tier=2", "items_per_tier: Input should be greater than or equal to 4 (got 2)"),
])
def test_generator_options_are_checked_before_writing(capsys, tmp_path, option, expected):
    out = tmp_path / "t.jsonl"
    code, _, err = _generate(capsys, out, "-o", option)
    assert code == 2 and one_error_line(err) == f"error: generator option {expected}"
    assert not out.exists()


def test_generate_out_folder_names_the_given_path(capsys, tmp_path):
    code, _, err = _generate(capsys, tmp_path)
    line = one_error_line(err)
    assert code == 2 and "'--out'" in line and f"'{tmp_path}' is a directory" in line
    assert list(tmp_path.iterdir()) == []  # no temporary file left either


def test_generate_help_lists_every_difficulty(capsys):
    from rao_core.envs import get_env

    with pytest.raises(SystemExit) as e:
        main(["tasks", "generate", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for name in ("textcraft-synth", "oolong", "deepdive", "arte"):
        missing = [d for d in get_env(name).difficulties if d not in out
                   and not (re.fullmatch(r"tier1x\d+", d) and "tier1x<K>" in out)]  # tier1x2..12: one family
        assert not missing, (name, missing)
    assert "tier1" in out and "mixed" in out


def test_non_utf8_task_file_names_file_and_line(capsys, tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_bytes(b'{"task_id": "a", "env": "textcraft-synth"}\n{"task_id": "caf\xe9"}\n')
    code, _, err = run_cli(capsys, "tasks", "stats", str(f))
    assert code == 2 and one_error_line(err) == f"error: {f}:2: not UTF-8 text (invalid continuation byte at byte 16)"


# --- rao solve ---------------------------------------------------------------------------------------------

@pytest.fixture
def one_task(tmp_path):
    from rao_core.envs import get_env, write_tasks

    return write_tasks(tmp_path / "t.jsonl", get_env("textcraft-synth").generate_tasks(n=1, seed=0, difficulty="tier1"))


@pytest.mark.parametrize("script, expected", [
    ('"finish(1)"', "(record): Input should be a valid array (got 'finish(1)')"),
    ("[1, 2]", "0: Input should be a valid string (got 1)"),
    ("[]", "(record): List should have at least 1 item after validation, not 0 (got [])"),
    ("[unclosed", "(record): Invalid JSON"),
])
def test_bad_script_is_one_line_naming_the_file(capsys, tmp_path, one_task, script, expected):
    s = tmp_path / "s.json"
    s.write_text(script)
    code, _, err = run_cli(capsys, "solve", "--env", "textcraft-synth", "--task-file", str(one_task), "--policy", "scripted",
                     "--script", str(s))
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"error: --script {s}: expected a non-empty JSON list of assistant "
                                         f"messages (strings): {expected}"), line
    code, _, err = run_cli(capsys, "solve", "--env", "textcraft-synth", "--task-file", str(one_task), "--policy", "scripted",
                     "--script", str(tmp_path / "missing.json"))
    assert code == 2 and one_error_line(err) == f"error: --script file not found: {tmp_path / 'missing.json'}"


def test_solve_piped_prints_the_tree_once(capsys, tmp_path, one_task):
    """stdout is not a terminal here (captured): no live view, the final tree once, errors on one line."""
    import shutil

    s = tmp_path / "s.json"
    s.write_text(json.dumps(["```python\nraise ValueError('first line\\nsecond line')\n```"]))
    with pytest.raises(SystemExit) as e:
        main(["solve", "--env", "textcraft-synth", "--task-file", str(one_task), "--policy", "scripted", "--script",
              str(s), "--max-depth", "0", "--sandbox", "bwrap" if shutil.which("bwrap") else "none"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.count("0 d0 max_steps turns=") == 1, out  # was 2: live view + final tree
    assert "verifier=0 Craft" in out  # each node's own check beside its goal (the trial: only the root's showed)
    summary = [ln for ln in out.splitlines() if ln.startswith("task ")]
    assert len(summary) == 1 and "end=max_steps" in summary[0] and "wall=" in summary[0]  # one line, not wrapped


# --- rao evaluate ------------------------------------------------------------------------------------------

def test_evaluate_suite_defaults_to_the_configs_suite_and_names_difficulties_per_environment():
    """The suite is the config's benchmarks (cpu-smoke: TextCraft, Oolong, DeepDive, ART-E) at the nightly's n
    (eval.regression_n_tasks); --env picks benchmarks, --difficulty ENV=D sets one benchmark's difficulties, a bare
    --difficulty the one --env's (or the training benchmark's); every mistake is a BadParameter naming its option."""
    import typer

    from rao_cli.pipeline_cmd import _suite
    from rao_core.config import load_config

    base = load_config("configs/cpu-smoke.yaml")
    suite = _suite(base, [], [], None)
    assert [(e.name, e.env, e.difficulties, e.n_tasks, e.modes) for e in suite] == [
        ("textcraft", "textcraft-synth", ["tier1"], 100, ["recursive"]), ("oolong", "oolong", ["singledoc_rolls"], 100, ["recursive"]),
        ("deepdive", "deepdive", ["easy"], 100, ["recursive"]), ("arte", "arte", ["easy"], 100, ["recursive"])]
    suite = _suite(base, [], ["easy", "medium", "oolong=singledoc_rolls", "oolong=multidoc_spells"], 3)
    assert [(e.name, e.difficulties, e.n_tasks) for e in suite] == [
        ("textcraft", ["easy", "medium"], 3), ("oolong", ["singledoc_rolls", "multidoc_spells"], 3),
        ("deepdive", ["easy"], 3), ("arte", ["easy"], 3)]
    (entry,) = _suite(base, ["oolong"], [], None)  # the config's benchmark of that environment
    assert (entry.name, entry.difficulties, entry.modes) == ("oolong", ["singledoc_rolls"], ["recursive"])
    (entry,) = _suite(base, ["deepdive-synth"], ["k3"], None)  # an alias; a bare difficulty: the one --env's
    assert (entry.env, entry.difficulties) == ("deepdive", ["k3"])
    two = _suite(base, ["textcraft-synth", "oolong"], ["oolong=singledoc_rolls"], None)
    assert [(e.name, e.difficulties) for e in two] == [("textcraft", ["tier1"]), ("oolong", ["singledoc_rolls"])]
    smaller = load_config("configs/cpu-smoke.yaml", ["eval.benchmarks={}"])
    (entry,) = _suite(smaller, ["arte"], [], None)  # not in the config's suite: the standard benchmark
    assert (entry.name, entry.difficulties, entry.n_tasks, entry.seed) == ("arte", ["easy"], 100, smaller.eval.seed)
    (entry,) = _suite(smaller, ["example"], ["example=easy"], 2)  # neither: its difficulties named
    assert (entry.name, entry.env, entry.difficulties, entry.n_tasks) == ("example", "example", ["easy"], 2)
    for envs, difficulties, hint, message in [
        ([], ["nope"], "'--difficulty'", "unknown textcraft-synth difficulty 'nope'"),
        ([], ["oolong=tier1"], "'--difficulty'", "unknown oolong difficulty 'tier1'"),
        (["oolong", "arte"], ["mixed"], "'--difficulty'", "'mixed' names no environment and 2 --env are given: write "
                                                          "ENV=DIFFICULTY, e.g. --difficulty oolong=mixed"),
        (["oolong"], ["arte=easy"], "'--difficulty'", "'arte=easy': 'arte' is not an environment of the suite (oolong)"),
        ([], ["nosuchenv=easy"], "'--difficulty'", "unknown environment 'nosuchenv'"),
        (["oolong", "oolong"], [], "'--env'", "environment 'oolong' is given twice"),
        (["example"], [], "'--env'", "environment 'example' is not a benchmark of the config's suite nor a standard "
                                     "one: name its difficulties, --difficulty example=DIFFICULTY"),
    ]:
        with pytest.raises(typer.BadParameter) as e:
            _suite(base, envs, difficulties, None)
        assert e.value.param_hint == hint and message in e.value.message, (envs, difficulties, e.value.message)


def test_evaluate_refuses_a_bad_suite_before_anything_starts(capsys, monkeypatch, in_process_command):
    """Four benchmarks in one `rao evaluate`: a bare --difficulty with several --env is one error line naming the
    option, exit 2, before the registry, a server or the flow is touched."""
    import flows.evaluate
    import rao_cli.pipeline_cmd as pipeline_cmd

    monkeypatch.setattr(pipeline_cmd, "_registered_model", lambda *a: pytest.fail("the registry was asked"))
    monkeypatch.setattr(flows.evaluate, "rao_evaluate", lambda params: pytest.fail("the nightly started"))
    code, out, err = run_cli(capsys, "evaluate", "--env", "textcraft-synth", "--env", "oolong", "--env", "deepdive",
                             "--env", "arte", "--difficulty", "easy")
    assert code == 2 and out == "" and one_error_line(err) == (
        "error: Invalid value for '--difficulty': 'easy' names no environment and 4 --env are given: write "
        "ENV=DIFFICULTY, e.g. --difficulty oolong=mixed (see `rao evaluate --help`)")
    code, _, err = run_cli(capsys, "evaluate", "--env", "deepdive", "--difficulty", "deepdive=tier1")
    assert code == 2 and one_error_line(err).startswith(
        "error: Invalid value for '--difficulty': unknown DeepDive difficulty 'tier1'")


def test_prefect_failure_report_is_dropped_unless_debugging(monkeypatch):
    import logging

    from prefect.logging.configuration import setup_logging

    from rao_cli.pipeline_cmd import _prefect_failures_quiet

    handlers = [h for h in logging.getLogger().handlers if type(h).__name__ == "PrefectConsoleHandler"]
    if not handlers:  # run alone, nothing has configured Prefect's logging yet (rao run does, at its start)
        setup_logging()
        handlers = [h for h in logging.getLogger().handlers if type(h).__name__ == "PrefectConsoleHandler"]
    (handler,) = handlers

    def record(name: str, level: int, exc: bool = False) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "m", None, (ValueError, ValueError("x"), None) if exc else None)

    failed = record("prefect.flow_runs", logging.ERROR, exc=True)
    info = record("prefect.flow_runs", logging.INFO)
    other = record("mlflow", logging.ERROR)
    monkeypatch.delenv("RAO_DEBUG", raising=False)
    with _prefect_failures_quiet():
        assert [bool(handler.filter(r)) for r in (failed, info, other)] == [False, True, True]
    assert handler.filter(failed)
    monkeypatch.setenv("RAO_DEBUG", "1")
    with _prefect_failures_quiet():
        assert handler.filter(failed)


def _rao(tmp_path, *args: str, **env: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, "RAO_HOME": str(tmp_path / "home"), **env}
    env.pop("RAO_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "rao_cli.main", *args], capture_output=True, text=True, timeout=180,
                          env=env)


def test_evaluate_unknown_difficulty_is_one_line_before_services(tmp_path):
    r = _rao(tmp_path, "evaluate", "--difficulty", "nope", PREFECT_API_URL="http://127.0.0.1:9/api",
             RAO_S3_ENDPOINT="http://127.0.0.1:9", MLFLOW_TRACKING_URI="http://127.0.0.1:9")
    assert r.returncode == 2 and r.stdout == ""
    line = one_error_line(r.stderr)
    assert "Invalid value for '--difficulty': unknown textcraft-synth difficulty 'nope'" in line


def test_evaluate_unregistered_model_is_one_line(tmp_path):
    """A fresh machine has no 'candidate': one line, no Prefect log, no traceback, no service started."""
    db = tmp_path / "mlflow.db"
    r = _rao(tmp_path, "evaluate", PREFECT_API_URL="http://127.0.0.1:9/api", RAO_S3_ENDPOINT="http://127.0.0.1:9",
             MLFLOW_TRACKING_URI=f"sqlite:///{db}")
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and r.stdout == ""  # a reference to nothing: an input error
    assert line.startswith("error: --model candidate: models:/rao-policy-smoke@candidate is not in the MLflow "
                           f"registry at sqlite:///{db} (")


def test_evaluate_campaign_names_the_registered_model_and_its_rule(tmp_path):
    """``--campaign`` picks the campaign's registered model (``rao-policy-{campaign}``), as ``rao run --name``
    named it; a name the rule refuses is one line naming ``--campaign``, before any service."""
    db = tmp_path / "mlflow.db"
    env = dict(PREFECT_API_URL="http://127.0.0.1:9/api", RAO_S3_ENDPOINT="http://127.0.0.1:9",
               MLFLOW_TRACKING_URI=f"sqlite:///{db}")
    r = _rao(tmp_path, "evaluate", "--campaign", "exp2", **env)
    assert r.returncode == 2 and r.stdout == ""
    assert one_error_line(r.stderr).startswith("error: --model candidate: models:/rao-policy-exp2@candidate is not "
                                               f"in the MLflow registry at sqlite:///{db} (")
    r = _rao(tmp_path, "evaluate", "--campaign", "Exp 2", **env)
    assert r.returncode == 2 and r.stdout == ""
    line = one_error_line(r.stderr)
    assert "Invalid value for '--campaign': " in line and "lowercase letters, digits and dashes" in line, line


def test_non_utf8_sandbox_file_names_the_file(capsys, tmp_path):
    f = tmp_path / "c.py"
    f.write_bytes(b"print('caf\xe9')\n")
    code, _, err = run_cli(capsys, "sandbox", "run", str(f))
    assert code == 2 and f"{f}: not UTF-8 text (invalid continuation byte at byte 10)" in one_error_line(err)


@pytest.mark.parametrize("api", [None, "http://127.0.0.1:9/api"])
def test_deploy_without_a_reachable_prefect_api_is_one_line(tmp_path, monkeypatch, api):
    """No server, or a PREFECT_API_URL nothing answers at: one error line on stderr naming the URL (was 144
    lines with 4 tracebacks from ``prefect deploy``, and the no-server error went to stdout, wrapped)."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    r = _rao(tmp_path, "deploy", **({"PREFECT_API_URL": api} if api else {}))
    line = one_error_line(r.stderr)
    assert r.returncode == 1 and r.stdout == ""
    if api:
        assert line.startswith(f"error: the Prefect API at {api} does not answer (")
    else:
        assert line == ("error: no Prefect server: run `rao services up --prefect-server` first (or set "
                        "PREFECT_API_URL)")


@pytest.mark.parametrize("option, expected", [
    (["--timeout", "-1"], "Invalid value for '--timeout': Input should be greater than or equal to 0.1"),
    (["--timeout", "inf"], "Invalid value for '--timeout': Input should be less than or equal to 3600"),
    (["--memory-mb", "64"], "Invalid value for '--memory-mb': Input should be greater than or equal to 128")])
def test_sandbox_limits_out_of_range_are_refused(capsys, tmp_path, option, expected):
    f = tmp_path / "c.py"
    f.write_text("print(1)\n")
    code, _, err = run_cli(capsys, "sandbox", "run", *option, str(f))
    assert code == 2 and expected in one_error_line(err)


def test_sandbox_runs_a_cell_at_the_smallest_memory_limit_it_accepts(capsys, tmp_path):
    """The lowest --memory-mb accepted still starts the REPL (64 and 80 were accepted and always died)."""
    import json

    f = tmp_path / "c.py"
    f.write_text("print(1 + 1)\n")
    try:
        main(["sandbox", "run", "--memory-mb", "128", str(f)])
    except SystemExit as e:
        assert e.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["stdout"] == "2\n", out


def test_sandbox_run_on_a_folder_says_it_is_a_folder(capsys, tmp_path):
    code, _, err = run_cli(capsys, "sandbox", "run", str(tmp_path))
    assert code == 2 and f"{tmp_path} is a folder, not a Python file" in one_error_line(err)


def test_prefect_port_out_of_range_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "services", "up", "--no-s3", "--prefect-server", "--prefect-port", "99999")
    assert code == 2 and ("Invalid value for '--prefect-port': Input should be less than or equal to 65535"
                          in one_error_line(err))  # was an OverflowError from socket.bind


def test_a_service_that_cannot_start_is_one_line_on_stderr(capsys, tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, _, err = run_cli(capsys, "services", "up", "--no-s3", "--prefect-server", "--prefect-port", str(port))
    assert code == 1 and one_error_line(err) == (f"error: Prefect server: port {port} on 127.0.0.1 is in use "
                                                 "(choose another --prefect-port)")


def test_sft_difficulties_come_from_the_environment(capsys, monkeypatch):
    """``rao sft --env E`` demonstrates E's difficulties (it defaulted to TextCraft's easy/medium whatever E);
    an environment without an expert (oolong) and a difficulty E does not know are one line each."""
    import typer

    from rao_cli.sft_cmd import demo_difficulties
    from rao_core.envs import REGISTRY, EnvEntry

    assert demo_difficulties("arte", None) == ["easy", "medium"]
    assert demo_difficulties("deepdive", ["k3"]) == ["k3"]
    monkeypatch.setitem(REGISTRY, "levels", EnvEntry("tests.test_cli_errors:_LevelsEnv", expert="x:Expert"))
    assert demo_difficulties("levels", None) == ["small"]  # no easy/medium there: its first difficulty
    with pytest.raises(typer.BadParameter, match="unknown levels difficulty 'easy'"):
        demo_difficulties("levels", ["easy"])
    code, _, err = run_cli(capsys, "sft", "--env", "oolong", "--out", "unused")
    assert code == 2 and ("Invalid value for '--env': environment 'oolong' has no expert to demonstrate with; one "
                          "of ['arte', 'deepdive', 'example', 'levels', 'textcraft-synth']") in one_error_line(err)
    code, _, err = run_cli(capsys, "sft", "--env", "arte", "--difficulty", "tier1", "--out", "unused")
    assert code == 2 and "unknown arte difficulty 'tier1'" in one_error_line(err)


class _LevelsEnv:
    name = "levels"
    difficulties = ("small", "large")

    @classmethod
    def check_difficulty(cls, d: str) -> None:
        if d not in cls.difficulties:
            raise ValueError(f"unknown levels difficulty {d!r}")


def _fake_warm_start(marker: str):
    """A stand-in for ``run_warm_start`` that leaves what a training child leaves beside OUT, then fails
    (``marker`` 'fail') or trains until stopped ('sleep')."""

    def run_warm_start(env, model_path, out, **kw):
        import time
        from pathlib import Path

        out = Path(out).resolve()
        out.with_name(out.name + ".samples.jsonl").write_text("{}\n")
        (out.with_name(out.name + ".train-io")).mkdir()
        (out.parent / f".{out.name}.tmp-abc").mkdir()
        out.with_name(out.name + ".train.log").write_text("step 1\n")
        if marker == "fail":
            raise ValueError("training failed")
        (out.parent / "started").write_text("1")
        time.sleep(600)

    return run_warm_start


def test_a_failed_sft_leaves_no_temporary_files(capsys, tmp_path, monkeypatch):
    import rao_core.warmstart

    monkeypatch.setattr(rao_core.warmstart, "run_warm_start", _fake_warm_start("fail"))
    code, _, err = run_cli(capsys, "sft", "--env", "example", "--out", str(tmp_path / "ckpt"))
    assert code == 1 and one_error_line(err) == "error: training failed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.train.log"]  # the log stays, nothing else


def test_an_interrupted_sft_leaves_no_temporary_files_and_says_where_the_log_is(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("import sys, rao_core.warmstart as w, tests.test_cli_errors as t; "
              "w.run_warm_start = t._fake_warm_start('sleep'); from rao_cli.main import main; main(sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if k != "RAO_DEBUG"}
    proc = subprocess.Popen([sys.executable, "-c", script, "sft", "--env", "example", "--out", str(tmp_path / "ckpt")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert one_error_line(err) == (f"error: interrupted; rao sft stopped and its temporary files removed (training "
                                    f"log kept: {tmp_path / 'ckpt.train.log'}); re-run the command to start again")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.train.log", "started"]


def test_run_errors_from_the_campaign_go_to_stderr(capsys, tmp_path, monkeypatch):
    """A model or training failure inside the campaign is one error line on stderr (it was printed on stdout)."""
    import flows.campaign
    from infra.models import ModelError

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")

    def fails(params):
        raise ModelError("checkpoint unreadable:\nsee the log")

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(flows.campaign, "rao_campaign", fails)
    with pytest.raises(SystemExit) as e:
        main(["run", "--set", "warm_start.mode=checkpoint", "--set", f"warm_start.checkpoint={ckpt}"])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and one_error_line(err) == "error: checkpoint unreadable: see the log" and out == ""


# --- new-user findings: input checked before anything starts ----------------------------------------------

@pytest.fixture
def in_process_command(tmp_path, monkeypatch):
    """For commands run in this process that set environment defaults and a SIGTERM handler (``rao run``,
    ``rao evaluate``): a private RAO_HOME, and the environment and the handler restored afterwards."""
    import os
    import signal

    saved_env, saved_term = dict(os.environ), signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAO_DEBUG", raising=False)
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    signal.signal(signal.SIGTERM, saved_term)


@pytest.mark.parametrize("text", ["", "# only comments\n\n# here\n", "---\n"])
def test_an_empty_config_file_is_refused_before_a_campaign_starts(capsys, tmp_path, monkeypatch,
                                                                 in_process_command, text):
    """A 0-byte or comments-only config started a whole campaign on the built-in defaults."""
    import flows.campaign
    from rao_core.config import ConfigError, read_yaml

    f = tmp_path / "empty.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match="the config file is empty"):  # every command reads configs here
        read_yaml(f)
    monkeypatch.setattr(flows.campaign, "rao_campaign", lambda params: pytest.fail("a campaign started"))
    code, _, err = run_cli(capsys, "run", "--config", str(f), "--name", "x")
    assert code == 2 and one_error_line(err) == f"error: {f}: the config file is empty"


@pytest.mark.parametrize("model", ["models:/rao-policy-smoke", "models:/", "models:/bad uri",
                                   "models:/rao-policy-smoke@", "models:/rao-policy-smoke/v1"])
def test_evaluate_malformed_model_uri_is_one_line_before_services(capsys, tmp_path, monkeypatch,
                                                                  in_process_command, model):
    """Was ``error: TypeError: MlflowClient.get_model_version() missing 1 required positional argument``."""
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    code, _, err = run_cli(capsys, "evaluate", "--model", model)
    line = one_error_line(err)
    assert code == 2 and (f"Invalid value for '--model': {model!r} is not a model reference: expected "
                          "models:/<name>/<version>, models:/<name>@<alias>, a version number or an alias of "
                          "rao-policy-smoke") in line, line
    assert not db.exists()  # MLflow was not even opened


def test_evaluate_s3_checkpoint_without_objects_is_one_line_before_prefect(capsys, tmp_path, monkeypatch,
                                                                           in_process_command):
    """An s3:// --model with nothing under it: one line, from the storage listing, before Prefect and MLflow
    (it started a Prefect server, logged a retry and left a FAILED MLflow run); one with objects goes on to
    the flow, which finds the same storage exported."""
    import contextlib
    import os

    import flows.campaign
    import flows.evaluate
    from infra.storage import ArtifactStore, S3Settings

    opened, listed, flow_saw = [], [], []

    @contextlib.contextmanager
    def fake_storage(cfg):
        opened.append(cfg.storage.bucket)
        yield S3Settings("http://127.0.0.1:9", "rao", "key", "secret")

    def fake_list(self, key_prefix=""):
        listed.append((self.settings.bucket, self.prefix, key_prefix))
        return ["checkpoint/config.json"] if self.prefix == "smoke/iter-1" else []

    def fake_flow(params):
        flow_saw.append((params.model, os.environ.get("RAO_S3_ENDPOINT")))
        return {"model": params.model, "champion": None, "comparison": []}

    monkeypatch.delenv("RAO_S3_ENDPOINT", raising=False)
    monkeypatch.setattr(flows.campaign, "storage", fake_storage)
    monkeypatch.setattr(ArtifactStore, "list", fake_list)
    monkeypatch.setattr(flows.evaluate, "rao_evaluate", fake_flow)
    ref = "s3://rao/nosuch/iter-1/checkpoint"
    code, _, err = run_cli(capsys, "evaluate", "--model", ref)
    assert code == 2 and one_error_line(err) == (
        f"error: --model {ref}: no objects under {ref} at http://127.0.0.1:9 (expected a checkpoint folder a "
        "campaign uploaded: s3://BUCKET/CAMPAIGN/iter-K/checkpoint)")
    assert listed == [("rao", "nosuch/iter-1", "checkpoint/")] and flow_saw == []
    ok = "s3://rao/smoke/iter-1/checkpoint"
    code, _, err = run_cli(capsys, "evaluate", "--model", ok)
    assert code == 0 and flow_saw == [(ok, "http://127.0.0.1:9")], err  # the checked storage, not a second one
    assert "RAO_S3_ENDPOINT" not in os.environ and len(opened) == 2


def test_solve_endpoint_without_a_server_is_one_line_before_the_rollout(capsys, one_task, monkeypatch):
    """Was the tree, ``node 0 ended with policy_error: APIConnectionError`` and exit 1, with no error: line;
    now the check of ``rao eval`` (infra.serving.wait_for_server), here cut to 1 s."""
    import infra.serving

    real, waited = infra.serving.wait_for_server, []

    def short_wait(base_url, timeout_s=30.0):
        waited.append((base_url, timeout_s))
        real(base_url, timeout_s=1)

    monkeypatch.setattr(infra.serving, "wait_for_server", short_wait)
    url = "http://127.0.0.1:1/v1"
    with pytest.raises(SystemExit) as e:
        main(["solve", "--env", "textcraft-synth", "--task-file", str(one_task), "--policy", "endpoint",
              "--base-url", url, "--model", "policy"])
    out, err = capsys.readouterr()
    assert e.value.code == 1 and out == "" and waited == [(url, 30.0)]
    assert one_error_line(err).startswith(f"error: no OpenAI-compatible server at {url} after 1 s (")


def test_judge_calibrate_reads_the_tree_file_before_contacting_the_server(capsys, tmp_path, monkeypatch):
    """A file that is not trees JSONL waited for a judge server and said only that none answers."""
    import infra.serving

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(infra.serving, "wait_for_server", lambda *a, **k: pytest.fail("a server was contacted"))
    f = tmp_path / "garbage.jsonl"
    f.write_text("garbage\n")
    argv = ("judge", "calibrate", "--trees", str(f), "--base-url", "http://127.0.0.1:9/v1")
    code, _, err = run_cli(capsys, *argv)
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"error: {f}:1: not a valid execution tree record: "), line
    f.write_text("\n")
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and one_error_line(err) == f"error: {f}: holds no execution tree (nothing to calibrate)"


# --- new-user findings of `rao run` / `rao evaluate` (h24) -----------------------------------------------------

def test_a_run_option_the_parameters_refuse_is_named_as_written(capsys, monkeypatch, in_process_command):
    """Was ``error: CampaignParams: iterations: Input should be ...`` (the pydantic class, exit 1)."""
    import flows.campaign
    import research.experiment

    monkeypatch.setattr(flows.campaign, "rao_campaign", lambda params: pytest.fail("a campaign started"))
    monkeypatch.setattr(research.experiment, "rao_experiment", lambda params: pytest.fail("an experiment started"))
    code, _, err = run_cli(capsys, "run", "--iterations", "-1", "--name", "x")
    assert code == 2 and one_error_line(err) == ("error: Invalid value for '--iterations': Input should be greater "
                                                  "than or equal to 0 (got -1) (see `rao run --help`)")
    for name in ("../x", "Smoke"):  # was ``--set name=../x: ... String should match pattern '^[a-z0-9]...'``
        code, _, err = run_cli(capsys, "run", "--name", name)
        assert code == 2 and one_error_line(err) == (
            "error: Invalid value for '--name': Value error, a campaign name is lowercase letters, digits and "
            f"dashes, starting with a letter or digit (got {name!r}) (see `rao run --help`)")
    code, _, err = run_cli(capsys, "experiment", "textcraft-tier1", "--arm", "both")
    assert code == 2 and one_error_line(err) == ("error: Invalid value for '--arm': Input should be 'recursive', "
                                                  "'outcome' or 'single' (got 'both') (see `rao experiment textcraft-tier1 --help`)")


@pytest.mark.parametrize("extra", [[], ["--difficulty", "easy"]])
def test_evaluate_unknown_environment_is_named_with_the_known_ones(capsys, in_process_command, extra):
    """Was reported as a difficulty problem: ``Invalid value for '--difficulty': environment 'nosuchenv' is not
    the config's`` (without --difficulty) or ``... '--difficulty': unknown environment`` (with it)."""
    from rao_core.envs import ENV_NAMES

    code, _, err = run_cli(capsys, "evaluate", "--env", "nosuchenv", *extra)
    assert code == 2 and one_error_line(err) == (f"error: Invalid value for '--env': unknown environment "
                                                  f"'nosuchenv'; expected one of {ENV_NAMES} or an import path "
                                                  "'module:Class' (see `rao evaluate --help`)")


def test_the_end_of_run_prefect_hint_names_a_server_of_this_campaigns_database(tmp_path, monkeypatch,
                                                                              in_process_command):
    """It offered ``.venv/bin/prefect server start``, which reads ~/.prefect: none of the campaign's runs."""
    import os

    from infra.orchestration import configure_prefect, prefect_bin, prefect_env
    from rao_cli.pipeline_cmd import prefect_hint

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    configure_prefect()  # as `rao run`: the embedded API keeps its database under PREFECT_HOME
    home = str(tmp_path / "home" / "prefect")
    # the server of `rao services up --prefect-server` (infra.orchestration.PrefectServer) gets the same home
    assert os.environ["PREFECT_HOME"] == prefect_env()["PREFECT_HOME"] == home
    rao = Path(sys.executable).parent / "rao"  # absolute, so the line works from a tutorial's own folder too
    assert prefect_hint() == (f"Prefect:   {rao} services up --prefect-server  then open the printed URL "
                              f"(it serves {home}, where these runs are; later runs report to it)")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "own"))  # the user's own home: services up would not serve it
    assert prefect_hint() == (f"Prefect:   PREFECT_HOME={tmp_path / 'own'} {prefect_bin()} server start  then open "
                              "the printed URL")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4242/api/")  # the runs went to that server
    assert prefect_hint() == "Prefect:   http://127.0.0.1:4242  (the UI of PREFECT_API_URL)"

