"""The README's Prefect workflow end to end: on a real Prefect server started by ``rao services up
--prefect-server``, ``rao deploy`` and the worker command it prints, the ``campaign`` deployment runs a cheap
campaign (tiny model, 1 iteration) to COMPLETED, then the ``nightly-evaluation`` deployment, under another
name, evaluates the checkpoint that campaign registered (fetched by its own S3 URI) to COMPLETED with the
deployment's default parameters (the config's suite of four benchmarks: the champion, the same version, evaluated in
the same run on the same tasks, each benchmark's metric compared by the paired test with Holm's correction, the
table saying they are one checkpoint);
the next nightly pairs with the champion's stored outcomes and evaluates the candidate only. A worse
candidate failing is tests/pipeline/test_nightly_decision.py (the tiny model solves nothing, so no real
checkpoint here can be worse than another).

Both flows use the session's tiny vLLM server (``serving.base_url``, ``switch: none``), so the test starts
no vLLM of its own; S3 is the session's SeaweedFS, MLflow a SQLite file of the test.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rao_core.paths import REPO_ROOT
from tests.infra.prefect_worker import printed_worker, wait_for_flow_run

pytestmark = [pytest.mark.vllm, pytest.mark.services, pytest.mark.slow]
RAO = [sys.executable, "-m", "rao_cli.main"]
CAMPAIGN, NIGHTLY = "wf-campaign", "wf-nightly"


def _tiny_config(path: Path, model: Path, base_url: str) -> Path:
    """configs/cpu-smoke.yaml shrunk to the tiny model: 1 iteration of 2 tasks x 2 trees, short nodes, 2
    evaluation tasks of each of the four benchmarks, on an external server that keeps its weights."""
    cfg = yaml.safe_load((REPO_ROOT / "configs/cpu-smoke.yaml").read_text())
    cfg.update(iterations=1, model={"path": str(model), "registered_model": "rao-policy-{campaign}"})
    cfg["serving"] = {"base_url": base_url, "switch": "none", "max_model_len": 2048}
    cfg["tasks"].update(difficulties=["easy"], pool_size=4, tasks_per_iteration=2)
    cfg["algo"]["G"] = 2
    cfg["runtime"].update(context_window=2048, max_new_tokens=128, max_steps_per_node=3, tree_timeout_s=600)
    cfg["warm_start"] = {"mode": "none"}
    cfg["eval"].update(difficulties=["easy"], n_tasks=2, regression_n_tasks=2)
    cfg["eval"]["benchmarks"] = {b: {"n_tasks": 2, "at": "ends"} for b in ("oolong", "deepdive", "arte")}
    cfg["tracking"]["max_traces_per_iteration"] = 4
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _run_deployment(api, deployment_id: str, parameters: dict, timeout_s: float) -> dict:
    """Create a flow run of the deployment through the ``prefect_api`` client and wait for a final state;
    returns the flow run."""
    fr = api.post(f"deployments/{deployment_id}/create_flow_run", json={"parameters": parameters})
    return wait_for_flow_run(api, fr.json()["id"], timeout_s=timeout_s)


def _tables(api, key: str) -> list[list[dict]]:
    """The rows of every version of the Prefect table artifact ``key``, oldest first."""
    import json

    r = api.post("artifacts/filter", json={"artifacts": {"key": {"any_": [key]}}, "sort": "CREATED_DESC"})
    return [json.loads(a["data"]) if isinstance(a["data"], str) else a["data"] for a in reversed(r.json())]


def test_a_campaign_and_the_nightly_evaluation_of_its_checkpoint_complete_through_a_worker(
        prefect_up, prefect_api, vllm_tiny, s3_server, tmp_path):
    env, _, _ = prefect_up
    home = Path(env["RAO_HOME"])
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**env, **s3_server.settings().env(), "MLFLOW_TRACKING_URI": mlflow_uri}
    config = _tiny_config(tmp_path / "tiny.yaml", vllm_tiny.model_path, vllm_tiny.base_url)

    r = subprocess.run(RAO + ["deploy"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    deps = {d["name"]: d["id"] for d in prefect_api.post("deployments/filter", json={}).json()}
    worker_line = re.search(r"start a worker: (.*)", r.stdout).group(1)  # PREFECT_API_URL=... prefect ...
    # the worker's flows send the vLLM fixture's key to it (RAO_POLICY_BASE_URL: the server that key is for)
    worker_env = {**env, "RAO_POLICY_API_KEY": vllm_tiny.api_key, "RAO_POLICY_BASE_URL": vllm_tiny.base_url}
    t0 = time.monotonic()
    with printed_worker(worker_line, worker_env, tmp_path) as worker_log:
        campaign = _run_deployment(prefect_api, deps["campaign"],
                                   {"params": {"config": str(config), "name": CAMPAIGN}}, 900)
        t_campaign = time.monotonic() - t0
        nightly = next_night = None
        if campaign["state"]["type"] == "COMPLETED":  # the deployment's defaults: no suite given
            import mlflow

            # the tiny model's iteration made no update, so it never became champion: make its version the
            # champion (its tags hold the scores the campaign's evaluation recorded), as a real campaign's is
            c = mlflow.MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
            cand = c.get_model_version_by_alias(f"rao-policy-{CAMPAIGN}", "candidate")
            c.set_registered_model_alias(cand.name, "champion", cand.version)
            nightly = _run_deployment(prefect_api, deps["nightly-evaluation"], {"params": {
                "config": str(config), "model": "candidate", "campaign": CAMPAIGN, "name": NIGHTLY}}, 600)
        if nightly and nightly["state"]["type"] == "COMPLETED":
            # the next night: the champion's outcomes are stored, only the candidate is evaluated
            next_night = _run_deployment(prefect_api, deps["nightly-evaluation"], {"params": {
                "config": str(config), "model": "candidate", "campaign": CAMPAIGN, "name": NIGHTLY}}, 600)
    log = worker_log.read_text()[-4000:]
    print(f"campaign {t_campaign:.0f} s, nightly {time.monotonic() - t0 - t_campaign:.0f} s through the worker")
    assert campaign["state"]["type"] == "COMPLETED", f"{campaign['state']['message']}\n{log}"
    assert campaign["name"] == CAMPAIGN
    assert nightly["state"]["type"] == "COMPLETED", f"{nightly['state']['message']}\n{log}"
    assert nightly["name"].startswith(f"{NIGHTLY}-candidate-")  # every night's run has its own name (its date)
    tables = _tables(prefect_api, f"{NIGHTLY}-comparison")  # oldest first: the nightly with defaults, then the next night
    # the default suite: the four benchmarks, each with its paired test (Holm over the four)
    assert [r["status"] for r in tables[0]] == ["ok"] * 4, tables[0]
    assert [r["metric"] for r in tables[0]] == ["eval/arte/recursive/easy/success", "eval/deepdive/recursive/easy/success",
                                                "eval/oolong/recursive/singledoc_rolls/success",
                                                "eval/textcraft/recursive/easy/success"]
    assert all(r["n"] == 2 and r["same_checkpoint"].startswith("v") and r["champion_from"] == "this run"
               and r["test"].endswith("Holm over 4 metrics") for r in tables[0]), tables[0]
    assert next_night["state"]["type"] == "COMPLETED", next_night["state"]
    assert all(r["champion_from"].startswith("stored evaluation, run ") for r in tables[1]), tables[1]

    # The evaluation ran under its own name on the version the campaign registered, fetched by its S3 URI
    # into the evaluation's own cache.
    import mlflow

    # registry_uri too: MlflowClient(uri) alone reads the registry at the process-wide registry URI, which an
    # earlier test of the session may have set (failed so in .ci/run)
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    model = f"rao-policy-{CAMPAIGN}"
    cand = client.get_model_version_by_alias(model, "candidate")
    assert cand.source == f"s3://{s3_server.bucket}/{CAMPAIGN}/iter-1/checkpoint"
    fetched = home / f"campaigns/{NIGHTLY}/checkpoints/{model}-v{cand.version}"
    assert (fetched / "config.json").exists()
    exp = client.get_experiment_by_name("rao").experiment_id
    runs = client.search_runs([exp], filter_string="tags.`rao.kind` = 'evaluation'", order_by=["start_time DESC"])
    assert [(x.info.status, x.data.tags["rao.model"]) for x in runs] == [("FINISHED", f"models:/{model}@candidate"),
                                                                         ("FINISHED", f"models:/{model}@candidate")]
    runs = runs[1:]  # the nightly with the deployment's defaults
    assert {"eval/textcraft/recursive/easy/success", "eval/oolong/recursive/singledoc_rolls/success"} <= set(runs[0].data.metrics)
    assert runs[0].data.tags.get("rao.prefect_flow_run_id") == nightly["id"]
