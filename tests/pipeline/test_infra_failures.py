"""Infrastructure failures fail the stage that saw them, naming their cause, and leave no completion marker
(issue 26, item 2): the share rule on fabricated trees, and the generate stage against a policy server that
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
    from tasks.common import RunContext

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
    from tasks.common import done_key
    from tasks.records import ServedEndpoint
    from tasks.stages import InfrastructureFailure, generate_trees

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    proc = ManagedProcess(name="vllm", cmd=["sleep", "600"], log_path=tmp_path / "logs" / "vllm.log").start()
    subprocess.run(["kill", "-9", str(proc.pid)], check=True)
    proc.proc.wait()
    dead = types.SimpleNamespace(process=proc, pid=proc.pid, alive=proc.alive, stop=proc.stop)
    monkeypatch.setitem(serve._STATE, "servers", [dead])
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
