"""Bad inputs of ``rao run`` and ``rao eval`` that used to start services (or say the wrong thing): each is one
``error:`` line naming the input, exit 2, before any service, flow run or process starts. A model folder whose
config.json is not JSON (``rao run`` started Prefect, S3, MLflow and vLLM and failed after 339 s with a traceback
fragment), a task file with a repeated ``task_id`` (accepted), a task file that is a folder ("file not found"),
``rao eval --base-url`` against a server that refuses the key ("no OpenAI-compatible server ... (None)")."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.cli import one_error_line, run_cli
from tests.test_run_input_first import nothing_starts  # noqa: F401 (fixture)


@pytest.fixture
def inputs(tmp_path, tiny_model_path) -> dict[str, str]:
    """A model folder whose config.json is not JSON, task files (good; two records with one task_id) and a
    folder given as a task file."""
    from rao_core.envs import get_env, write_tasks

    badjson = tmp_path / "badjson"
    badjson.mkdir()
    (badjson / "config.json").write_text('{"model_type": "llama",\n')
    tasks = get_env("textcraft-synth").generate_tasks(n=2, seed=0, difficulty="tier1")
    good = write_tasks(tmp_path / "good.jsonl", tasks)
    dup = tmp_path / "dup.jsonl"
    lines = good.read_text().splitlines()
    dup.write_text("\n".join([lines[0], lines[1], lines[0]]) + "\n")
    (tmp_path / "tasks_dir").mkdir()
    return {"badjson": str(badjson), "good": str(good), "dup": str(dup), "dir": str(tmp_path / "tasks_dir"),
            "model": str(tiny_model_path), "task_id": tasks[0].task_id}


def _refused(capsys, home, *argv: str) -> str:
    code, _, err = run_cli(capsys, *argv)
    line = one_error_line(err)
    assert code == 2, line
    assert not (home / "services").exists()  # no SeaweedFS data or service log was made
    return line


def test_run_refuses_a_model_folder_whose_config_json_is_not_json(capsys, nothing_starts, inputs):
    line = _refused(capsys, nothing_starts, "run", "--set", f"model.path={inputs['badjson']}")
    assert line.startswith(f"error: --set model.path={inputs['badjson']}: model.path = '{inputs['badjson']}': its "
                           "config.json is not JSON (line 2, column 1: Expecting property name"), line


def test_eval_refuses_a_model_folder_whose_config_json_is_not_json(capsys, nothing_starts, inputs):
    line = _refused(capsys, nothing_starts, "eval", "--model", inputs["badjson"], "--task-file", inputs["good"])
    assert line.startswith(f"error: --model {inputs['badjson']}: its config.json is not JSON (line 2, column 1"), line


def test_run_refuses_a_task_file_with_a_repeated_task_id(capsys, nothing_starts, inputs):
    line = _refused(capsys, nothing_starts, "run", "--set", f"tasks.train_file={inputs['dup']}")
    assert line == (f"error: tasks.train_file: {inputs['dup']}:3: task_id '{inputs['task_id']}' repeats line 1 (each "
                    "task record needs its own task_id)"), line


def test_eval_refuses_a_task_file_with_a_repeated_task_id(capsys, nothing_starts, inputs):
    line = _refused(capsys, nothing_starts, "eval", "--model", inputs["model"], "--task-file", inputs["dup"])
    assert line == (f"error: {inputs['dup']}:3: task_id '{inputs['task_id']}' repeats line 1 (each task record "
                    "needs its own task_id)"), line


def test_run_says_a_task_file_that_is_a_folder_is_a_folder(capsys, nothing_starts, inputs):
    line = _refused(capsys, nothing_starts, "run", "--set", f"tasks.train_file={inputs['dir']}")
    assert line.startswith(f"error: --set tasks.train_file={inputs['dir']}: tasks.train_file = '{inputs['dir']}': "
                           "is a folder, not a task file"), line
    assert "not found" not in line


def test_eval_says_a_task_file_that_is_a_folder_is_a_folder(capsys, nothing_starts, inputs):
    line = _refused(capsys, nothing_starts, "eval", "--model", inputs["model"], "--task-file", inputs["dir"])
    assert line == f"error: {inputs['dir']}: is a folder, not a task record file", line


class _Refusing(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that refuses every key (401), recording the paths asked."""

    asked: list[str] = []

    def log_message(self, *a) -> None:
        pass

    def do_GET(self) -> None:
        type(self).asked.append(self.path)
        body = json.dumps({"error": "Unauthorized"}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


def test_eval_base_url_that_refuses_the_key_says_so(capsys, nothing_starts, inputs, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("RAO_POLICY_BASE_URL", raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        line = _refused(capsys, nothing_starts, "eval", "--model", inputs["model"], "--task-file", inputs["good"],
                        "--base-url", url)
    finally:
        server.shutdown()
    assert line.startswith(f"error: --base-url {url}: the server refused the key (HTTP 401; sent no key "
                           "($OPENAI_API_KEY is unset))"), line
    assert "None" not in line and _Refusing.asked == ["/v1/models"]
