"""Embedded services: real SeaweedFS (with multipart), MLflow, Prefect, vLLM, and clean shutdown."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from infra.process import pid_alive


@pytest.mark.services
def test_seaweedfs_roundtrip_with_multipart(tmp_path):
    from infra.storage import ArtifactStore, SeaweedFSServer

    srv = SeaweedFSServer(data_dir=tmp_path / "sw", log_dir=tmp_path).start()
    try:
        store = ArtifactStore(srv.settings(), "camp")
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(20 << 20))  # 20 MiB > 8 MiB threshold -> multipart upload
        entry = store.put_file(big, "iter-0/big.bin")
        small = store.put_bytes(b"hello", "iter-0/small.txt")
        # boto3 marks multipart objects with an ETag ending in "-<parts>"
        head = store.client.head_object(Bucket="rao", Key="camp/iter-0/big.bin")
        assert head["ETag"].strip('"').endswith("-3")
        out = store.get_file("iter-0/big.bin", tmp_path / "back.bin")
        assert out.read_bytes() == big.read_bytes()
        assert store.get_bytes("iter-0/small.txt") == b"hello"
        assert sorted(store.list("iter-0/")) == ["iter-0/big.bin", "iter-0/small.txt"]
        store.write_manifest("iter-0/manifest.json", [entry, small])
        assert store.verify_manifest("iter-0/manifest.json") == []
        store.put_bytes(b"tampered", "iter-0/small.txt")  # new checksum metadata != manifest
        assert store.verify_manifest("iter-0/manifest.json") == [f"checksum mismatch {small['uri']}"]
        pid = srv.pid
    finally:
        srv.stop()
    assert not pid_alive(pid)


@pytest.mark.services
def test_a_second_seaweedfs_on_the_same_store_says_it_is_in_use(tmp_path):
    """A second `rao` command during a campaign started its own SeaweedFS on the same folder and reported only
    ``seaweedfs exited with code 255 during start-up``; the cause (the filer's lock) is now the message."""
    from infra.process import ServiceError
    from infra.storage import SeaweedFSServer

    first = SeaweedFSServer(data_dir=tmp_path / "sw", log_dir=tmp_path).start()
    try:
        with pytest.raises(ServiceError) as e:
            SeaweedFSServer(data_dir=tmp_path / "sw", log_dir=tmp_path).start()
        assert str(e.value).startswith(f"the embedded S3 store {tmp_path / 'sw'} is in use by another process")
        assert "\n" not in str(e.value) and "rao services up" in str(e.value)
        assert first.settings().client().head_bucket(Bucket="rao")  # the first one still serves
    finally:
        first.stop()


@pytest.mark.services
def test_mlflow_sqlite_log_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    import mlflow

    from infra.tracking import configure_mlflow, ensure_experiment

    uri = configure_mlflow()
    assert uri == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    exp = ensure_experiment("t")
    with mlflow.start_run(experiment_id=exp) as run:
        mlflow.log_param("G", 4)
        mlflow.log_metric("reward/depth_0", 0.5, step=1)
    got = mlflow.MlflowClient().get_run(run.info.run_id)
    assert got.data.params["G"] == "4"
    assert got.data.metrics["reward/depth_0"] == 0.5


@pytest.mark.services
def test_services_cli_up_status_down_leaves_nothing(tmp_path):
    env = {**os.environ, "RAO_HOME": str(tmp_path)}
    env.pop("RAO_S3_ENDPOINT", None)
    rao = [sys.executable, "-m", "rao_cli.main"]
    r = subprocess.run(rao + ["services", "up"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    from infra import services

    os.environ["RAO_HOME"], old = str(tmp_path), os.environ.get("RAO_HOME")
    try:
        state = services.load_state()
        pid = state["s3"]["pid"]
        assert pid_alive(pid)
        r = subprocess.run(rao + ["services", "status"], env=env, capture_output=True, text=True, timeout=60)
        assert "s3" in r.stdout and "running" in r.stdout
        r = subprocess.run(rao + ["services", "down"], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "s3" in r.stdout
        assert not pid_alive(pid)
        assert services.load_state() == {}
    finally:
        if old is None:
            os.environ.pop("RAO_HOME")
        else:
            os.environ["RAO_HOME"] = old


@pytest.mark.services
@pytest.mark.timeout(900)
def test_services_up_ray_starts_a_head_that_backend_ray_finds_and_down_stops_it(tmp_path):
    """``rao services up --ray`` starts a local Ray head with the CPUs and object store asked for; a
    process that takes the services' environment (as ``rao run`` does) joins it with ``execution.ray_address:
    auto``; ``rao services down`` stops every process of the head's group."""
    import json
    import tempfile
    from pathlib import Path

    from infra.process import group_members

    env = {**os.environ, "RAO_HOME": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    rao = [sys.executable, "-m", "rao_cli.main"]
    r = subprocess.run(rao + ["services", "up", "--no-s3", "--ray", "--ray-cpus", "1"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    state = json.loads((tmp_path / "services" / "state.json").read_text())
    pid = None
    try:
        info = state["ray"]
        pid = info["pid"]
        assert info["env"]["RAY_ADDRESS"] == info["url"] and info["url"].startswith("127.0.0.1:")
        assert (info["cpus"], info["object_store_gib"]) == (1, 1.0)
        assert len(group_members(pid)) >= 3  # ray start --block, the GCS and the raylet
        code = ("import json; from infra.services import apply_service_env; apply_service_env(); "
                "from infra.ray_rollouts import connect; print(json.dumps(connect('auto')))")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert (res["CPU"], res["object_store_memory"]) == (1.0, 2 ** 30)
    finally:
        r = subprocess.run(rao + ["services", "down"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ray" in r.stdout, r.stdout + r.stderr
    assert pid is not None and not pid_alive(pid) and group_members(pid) == []
    note = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"  # 'auto' no longer finds the stopped head
    assert not note.exists() or not note.read_text().strip().endswith(info["url"].rsplit(":", 1)[-1])


@pytest.mark.vllm
def test_vllm_chat_completion_with_token_ids_and_logprobs(vllm_tiny):
    from openai import OpenAI

    client = OpenAI(base_url=vllm_tiny.base_url, api_key=vllm_tiny.api_key)
    r = client.chat.completions.create(
        model=vllm_tiny.model, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
        logprobs=True, temperature=1.0, extra_body={"return_token_ids": True},
    )
    choice = r.choices[0]
    d = r.model_dump()
    prompt_ids = d.get("prompt_token_ids")
    token_ids = d["choices"][0].get("token_ids")
    assert prompt_ids and all(isinstance(i, int) for i in prompt_ids)
    assert token_ids and len(token_ids) == len(choice.logprobs.content)
    assert all(lp.logprob <= 0.0 for lp in choice.logprobs.content)


@pytest.mark.services
def test_trivial_prefect_flow_runs(prefect_harness):
    from prefect import flow, task

    @task
    def double(x: int) -> int:
        return 2 * x

    @flow
    def tiny(n: int) -> int:
        return sum(double(i) for i in range(n))

    assert tiny(4) == 12  # 2 * (0 + 1 + 2 + 3)
