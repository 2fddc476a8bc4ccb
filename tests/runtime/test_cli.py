"""CLI: `rao sandbox run` and `rao solve --policy scripted` (typer's CliRunner, in process)."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from rao_cli.main import app
from rao_core.envs.base import Task, write_tasks
from rao_core.tree import read_trees

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"


def test_sandbox_run_prints_json(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("print('hi')\n1/0\n")
    r = CliRunner().invoke(app, ["sandbox", "run", "--sandbox", SANDBOX, "--timeout", "5", str(f)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["ok"] is False and out["stdout"] == "hi\n" and out["end_reason"] == "error"
    assert "ZeroDivisionError" in out["error"]


def test_solve_scripted_writes_tree(tmp_path, monkeypatch):
    import rao_core.envs as envs
    from tests.runtime.fakes import FakeEnv

    monkeypatch.setitem(envs.REGISTRY, "fake", envs.EnvEntry("tests.runtime.fakes:FakeEnv"))
    write_tasks(tmp_path / "t.jsonl", [Task(task_id="x", env="fake", data={"goal": "g", "expect": 7})])
    (tmp_path / "s.json").write_text(json.dumps(["```python\nfinish(7)\n```"]))
    r = CliRunner().invoke(app, ["solve", "--env", "fake", "--task-file", str(tmp_path / "t.jsonl"), "--policy",
                                 "scripted", "--script", str(tmp_path / "s.json"), "--sandbox", SANDBOX,
                                 "--out", str(tmp_path / "tree.jsonl")])
    assert r.exit_code == 0, r.output
    assert "success=1.0" in r.output
    (tree,) = read_trees(tmp_path / "tree.jsonl")
    assert tree.root.result == 7 and FakeEnv.name == tree.env
