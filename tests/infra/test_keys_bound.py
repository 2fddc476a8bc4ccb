"""A key goes only to the server it was made for: a judge (or any client) pointed at a loopback port the
installation did not start gets none of the installation's keys, and a judge with no endpoint is off, with one
line saying how to set one, instead of trying a default port."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.judge.conftest import node, tree
from tests.judge.fake_openai import FakeOpenAI

YES = '{"verdict": "yes", "reason": "fine"}'


def _free_form_tree():
    return tree("oolong", [node("r", None, verifier=1.0), node("a", "r", depth=1, goal="a sub-task")])


def test_a_stub_on_a_loopback_port_configured_as_the_judge_gets_no_key_of_the_installation(tmp_path, monkeypatch):
    """Another user's stub on a free loopback port, given as judge.base_url: it records the requests' headers;
    none carries the key of `rao services up`'s server (``RAO_POLICY_API_KEY``, its URL ``RAO_POLICY_BASE_URL``)
    nor that of a server this process started (bound to its own port)."""
    from rao_core.judge import JudgeConfig, judge_trees_sync
    from rao_core.policies.openai_policy import bind_server_key, unbind_server_key

    monkeypatch.setenv("RAO_POLICY_API_KEY", "installation-key")
    monkeypatch.setenv("RAO_POLICY_BASE_URL", "http://127.0.0.1:9/v1")  # the recorded service: another port
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    bind_server_key("http://127.0.0.1:10/v1", "campaign-server-key")
    try:
        with FakeOpenAI(lambda body, i: (200, YES, {})) as stub:
            cfg = JudgeConfig(base_url=stub.base_url, model="judge", cache_path=tmp_path / "judge.sqlite",
                              max_retries=0, timeout_s=10)
            out, stats = judge_trees_sync([_free_form_tree()], "oolong", cfg)
    finally:
        unbind_server_key("http://127.0.0.1:10/v1")
    assert out[0].node("a").success_source == "judge" and stats.requests == 1  # the stub was asked
    auth = [{k.lower(): v for k, v in r["headers"].items()}.get("authorization", "") for r in stub.requests]
    assert auth == ["Bearer EMPTY"]
    assert not any(k in a for a in auth for k in ("installation-key", "campaign-server-key"))


def test_a_judge_without_an_endpoint_is_off_with_one_line_and_sends_nothing(tmp_path, monkeypatch, capsys):
    """``judge.enabled: true`` with no base_url (nor RAO_JUDGE_BASE_URL / RAO_POLICY_BASE_URL): no default port
    (it was http://127.0.0.1:8000/v1, any user's to listen on); one warning line saying how to set one; the
    sub-agents get the root proxy."""
    import rao_core.judge.stage as stage
    from rao_core.config import load_config
    from rao_core.judge import JudgeConfig, judge_trees_sync

    for k in ("RAO_JUDGE_BASE_URL", "RAO_POLICY_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(stage, "_said_off", False)
    cfg = load_config(None, ["name=judge-off", "judge.enabled=true"]).judge
    assert cfg.enabled and cfg.base_url is None and not cfg.active
    assert JudgeConfig().base_url is None
    capsys.readouterr()
    out, stats = judge_trees_sync([_free_form_tree()], "oolong",
                                  cfg.model_copy(update={"cache_path": tmp_path / "judge.sqlite"}))
    assert stats.requests == 0 and out[0].node("a").success_source == "proxy"
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: judge: off, no endpoint is set"), lines
    assert "judge.base_url" in lines[0] and "RAO_JUDGE_BASE_URL" in lines[0] and "8000" not in lines[0]
    judge_trees_sync([_free_form_tree()], "oolong", cfg.model_copy(update={"cache_path": tmp_path / "j.sqlite"}))
    assert capsys.readouterr().err == ""  # once per process

    monkeypatch.setenv("RAO_JUDGE_BASE_URL", "https://judge.example.com/v1")
    assert load_config(None, ["name=judge-on", "judge.enabled=true"]).judge.active


def test_the_pipelines_clients_send_a_started_servers_key_to_it_alone(monkeypatch):
    """The key a server was started with reaches its address (``localhost`` and ``127.0.0.1`` alike, with or
    without ``/v1``), in this process and its children, and no other port; once the server is stopped, its
    address gets nothing of ours."""
    from rao_core.policies.openai_policy import bind_server_key, policy_client_key, unbind_server_key

    monkeypatch.delenv("RAO_POLICY_BASE_URL", raising=False)
    monkeypatch.setenv("RAO_POLICY_API_KEY", "process-key")
    monkeypatch.setenv("OPENAI_API_KEY", "provider-key")
    bind_server_key("http://127.0.0.1:23456/v1", "k")
    try:
        assert policy_client_key("http://localhost:23456") == "k"
        assert policy_client_key("http://127.0.0.1:23456/v1/") == "k"
        assert policy_client_key("http://127.0.0.1:23457/v1") == "provider-key"
        assert policy_client_key("http://127.0.0.1:23456/v1", own=False) == "provider-key"
        child = subprocess.run([sys.executable, "-c", "from rao_core.policies.openai_policy import policy_client_key "
                                "as k; print(k('http://127.0.0.1:23456/v1'), k('http://127.0.0.1:23457/v1'))"],
                               capture_output=True, text=True, timeout=60)
        assert child.stdout.split() == ["k", "provider-key"], child.stderr  # a child (a campaign) inherits it
    finally:
        unbind_server_key("http://localhost:23456/v1")
    assert policy_client_key("http://127.0.0.1:23456/v1") == "provider-key"


@pytest.mark.parametrize("switching,dev", [(True, "1"), (False, "0")])
def test_vllm_dev_routes_only_for_a_server_that_switches_checkpoints(tmp_path, monkeypatch, switching, dev):
    """The development routes (``/collective_rpc``, ``/sleep``, ``/server_info``, ...) are on only for the
    campaign's switching servers (in-place reload, sleep mode); `rao eval`'s server and `rao services up
    --model`'s have them off."""
    from infra.serving import VLLMServer, server_from_config
    from rao_core.config import load_config

    cfg = load_config(None, ["name=dev"])
    srv = server_from_config(cfg, tmp_path, on_gpu=False, switching=switching)
    assert srv._env()["VLLM_SERVER_DEV_MODE"] == dev
    assert VLLMServer(tmp_path, on_gpu=False)._env()["VLLM_SERVER_DEV_MODE"] == "0"
