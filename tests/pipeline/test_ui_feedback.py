"""What the user sees of a running campaign (issue 17): one artifact-key pattern, progress artifacts in the
Prefect UI, no vLLM server left behind by a cancelled or crashed flow, and the campaign form's name."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("campaign, stage, iteration, key", [
    ("smoke", "validation", 1, "smoke-iter-1-validation"),
    ("smoke", "eval", 0, "smoke-iter-0-eval"),
    ("My_Campaign.v2", "eval", 3, "my-campaign-v2-iter-3-eval"),
    ("__Odd..Name__", "generate progress", 12, "odd-name-iter-12-generate-progress"),
    ("nightly", "comparison", None, "nightly-comparison"),
    ("smoke", "warm_start", "iter-0", "smoke-iter-0-warm-start"),
])
def test_artifact_keys_follow_one_pattern_prefect_accepts(campaign, stage, iteration, key):
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.types.names import raise_on_name_alphanumeric_dashes_only

    from tasks.common import artifact_key

    got = artifact_key(campaign, stage, iteration)
    assert got == key
    assert raise_on_name_alphanumeric_dashes_only(got) == got  # Prefect's own rule for artifact keys
    assert ArtifactCreate(key=got, type="markdown", data="x").key == got


def test_artifact_key_refuses_an_empty_name():
    from tasks.common import artifact_key

    with pytest.raises(ValueError, match="campaign and a stage"):
        artifact_key("__", "eval", 1)


def test_every_stage_artifact_uses_artifact_key():
    """No artifact key is spelled by hand any more (the three shapes of issue 17, item 7)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    calls = []
    for path in [*root.glob("tasks/*.py"), *root.glob("flows/*.py")]:
        calls += [(path.name, m.group(1)) for m in re.finditer(r"create_\w+_artifact\((?:\s*\w+=[^,]+,)*?\s*key=([^,]+),",
                                                                   path.read_text())]
    assert calls, "no artifact call found: the pattern of this test is stale"
    assert all(arg.startswith("artifact_key(") for _, arg in calls), calls


class _FakeServer:
    """Stands in for infra.serving.VLLMServer in the flow's process: records stop()."""

    def __init__(self, pid: int) -> None:
        self.pid, self.stopped = pid, 0

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped += 1


def _hook_args(run_id: str, state: str = "Cancelling"):
    from types import SimpleNamespace

    return SimpleNamespace(name="rao-campaign"), SimpleNamespace(id=run_id, name="smoke"), SimpleNamespace(name=state)


def test_cancellation_hook_stops_the_server_held_by_the_flow_process(tmp_path, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    from tasks import serve

    fake = _FakeServer(pid=4242)
    monkeypatch.setitem(serve._STATE, "server", fake)
    monkeypatch.setitem(serve._STATE, "served", "iter-1")
    assert serve.stop_flow_servers(*_hook_args("run-a")) == [4242]
    assert fake.stopped == 1 and serve._STATE["server"] is None and serve._STATE["served"] is None
    assert serve.stop_flow_servers(*_hook_args("run-a")) == []  # a second call finds nothing to stop


def test_hook_in_another_process_stops_the_recorded_server_only(tmp_path, monkeypatch):
    """Prefect runs a cancelled run's hooks in the worker's runner when the flow process is gone: the server
    (here a stand-in process in its own session, as vLLM runs) is found through its record and stopped; a
    server of another flow run, and a record whose pid now names another process, are left alone."""
    import subprocess

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    from flows.campaign import FLOW_END_HOOKS, rao_campaign
    from tasks import serve

    assert serve.stop_flow_servers in rao_campaign.on_cancellation_hooks
    assert serve.stop_flow_servers in rao_campaign.on_crashed_hooks
    assert FLOW_END_HOOKS["on_failure"] and serve.stop_flow_servers not in FLOW_END_HOOKS["on_failure"]
    ours = subprocess.Popen(["sleep", "120"], start_new_session=True)
    other = subprocess.Popen(["sleep", "120"], start_new_session=True)
    reused = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        monkeypatch.setitem(serve._STATE, "server", None)  # this process holds no server
        assert serve.record_server(ours.pid, base_url="http://x/v1", flow_run_ids=["run-b", "root-1"])
        assert serve.record_server(other.pid, flow_run_ids=["run-c"])
        rec = serve.record_server(reused.pid, flow_run_ids=["run-b"])
        import json

        data = json.loads(rec.read_text())
        rec.write_text(json.dumps({**data, "create_time": data["create_time"] - 100}))  # pid now another process
        assert serve.record_server(ours.pid, flow_run_ids=[]) is None  # outside a flow run: nothing recorded

        assert serve.stop_flow_servers(*_hook_args("run-b", "Crashed")) == [ours.pid]
        from infra.process import pid_alive

        assert not pid_alive(ours.pid)  # stopped (and reaped by kill_group: it is this process's child)
        assert other.poll() is None and reused.poll() is None
        assert sorted(p.name for p in serve.server_records_dir().iterdir()) == [f"{other.pid}.json"]
        assert serve.stop_flow_servers(*_hook_args("root-1")) == []  # already stopped, record gone
    finally:
        for p in (ours, other, reused):
            p.kill()
            p.wait()
