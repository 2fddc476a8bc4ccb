"""Campaigns that resume correctly: real vLLM (tiny model), SeaweedFS, MLflow (SQLite), Prefect.

- A finished campaign re-run (in the flow, and by ``rao run``) returns its stored summary at once: no server,
  no MLflow point added. A campaign interrupted between stages and resumed logs each (run, metric, step)
  exactly once (points counted in MLflow's SQLite database).
- The dead-server drill: the campaign's own vLLM killed (SIGKILL) mid-generation; ``rao run`` ends with one
  line naming the dead server and its log, no generate marker is written, and the re-run regenerates the
  iteration on a fresh server and completes it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.test_campaign import TINY_OVERRIDES, _params, campaign_env  # noqa: F401 - a fixture

pytestmark = [pytest.mark.vllm, pytest.mark.services, pytest.mark.slow]


def _points(db: Path) -> tuple[int, list[tuple]]:
    """All MLflow metric points, and the (run, metric, step) triples holding more than one."""
    with sqlite3.connect(db) as c:
        n = c.execute("select count(*) from metrics").fetchone()[0]
        dup = c.execute("select run_uuid, key, step, count(*) from metrics group by 1, 2, 3 having count(*) > 1")
        return n, dup.fetchall()


def _cli(name: str, tiny_model_path: Path, extra: dict, iterations: int = 1, timeout: float = 1200
         ) -> subprocess.CompletedProcess:
    ov = [f"--set={k}={json.dumps(v)}" for k, v in {**TINY_OVERRIDES, **extra}.items()]
    cmd = [sys.executable, "-m", "rao_cli.main", "run", "--name", name, "--iterations", str(iterations),
           f"--set=model.path={json.dumps(str(tiny_model_path))}", *ov]
    return subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=timeout)


def test_a_finished_campaign_reruns_in_seconds_and_an_interrupted_one_logs_each_point_once(
        campaign_env, tiny_model_path, vllm_tiny, monkeypatch):
    import infra.validation
    from flows import campaign
    from infra.storage import ArtifactStore, S3Settings

    db = campaign_env / "mlflow.db"
    extra = {"serving.base_url": vllm_tiny.base_url, "serving.switch": "none", "trainer.loss_type": "reinforce"}
    params = _params("again", tiny_model_path, **extra).model_copy(update={"iterations": 2})
    real = infra.validation.validate_training_data
    calls = []

    def interrupted(trees, batch, **kw):  # iteration 2's validation: the campaign stops between stages
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("interrupted between the judge and validate stages")
        return real(trees, batch, **kw)

    monkeypatch.setattr(infra.validation, "validate_training_data", interrupted)
    with pytest.raises(RuntimeError, match="interrupted between"):
        campaign.rao_campaign(params)
    store = ArtifactStore(S3Settings(os.environ["RAO_S3_ENDPOINT"], "rao", os.environ["AWS_ACCESS_KEY_ID"],
                                     os.environ["AWS_SECRET_ACCESS_KEY"]), "again")
    assert store.exists("iter-1/_done/log.json") and store.exists("iter-2/_done/judge.json")
    assert not store.exists("iter-2/_done/validate.json") and not store.exists("_done/campaign.json")
    before, dup = _points(db)
    assert before > 0 and dup == []
    summary = campaign.rao_campaign(params)  # resumed at iteration 2's validation
    after, dup = _points(db)
    assert dup == [], f"(run, metric, step) logged twice on resume: {dup[:5]}"
    assert after > before and [it["iteration"] for it in summary["iterations"]] == [1, 2]
    import mlflow

    client = mlflow.MlflowClient()
    steps = sorted(m.step for m in client.get_metric_history(summary["mlflow_run_id"], "success/root"))
    assert steps == [1, 2]
    assert sorted(m.step for m in client.get_metric_history(summary["mlflow_run_id"],
                                                            "eval/textcraft/recursive/easy/success")) == [0, 1, 2]

    def no_server(*a, **k):
        raise AssertionError("a complete campaign started a policy server")

    monkeypatch.setattr(campaign, "serve_checkpoint", no_server)
    t0 = time.monotonic()
    again = campaign.rao_campaign(params)  # the flow: stored summary, nothing logged
    flow_s = time.monotonic() - t0
    assert again["already_complete"] and again["mlflow_run_id"] == summary["mlflow_run_id"]
    assert [(i["iteration"], i["register"]["version"]) for i in again["iterations"]] == \
        [(i["iteration"], i["register"]["version"]) for i in summary["iterations"]]
    assert _points(db) == (after, [])
    t0 = time.monotonic()
    out = _cli("again", tiny_model_path, extra, iterations=2, timeout=300)
    cli_s = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-3000:]
    assert "campaign again is already complete (2 iterations" in " ".join(out.stdout.split())
    assert "validation success by iteration" in out.stdout and "wall time per stage" in out.stdout
    assert _points(db) == (after, [])
    print(f"re-run of a complete campaign: flow {flow_s:.1f} s, rao run {cli_s:.1f} s (incl. interpreter start)")
    assert cli_s < 60


def test_a_killed_vllm_fails_generation_naming_it_and_the_rerun_completes_the_iteration(
        campaign_env, tiny_model_path):
    """The dead-server drill with the campaign's own vLLM (tiny model)."""
    from infra.storage import ArtifactStore, S3Settings
    from rao_core.tree import read_trees

    home = Path(os.environ["RAO_HOME"])
    extra = {"eval.enabled": False, "trainer.loss_type": "reinforce"}
    ov = [f"--set={k}={json.dumps(v)}" for k, v in {**TINY_OVERRIDES, **extra}.items()]
    cmd = [sys.executable, "-m", "rao_cli.main", "run", "--name", "drill", "--iterations", "1",
           f"--set=model.path={json.dumps(str(tiny_model_path))}", *ov]
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    journal = home / "campaigns/drill/iter-1/trees.partial.jsonl"
    deadline, killed = time.monotonic() + 1200, None
    try:
        while killed is None:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the campaign did not reach generation"
            records = list((home / "services/flow-runs").glob("*.json"))
            if journal.exists() and records:
                killed = json.loads(records[0].read_text())["pid"]
                os.killpg(killed, signal.SIGKILL)  # the campaign's vLLM, mid-generation
            time.sleep(0.2)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 1, err[-3000:]
    assert re.match(rf"error: iteration 1 generate: \d of 4 trees \(\d+%; limit 25%, runtime.max_infra_failure_share\) "
                    rf"ended by infrastructure failures \(policy_error \d\): the vLLM server \(pid {killed}\) exited "
                    rf"with status -9 \(SIGKILL\); log \S+vllm\S*\.log; last error: .+; no completion marker written: "
                    rf"re-run to redo it on a fresh server$", lines[-1]), lines[-1]
    print(f"dead-server drill: {lines[-1]}")
    store = ArtifactStore(S3Settings(os.environ["RAO_S3_ENDPOINT"], "rao", os.environ["AWS_ACCESS_KEY_ID"],
                                     os.environ["AWS_SECRET_ACCESS_KEY"]), "drill")
    assert not store.exists("iter-1/_done/generate.json")
    out = _cli("drill", tiny_model_path, extra)  # a fresh server regenerates the iteration
    assert out.returncode == 0, out.stderr[-3000:]
    assert store.exists("iter-1/_done/generate.json") and store.exists("iter-1/_done/register.json")
    trees = read_trees(store.get_file("iter-1/trees/trees.jsonl", campaign_env / "trees.jsonl"))
    assert len(trees) == 4 and not [t for t in trees if t.root.end_reason == "policy_error"]


def test_a_nightly_that_compares_no_metric_fails_instead_of_reporting_ok(campaign_env, tiny_model_path, vllm_tiny,
                                                                        monkeypatch):
    """The model has no champion (a version was registered, never promoted): nothing can be compared, so the
    flow run fails at once with ``NothingCompared`` saying why, and evaluates nothing. (A
    champion scored on other tasks than the suite is no longer a case: the champion is evaluated
    on the suite's own tasks.)"""
    import mlflow

    from flows.evaluate import EvaluateParams, NothingCompared, SuiteEntry, rao_evaluate
    from infra.tracking import configure_mlflow
    from tasks import tracking

    monkeypatch.setenv("RAO_POLICY_BASE_URL", vllm_tiny.base_url)
    configure_mlflow()
    exp = mlflow.create_experiment("rao", artifact_location=(campaign_env / "art").as_uri())
    run = mlflow.MlflowClient().create_run(exp).info.run_id
    tracking.register_version("rao-policy-smoke", str(tiny_model_path), run, {"eval/recursive/tier1/success": 0.5})
    params = EvaluateParams(model="candidate", name="nightly-none",
                            suite=[SuiteEntry(difficulties=["easy"], n_tasks=2, modes=["recursive"])])
    with pytest.raises(NothingCompared, match=r"no champion to compare with: rao-policy-smoke has 1 version and none "
                       r"holds the 'champion' alias \(v1 not promoted\).*nothing was evaluated"):
        rao_evaluate(params)  # refused before any server starts
    runs = mlflow.MlflowClient().search_runs([exp], filter_string="tags.`rao.kind` = 'evaluation'")
    assert runs == []


def test_a_campaign_resumes_on_a_new_machine_from_its_s3_store_alone(campaign_env, tiny_model_path, vllm_tiny,
                                                                     monkeypatch):
    """A machine lost between sittings: the campaign's S3 store outlives it, its local state does not. The warm
    start, a folder of the old machine, was copied to the campaign's ``iter-0`` on S3. With a new ``RAO_HOME`` (no
    local cache of the campaign), a new MLflow database and the warm start named by its S3 copy, the same campaign
    asked for one more iteration takes iteration 1 from its S3 markers (nothing of it re-run or re-logged) and
    trains iteration 2 from iteration 1's checkpoint fetched back from S3."""
    import shutil

    import mlflow

    import tasks.serve
    from flows import campaign
    from infra.storage import ArtifactStore, S3Settings

    warm = campaign_env / "old-machine" / "warm-start"
    shutil.copytree(tiny_model_path, warm)
    extra = {"serving.base_url": vllm_tiny.base_url, "serving.switch": "none", "trainer.loss_type": "reinforce",
             "warm_start.mode": "checkpoint", "warm_start.checkpoint": str(warm)}
    params = _params("moved", tiny_model_path, **extra)
    first = campaign.rao_campaign(params)
    assert [it["iteration"] for it in first["iterations"]] == [1]
    store = ArtifactStore(S3Settings(os.environ["RAO_S3_ENDPOINT"], "rao", os.environ["AWS_ACCESS_KEY_ID"],
                                     os.environ["AWS_SECRET_ACCESS_KEY"]), "moved")
    assert store.exists("iter-0/checkpoint.manifest.json") and store.verify_manifest("iter-0/checkpoint.manifest.json") == []
    # the new machine: the same S3 store, nothing else (the old RAO_HOME and the warm-start folder are gone)
    shutil.rmtree(campaign_env / "home")
    shutil.rmtree(campaign_env / "old-machine")
    params = _params("moved", tiny_model_path, **{**extra, "warm_start.checkpoint": store.uri("iter-0/checkpoint")})
    monkeypatch.setenv("RAO_HOME", str(campaign_env / "home-new"))
    fetched = []
    real_fetch = tasks.serve.fetch_dir
    monkeypatch.setattr(tasks.serve, "fetch_dir", lambda ctx, uri, rel: fetched.append(uri) or real_fetch(ctx, uri, rel))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{campaign_env / 'mlflow-new.db'}")
    summary = campaign.rao_campaign(params.model_copy(update={"iterations": 2}))
    assert [it["iteration"] for it in summary["iterations"]] == [1, 2]
    one, two = summary["iterations"]
    assert one["times"] == first["iterations"][0]["times"]  # its stored stage times: not run again
    assert any(u.rstrip("/").endswith("moved/iter-1/checkpoint") for u in fetched), fetched  # iteration 2's parent
    assert two["register"]["version"] == "1"  # the new registry's first version (the old one stays in the old database)
    assert summary["mlflow_uri"].endswith("mlflow-new.db") and summary["mlflow_run_id"] != first["mlflow_run_id"]
    # the new database holds iteration 2's points only: iteration 1's stay where they were logged
    steps = sorted(m.step for m in mlflow.MlflowClient().get_metric_history(summary["mlflow_run_id"], "success/root"))
    assert steps == [2]
