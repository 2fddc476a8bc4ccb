"""End-to-end pipeline tests: real vLLM (tiny model), SeaweedFS, MLflow (SQLite) and Prefect.

The tiny random model never solves a task, so every advantage would be 0 and the update a no-op. To
exercise the whole RL path, rollout 0 of each group comes from the scripted TextCraft expert and the
others from the served model; groups then hold successful and failed trees, advantages are non-zero and
the trainer really changes the weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.services, pytest.mark.slow]

TINY_OVERRIDES = {
    "serving.max_model_len": 2048, "runtime.context_window": 2048, "runtime.max_new_tokens": 256,
    "runtime.max_steps_per_node": 5, "runtime.max_depth": 1, "runtime.tree_timeout_s": 120,
    "tasks.pool_size": 4, "tasks.tasks_per_iteration": 2, "tasks.difficulties": ["easy"],
    "algo.G": 2, "warm_start.mode": "none", "eval.n_tasks": 2, "eval.difficulties": ["easy"], "eval.benchmarks": {},
    "trainer.loss_type": "ppo", "trainer.lr": 1e-3, "trainer.micro_batch_tokens": 4096,
    "tracking.max_traces_per_iteration": 8,
}


@pytest.fixture
def campaign_env(tmp_path, s3_server, prefect_harness, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for k, v in s3_server.settings().env().items():
        monkeypatch.setenv(k, v)
    return tmp_path


def _params(name, tiny_model_path, **extra):
    from flows.campaign import CampaignParams

    ov = [f"{k}={json.dumps(v)}" for k, v in {**TINY_OVERRIDES, **extra}.items()]
    return CampaignParams(config="configs/cpu-smoke.yaml", name=name, iterations=1, model_path=str(tiny_model_path),
                          overrides=ov)


def _mixed(monkeypatch):
    """Rollout 0 of every group comes from the scripted TextCraft expert, the others from the served model."""
    import rao_core.runtime as rt
    from rao_core.policies.textcraft_expert import TextCraftExpert

    real = rt.run_trees

    async def mixed(env, tasks_with_rollouts, policy, config, *, tokenizer, progress=None, **kw):
        items = list(tasks_with_rollouts)
        expert = await real(env, [(t, 1) for t, _ in items], TextCraftExpert(seed=0), config, tokenizer=tokenizer)
        model = await real(env, [(t, n - 1) for t, n in items], policy, config, tokenizer=tokenizer)
        out = []
        for t, _ in items:
            group = [x for x in expert if x.task_id == t.task_id] + [x for x in model if x.task_id == t.task_id]
            for g, tree in enumerate(group):
                tree.rollout_index = g
            out += group
        return out

    monkeypatch.setattr(rt, "run_trees", mixed)


def test_one_iteration_end_to_end(campaign_env, tiny_model_path, monkeypatch):
    import mlflow
    from safetensors.torch import load_file

    from flows.campaign import rao_campaign
    from infra.storage import ArtifactStore, S3Settings

    _mixed(monkeypatch)
    suite = {b: {"n_tasks": 2, "at": "ends"} for b in ("oolong", "deepdive", "arte")}  # the suite, 2 tasks each
    summary = rao_campaign(_params("e2e", tiny_model_path, **{"eval.benchmarks": suite}))
    it = summary["iterations"][0]
    # every benchmark evaluated at the start and the end, its keys named by it, its rows too
    for b, d in (("textcraft", "easy"), ("oolong", "singledoc_rolls"), ("deepdive", "easy"), ("arte", "easy")):
        assert it["metrics"][f"eval/{b}/recursive/{d}/n"] == 2.0, sorted(it["metrics"])
        assert f"eval/{b}/recursive/{d}/success_ci_high" in it["metrics"]
    assert [r["benchmark"] for r in summary["base_eval"]] == ["textcraft", "oolong", "deepdive", "arte"]
    assert summary["eval_suite"]["primary"] == "textcraft" and it["register"]["metric"] == (
        "eval/textcraft/recursive/easy/success")
    store = ArtifactStore(S3Settings(os.environ["RAO_S3_ENDPOINT"], "rao", os.environ["AWS_ACCESS_KEY_ID"],
                                     os.environ["AWS_SECRET_ACCESS_KEY"]), "e2e")
    # 1. parameters changed (retention's default: the verified local copy is gone, S3 holds the checkpoint)
    assert not (Path(os.environ["RAO_HOME"]) / "campaigns/e2e/checkpoints/iter-1").exists()
    new = load_file(store.get_file("iter-1/checkpoint/model.safetensors", campaign_env / "iter-1.safetensors"))
    old = load_file(tiny_model_path / "model.safetensors")
    changed = [k for k in old if not (new[k] == old[k]).all()]
    assert changed, "training did not change any parameter"
    # 2. model version with both aliases
    client = mlflow.MlflowClient()
    name = "rao-policy-e2e"  # model.registered_model "rao-policy-{campaign}" of campaign e2e
    cand = client.get_model_version_by_alias(name, "candidate")
    champ = client.get_model_version_by_alias(name, "champion")
    assert str(cand.version) == str(it["register"]["version"]) == str(champ.version)  # first version is also the champion
    assert cand.source.startswith("s3://rao/e2e/iter-1/checkpoint")
    assert cand.tags["rao.iteration"] == "1"
    # 3. S3 objects with valid checksums
    keys = set(store.list())
    for k in ["iter-1/trees/trees.jsonl", "iter-1/trees/scored.jsonl", "iter-1/samples/samples.jsonl",
              "iter-1/validation/report.json", "iter-1/checkpoint/model.safetensors", "iter-1/eval/report.json",
              "iter-1/_done/register.json"]:
        assert k in keys, k
    assert store.verify_manifest("iter-1/checkpoint.manifest.json") == []
    # 4. validation report exists and passed
    report = json.loads(store.get_bytes("iter-1/validation/report.json"))
    assert report["success"] is True and report["tables"]["nodes"]["rows"] > 0
    # 5. one trace per tree, one span per node and one per turn
    from rao_core.tree import read_trees

    trees = read_trees(store.get_file("iter-1/trees/scored.jsonl", campaign_env / "scored.jsonl"))
    assert len(trees) == 4
    exp_id = client.get_experiment_by_name("rao").experiment_id
    run_id = client.search_runs(
        [exp_id],
        filter_string="tags.`rao.campaign` = 'e2e' and tags.`rao.iteration` = '1'")[0].info.run_id
    traces = client.search_traces(locations=[exp_id], run_id=run_id, max_results=50, flush=True)
    assert len(traces) == len(trees)
    by_tree = {t.info.tags.get("rao.tree_id"): t for t in traces}
    for tree in trees:
        assert len(by_tree[tree.tree_id].data.spans) == len(tree.nodes) + sum(len(n.turns) for n in tree.nodes)
    # rewards per node and samples from both successful and failed trees
    assert {t.root.success for t in trees} == {0.0, 1.0}


def test_corrupted_node_table_stops_before_training(campaign_env, tiny_model_path, vllm_tiny, monkeypatch):
    """Pre-seed the judge stage's output with a tree whose node has a missing parent: the iteration
    must fail at validation, attach the report, and never train or register."""
    from flows.campaign import rao_campaign
    from infra.storage import ArtifactStore, S3Settings
    from rao_core.tree import EndReason, ExecutionTree, Node, write_trees

    store = ArtifactStore(S3Settings(os.environ["RAO_S3_ENDPOINT"], "rao", os.environ["AWS_ACCESS_KEY_ID"],
                                     os.environ["AWS_SECRET_ACCESS_KEY"]), "corrupt")

    def tree(i, s, parent="n0"):
        root = Node(node_id="n0", goal="g", token_ids=[1, 2, 3], assistant_mask=[0, 1, 1], behaviour_logprobs=[0, -1, -1],
                    end_reason=EndReason.FINISHED, success=s, reward=s, children=["n1"])
        kid = Node(node_id="n1", parent_id=parent, depth=1, goal="c", token_ids=[1, 2], assistant_mask=[0, 1],
                   behaviour_logprobs=[0, -1], end_reason=EndReason.FINISHED, success=1.0, reward=1.0)
        return ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id="a", group_id="a", rollout_index=i,
                             root_id="n0", nodes=[root, kid])

    bad = write_trees(campaign_env / "bad.jsonl", [tree(0, 1.0), tree(1, 0.0, parent="ghost")])
    up = store.put_file(bad, "iter-1/trees/scored.jsonl")
    store.put_bytes(json.dumps({"trees_uri": up["uri"], "num_trees": 2}).encode(), "iter-1/_done/generate.json")
    store.put_bytes(json.dumps({"scored_uri": up["uri"], "judge": {}}).encode(), "iter-1/_done/judge.json")
    params = _params("corrupt", tiny_model_path, **{"serving.base_url": vllm_tiny.base_url, "serving.switch": "none",
                                                    "eval.enabled": False})
    with pytest.raises(Exception, match="failed validation"):
        rao_campaign(params)
    keys = set(store.list())
    assert "iter-1/validation/report.json" in keys
    report = json.loads(store.get_bytes("iter-1/validation/report.json"))
    assert report["success"] is False and any("parent_exists" in f for f in report["failures"])
    assert "iter-1/_done/validate.json" not in keys
    assert not any(k.startswith("iter-1/checkpoint") for k in keys)
    assert "iter-1/_done/train.json" not in keys


def test_killed_campaign_resumes_without_redoing_work(campaign_env, tiny_model_path, vllm_tiny, s3_server):
    """Kill a campaign process right after its judge stage completed; the re-run resumes at validation."""
    from infra.storage import ArtifactStore, S3Settings

    store = ArtifactStore(s3_server.settings(), "resume")
    # the tiny server keeps its weights ("none"): this test is about resuming, not about on-policy rollouts
    extra = {"serving.base_url": vllm_tiny.base_url, "serving.switch": "none", "eval.enabled": False,
             "trainer.loss_type": "reinforce"}
    ov = [f"--set={k}={json.dumps(v)}" for k, v in {**TINY_OVERRIDES, **extra}.items()]
    cmd = [sys.executable, "-m", "rao_cli.main", "run", "--name", "resume", "--iterations", "1",
           f"--set=model.path={json.dumps(str(tiny_model_path))}", *ov]
    env = dict(os.environ)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900
    try:
        while not store.exists("iter-1/_done/judge.json"):
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "campaign did not reach the judge stage"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    assert not store.exists("iter-1/_done/train.json")
    head = store.client.head_object(Bucket="rao", Key="resume/iter-1/trees/trees.jsonl")
    from flows.campaign import rao_campaign

    params = _params("resume", tiny_model_path, **extra)
    summary = rao_campaign(params)
    # generate/judge were not redone: the trees object is the same one, and the re-run finished the iteration
    head2 = store.client.head_object(Bucket="rao", Key="resume/iter-1/trees/trees.jsonl")
    assert head2["LastModified"] == head["LastModified"] and head2["ETag"] == head["ETag"]
    assert store.exists("iter-1/_done/train.json") and store.exists("iter-1/_done/register.json")
    assert summary["iterations"][0]["times"].get("generate") is not None
    assert json.loads(store.get_bytes("iter-1/_done/generate.json"))["num_trees"] == 4


def test_nightly_evaluation_pairs_the_champion_on_the_same_tasks(campaign_env, tiny_model_path, vllm_tiny, monkeypatch):
    """Candidate = champion (one version): the champion has no stored evaluation, so the nightly evaluates it in
    the same run on the same tasks, decides by the paired test (the old rule compared the candidate's
    point estimate with the champion's tag), says they are one checkpoint, and stores both outcome sets.
    A worse candidate failing is tests/pipeline/test_nightly_decision.py (a seeded fake evaluation)."""
    import mlflow

    from flows.evaluate import EvaluateParams, SuiteEntry, rao_evaluate
    from infra.tracking import configure_mlflow
    from tasks import tracking

    monkeypatch.setenv("RAO_POLICY_BASE_URL", vllm_tiny.base_url)  # evaluate on the running tiny server
    configure_mlflow()
    exp = mlflow.create_experiment("rao", artifact_location=(campaign_env / "art").as_uri())
    run = mlflow.MlflowClient().create_run(exp).info.run_id
    version = tracking.register_version("rao-policy-smoke", str(tiny_model_path), run,
                                        {"eval/recursive/easy/success": 1.0})
    assert tracking.promote("rao-policy-smoke", version, 1.0, "eval/recursive/easy/success")
    params = EvaluateParams(model="candidate", tolerance=0.1, name="nightly-test",
                            suite=[SuiteEntry(env="textcraft-synth", difficulties=["easy"], n_tasks=2,
                                              modes=["recursive"])])
    out = rao_evaluate(params)
    (row,) = out["comparison"]
    assert (row["metric"], row["n"], row["status"], row["same_checkpoint"], row["champion_from"]) == (
        "eval/textcraft/recursive/easy/success", 2, "ok", f"v{version}", "this run")
    runs = mlflow.MlflowClient().search_runs([exp], filter_string="tags.`rao.kind` = 'evaluation'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    stored = mlflow.artifacts.load_dict(f"runs:/{runs[0].info.run_id}/evaluation.json")["outcomes"]
    m = "eval/textcraft/recursive/easy/success"
    assert len(stored["candidate"][m]) == 2 and set(stored["champion"][m]) == set(stored["candidate"][m])
