"""`rao judge trees` and `rao judge calibrate` through the typer app, against the fake server."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from rao_cli.judge_cmd import app
from rao_core.tree import read_trees, write_trees
from tests.judge.conftest import node, tree
from tests.judge.fake_openai import FakeOpenAI

runner = CliRunner()


def test_trees_command(tmp_path):
    src = write_trees(tmp_path / "in.jsonl", [tree("oolong", [node("r", None, verifier=1.0),
                                                               node("a", "r", depth=1)])])
    with FakeOpenAI(lambda b, i: (200, '{"verdict": "no", "reason": "x"}', {})) as srv:
        res = runner.invoke(app, ["trees", "--in", str(src), "--out", str(tmp_path / "out.jsonl"),
                                  "--base-url", srv.base_url, "--model", "m", "--cache", str(tmp_path / "c.sqlite")])
    assert res.exit_code == 0, res.output
    assert "judge/requests" in res.output
    a = read_trees(tmp_path / "out.jsonl")[0].node("a")
    assert (a.success, a.success_source, a.judge["model"]) == (0.0, "judge", "m")


def test_trees_command_no_judge_and_yaml_config(tmp_path):
    src = write_trees(tmp_path / "in.jsonl", [tree("oolong", [node("r", None, verifier=0.5),
                                                               node("a", "r", depth=1)])])
    (tmp_path / "j.yaml").write_text("judge:\n  enabled: true\n  max_concurrency: 2\n")
    res = runner.invoke(app, ["trees", "--in", str(src), "--out", str(tmp_path / "o.jsonl"), "--no-judge",
                              "--config", str(tmp_path / "j.yaml")])
    assert res.exit_code == 0, res.output
    assert read_trees(tmp_path / "o.jsonl")[0].node("a").success_source == "proxy"
    (tmp_path / "bad.yaml").write_text("max_concurrency: 0\n")
    res = runner.invoke(app, ["trees", "--in", str(src), "--out", str(tmp_path / "o.jsonl"),
                              "--config", str(tmp_path / "bad.yaml")])
    assert res.exit_code != 0 and "max_concurrency" in res.output


def test_calibrate_command(tmp_path):
    src = write_trees(tmp_path / "t.jsonl", [tree("textcraft-synth", [
        node("r", None, verifier=1.0), node("a", "r", depth=1, verifier=0.0)])])
    with FakeOpenAI(lambda b, i: (200, "VERDICT: yes", {})) as srv:
        res = runner.invoke(app, ["calibrate", "--env", "textcraft-synth", "--trees", str(src),
                                  "--base-url", srv.base_url, "--model", "m", "--cache", str(tmp_path / "c.sqlite"),
                                  "--json-out", str(tmp_path / "rep.json")])
    assert res.exit_code == 0, res.output
    assert "accuracy" in res.output and "50.0%" in res.output  # TP=1, FP=1
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["summary"] == {"n": 2, "accuracy": 0.5, "false_positive_rate": 1.0, "false_negative_rate": 0.0}


def test_calibrate_without_a_server_fails_naming_the_url(tmp_path):
    from infra.process import free_port

    src = write_trees(tmp_path / "t.jsonl", [tree("textcraft-synth", [node("r", None, verifier=1.0)])])
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    res = runner.invoke(app, ["calibrate", "--env", "textcraft-synth", "--trees", str(src), "--base-url", url,
                              "--model", "m", "--cache", str(tmp_path / "c.sqlite")])
    assert res.exit_code == 1  # a server that does not answer: a failure while working (exit-code rule of rao_cli)
    assert f"no judge server answers at {url}" in res.output
