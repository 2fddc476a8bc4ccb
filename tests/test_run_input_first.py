"""``rao run`` checks every input it reads before any service, flow run or process starts: the config file, the
``--set`` overrides and options, the task file (``tasks.train_file``: read whole, as ``rao eval`` and ``rao tasks
stats`` read it), the model folder. Each mistake is one ``error:`` line, exit 2, and nothing was started: the
service starters, the flow and the completion check (which opens the S3 store) fail the test when called.

A task file with a malformed JSON line used to start SeaweedFS, Prefect's API and a flow run, and to say so
after 41.7 s, with exit 1."""

from __future__ import annotations

import os
import signal

import pytest

from tests.cli import one_error_line, run_cli

BAD_YAML = "name: x\nalgo:\n  G: 8\n   lam: 1\n"


@pytest.fixture
def nothing_starts(tmp_path, monkeypatch):
    """A private RAO_HOME, the environment and the SIGTERM handler restored afterwards, and every way ``rao run``
    starts something made to fail the test: the embedded services, any managed process, the completion check
    (it opens the S3 store), the flow and the interruptible runner. Yields the RAO_HOME."""
    import flows.campaign
    import infra.orchestration
    import infra.process
    import infra.storage
    import infra.tracking
    import rao_cli.pipeline_cmd

    saved_env, saved_term = dict(os.environ), signal.getsignal(signal.SIGTERM)
    home = tmp_path / "home"
    monkeypatch.setenv("RAO_HOME", str(home))
    from rao_core.config import default_model_path

    default_model_path().mkdir(parents=True)  # the default model folder (`make setup` makes it)
    (default_model_path() / "config.json").write_text("{}")
    monkeypatch.delenv("RAO_DEBUG", raising=False)
    for k in ("PREFECT_API_URL", "RAO_S3_ENDPOINT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)

    def started(what):
        def fail(*a, **kw):
            pytest.fail(f"{what} was started before the input was checked")
        return fail

    monkeypatch.setattr(infra.storage.SeaweedFSServer, "start", started("SeaweedFS"))
    monkeypatch.setattr(infra.orchestration.PrefectServer, "start", started("a Prefect server"))
    monkeypatch.setattr(infra.tracking.MLflowServer, "start", started("an MLflow server"))
    monkeypatch.setattr(infra.process.ManagedProcess, "start", started("a managed process"))
    monkeypatch.setattr(infra.process, "run_interruptible", started("the campaign runner"))
    monkeypatch.setattr(flows.campaign, "rao_campaign", started("the campaign flow"))
    monkeypatch.setattr(rao_cli.pipeline_cmd, "completed_campaign", started("the completion check (S3 store)"))
    yield home
    os.environ.clear()
    os.environ.update(saved_env)
    signal.signal(signal.SIGTERM, saved_term)


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """A config with a YAML syntax error, task files (one good record then a malformed JSON line; empty; one of
    another environment) and a folder that is no model."""
    from rao_core.envs import get_env, write_tasks

    good = write_tasks(tmp_path / "good.jsonl", get_env("textcraft-synth").generate_tasks(n=1, seed=0,
                                                                                         difficulty="tier1"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"env": "textcraft-synth", "id": \n')
    (tmp_path / "empty.jsonl").write_text("\n\n")
    write_tasks(tmp_path / "other.jsonl", get_env("arte-synth").generate_tasks(n=1, seed=0, difficulty="easy"))
    (tmp_path / "bad.yaml").write_text(BAD_YAML)
    (tmp_path / "nomodel").mkdir()
    return {"tmp": str(tmp_path), "good": str(good), "bad": str(bad), "empty": str(tmp_path / "empty.jsonl"),
            "bad_yaml": str(tmp_path / "bad.yaml"), "nomodel": str(tmp_path / "nomodel"),
            "other": str(tmp_path / "other.jsonl")}


# (kind, argv with {placeholders} of `files`, the one error line after "error: ")
CASES = [
    ("config", "--config {bad_yaml}", "{bad_yaml}: line 4, column 7: not valid YAML: mapping values are not allowed"),
    ("override", "--set serving.replicas=0",
     "--set serving.replicas=0: serving.replicas = 0: Input should be greater than or equal to 1"),
    ("override", "--set nosuch.key=1", "--set nosuch.key=1: nosuch = {{...}}: unknown field"),
    ("option", "--iterations -1", "Invalid value for '--iterations': Input should be greater than or equal to 0"),
    ("task file", "--set tasks.train_file={bad}",
     "tasks.train_file: {bad}:2: not a valid task record: invalid JSON"),
    ("task file", "--set tasks.train_file={empty}",
     "tasks.train_file: {empty}: holds no task (no non-blank line); `rao tasks generate` writes task files"),
    ("task file", "--set tasks.train_file={tmp}/none.jsonl",
     "--set tasks.train_file={tmp}/none.jsonl: tasks.train_file = '{tmp}/none.jsonl': file not found"),
    ("task file", "--set tasks.train_file={other}", "tasks.train_file: {other}:1: "),  # another environment's
    ("model", "--set model.path={nomodel}",
     "--set model.path={nomodel}: model.path = '{nomodel}': model not found (no config.json there)"),
    ("checkpoint", "--set warm_start.mode=checkpoint --set warm_start.checkpoint={nomodel}",
     "--set warm_start.checkpoint={nomodel}: warm_start.checkpoint = '{nomodel}': no checkpoint folder there"),
]


@pytest.mark.parametrize("kind, argv, text", CASES, ids=[f"{c[0]}: {c[1].split('=')[0]}" for c in CASES])
def test_a_bad_input_of_rao_run_is_one_line_exit_2_and_nothing_starts(capsys, nothing_starts, files, kind, argv,
                                                                      text):
    code, out, err = run_cli(capsys, "run", *[a.format(**files) for a in argv.split()])
    line = one_error_line(err)
    assert line.startswith("error: " + text.format(**files)), line
    assert code == 2, line
    assert not (nothing_starts / "services").exists()  # no SeaweedFS data or service log was made


def test_the_malformed_line_is_refused_as_rao_tasks_stats_refuses_it(capsys, nothing_starts, files):
    """The same reader and the same words as ``rao tasks stats`` (only the key is added)."""
    code, _, stats_err = run_cli(capsys, "tasks", "stats", files["bad"])
    assert code == 2
    code, _, run_err = run_cli(capsys, "run", "--set", f"tasks.train_file={files['bad']}")
    assert code == 2
    assert one_error_line(run_err) == one_error_line(stats_err).replace("error: ", "error: tasks.train_file: ", 1)


def test_a_good_task_file_passes_the_check_and_goes_on_to_the_campaign(capsys, nothing_starts, files, monkeypatch):
    """The check does not refuse a good file: ``rao run`` goes on to the completion check (here: stopped there)."""
    import rao_cli.pipeline_cmd

    class Reached(Exception):
        pass

    def reached(cfg):
        assert str(cfg.tasks.train_file) == files["good"]
        raise Reached

    monkeypatch.setattr(rao_cli.pipeline_cmd, "completed_campaign", reached)
    with pytest.raises(Reached):
        from rao_cli.main import app

        app(args=["run", "--set", f"tasks.train_file={files['good']}"], standalone_mode=False)
