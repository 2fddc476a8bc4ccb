"""Infrastructure failures fail the stage that saw them, naming their cause, and leave no completion marker:
the share rule on fabricated trees, and the generate stage against a policy server that
is gone (a killed process standing for the campaign's vLLM, nothing listening on its port) on real S3.

The drill with the real vLLM killed mid-generation, then resumed, is in ``test_campaign_resume.py``.
"""

from __future__ import annotations

import re
import subprocess
import types

import pytest

from rao_core.config import CampaignConfig
from rao_core.tree import EndReason, ExecutionTree, Node


def _tree(i: int, end: EndReason, error: str | None = None) -> ExecutionTree:
    root = Node(node_id="n0", goal="g", end_reason=end, error=error)
    return ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id="a", group_id="a", rollout_index=i,
                         root_id="n0", nodes=[root])


def _ctx(share: float = 0.25, s3: dict | None = None, **cfg):
    from infra.stage_io import RunContext

    config = CampaignConfig(name="infra", **cfg)
    config.runtime.max_infra_failure_share = share
    return RunContext(config=config, s3=s3 or {}, mlflow_uri="")


def test_the_share_rule_counts_infrastructure_failures_and_fails_above_the_limit():
    from tasks.stages import InfrastructureFailure, check_infra_failures, infra_counts, infra_text

    ok = [_tree(0, EndReason.FINISHED), _tree(1, EndReason.MAX_STEPS), _tree(2, EndReason.CONTEXT_OVERFLOW),
          _tree(3, EndReason.POLICY_ERROR, "PolicyError: connection refused")]
    assert check_infra_failures(_ctx(), "iteration 1 generate", ok) == {"policy_error": 1}  # 1 of 4: at the limit
    assert infra_text(infra_counts(ok)) == "infrastructure failures 1 (policy_error 1)"
    assert infra_text({}) == "infrastructure failures 0"
    crashed = _tree(4, EndReason.FINISHED)
    crashed.error = "RuntimeError: boom"
    assert infra_counts([crashed, _tree(5, EndReason.SANDBOX_ERROR)]) == {"crashed": 1, "sandbox_error": 1}
    bad = ok + [_tree(5, EndReason.SANDBOX_ERROR, "REPL died"), _tree(6, EndReason.POLICY_ERROR, "PolicyError: "
                                                                                                  "refused\nagain")]
    with pytest.raises(InfrastructureFailure) as e:
        check_infra_failures(_ctx(), "iteration 1 generate", bad)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("iteration 1 generate: 3 of 6 trees (50%; limit 25%, runtime.max_infra_failure_share) "
                          "ended by infrastructure failures (policy_error 2, sandbox_error 1): ")
    assert "no vLLM server was started by this process" in msg and "last error: PolicyError: refused again" in msg
    assert msg.endswith("re-run to redo it on a fresh server")
    assert check_infra_failures(_ctx(share=0.5), "x", bad) == {"policy_error": 2, "sandbox_error": 1}
    assert check_infra_failures(_ctx(share=0.0), "x", ok[:3]) == {}


@pytest.mark.services
def test_a_generate_stage_whose_server_died_fails_naming_it_and_writes_no_marker(s3_server, tiny_model_path,
                                                                                 tmp_path, monkeypatch, caplog):
    """The campaign's server process was killed (SIGKILL) and nothing listens on its port: every tree ends
    ``policy_error``; the stage raises one line with the exit status and the log file, writes no marker and
    uploads no trees; the log's progress lines count infrastructure failures."""
    import logging

    from infra.process import ManagedProcess, free_port
    from tasks import serve
    from infra.stage_io import done_key
    from infra.stage_records import ServedEndpoint
    from tasks.stages import InfrastructureFailure, generate_trees

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    proc = ManagedProcess(name="vllm", cmd=["sleep", "600"], log_path=tmp_path / "logs" / "vllm.log").start()
    subprocess.run(["kill", "-9", str(proc.pid)], check=True)
    proc.proc.wait()
    dead = types.SimpleNamespace(process=proc, pid=proc.pid, alive=proc.alive, stop=proc.stop)
    monkeypatch.setattr(serve.POOL, "servers", [dead])
    ctx = _ctx(s3=s3_server.settings().__dict__, tasks={"pool_size": 2, "tasks_per_iteration": 2},
               algo={"G": 2}, runtime={"max_depth": 0, "max_steps_per_node": 2, "context_window": 1024,
                                        "max_new_tokens": 64})
    served = ServedEndpoint(base_url=f"http://127.0.0.1:{free_port()}/v1", model="policy")
    with caplog.at_level(logging.INFO, logger="rao"), pytest.raises(InfrastructureFailure) as e:
        generate_trees.fn(ctx, 1, served, str(tiny_model_path))
    lines = [r.getMessage() for r in caplog.records]
    msg = str(e.value)
    assert re.match(r"iteration 1 generate: 4 of 4 trees \(100%; limit 25%, runtime.max_infra_failure_share\) "
                    r"ended by infrastructure failures \(policy_error 4\): the vLLM server \(pid \d+\) exited with "
                    r"status -9 \(SIGKILL\); log .*vllm\.log; last error: .*", msg), msg
    assert "\n" not in msg
    store = ctx.store()
    assert not store.exists(done_key(1, "generate")) and not store.exists("iter-1/trees/trees.jsonl")
    assert any(re.match(r"rollouts 4/4 +solved 0 +infrastructure failures 4 \(policy_error 4\)", x) for x in lines), lines
    assert (ctx.local("iter-1/trees.partial.jsonl")).exists()  # the dead trees, kept for inspection


def test_a_dead_server_below_the_share_is_named_once_the_stage_passes():
    """Trees ended ``policy_error`` because a server died, the stage goes on; one warning names
    the dead server (or replica), and none is made when every server runs or no tree ended policy_error."""
    from tasks import serve

    class Server:
        def __init__(self, alive: bool, pid: int):
            self.ok, self.pid = alive, pid

        def alive(self) -> bool:
            return self.ok

        def diagnosis(self) -> str:
            return (f"the vLLM server (pid {self.pid}) exited with status -9 (SIGKILL); "
                    f"log /rao/logs/vllm-{self.pid}.log")

    ctx, what = _ctx(share=0.25), "iteration 2 generate"
    saved = serve.POOL.servers
    try:
        serve.POOL.servers = [Server(False, 4242)]
        assert serve.lost_server_line(ctx, what, {"policy_error": 3, "sandbox_error": 1}) == (
            "iteration 2 generate: 3 trees ended policy_error (under runtime.max_infra_failure_share 25%: the stage "
            "goes on): the vLLM server (pid 4242) exited with status -9 (SIGKILL); log /rao/logs/vllm-4242.log; the "
            "next checkpoint switch (this iteration's evaluation or the next iteration) starts a new one")
        assert serve.lost_server_line(ctx, what, {"sandbox_error": 1}) is None  # not the server's doing
        serve.POOL.servers = [Server(True, 1), Server(False, 2)]
        line = serve.lost_server_line(ctx, what, {"policy_error": 1})
        assert "1 tree ended" in line and "replica 2/2: the vLLM server (pid 2)" in line and "pid 1" not in line
        serve.POOL.servers = [Server(True, 1)]  # timeouts of a live server: nothing to name
        assert serve.lost_server_line(ctx, what, {"policy_error": 1}) is None
        external = _ctx(serving={"base_url": "http://127.0.0.1:9/v1"})
        assert serve.lost_server_line(external, what, {"policy_error": 1}) is None
    finally:
        serve.POOL.servers = saved


@pytest.mark.services
def test_a_generate_stage_that_passes_below_the_share_warns_with_the_dead_servers_pid_status_and_log(
        s3_server, tiny_model_path, tmp_path, monkeypatch, caplog):
    """The same dead server as above, with ``runtime.max_infra_failure_share`` 1.0: the stage passes (its
    marker and trees written) and its log has one warning line with the pid, the exit status and the log."""
    import logging

    from infra.process import ManagedProcess, free_port
    from tasks import serve
    from infra.stage_io import done_key
    from infra.stage_records import ServedEndpoint
    from tasks.stages import generate_trees

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    proc = ManagedProcess(name="vllm", cmd=["sleep", "600"], log_path=tmp_path / "logs" / "vllm.log").start()
    subprocess.run(["kill", "-9", str(proc.pid)], check=True)
    proc.proc.wait()
    dead = types.SimpleNamespace(process=proc, pid=proc.pid, alive=proc.alive, stop=proc.stop)
    monkeypatch.setattr(serve.POOL, "servers", [dead])
    ctx = _ctx(share=1.0, s3=s3_server.settings().__dict__, tasks={"pool_size": 2, "tasks_per_iteration": 2},
               algo={"G": 2}, runtime={"max_depth": 0, "max_steps_per_node": 2, "context_window": 1024,
                                        "max_new_tokens": 64})
    served = ServedEndpoint(base_url=f"http://127.0.0.1:{free_port()}/v1", model="policy")
    with caplog.at_level(logging.INFO, logger="rao"):
        out = generate_trees.fn(ctx, 1, served, str(tiny_model_path))
    assert out.infra_failures == {"policy_error": 4} and ctx.store().exists(done_key(1, "generate"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "policy_error" in
                r.getMessage()]
    assert len(warnings) == 1, warnings
    assert re.fullmatch(rf"iteration 1 generate: 4 trees ended policy_error \(under runtime.max_infra_failure_share "
                        rf"100%: the stage goes on\): the vLLM server \(pid {proc.pid}\) exited with status -9 "
                        rf"\(SIGKILL\); log .*vllm\.log; the next checkpoint switch \(this iteration's evaluation "
                        rf"or the next iteration\) starts a new one", warnings[0]), warnings[0]
