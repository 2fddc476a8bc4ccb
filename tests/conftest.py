"""Shared fixtures: real services started once per test session.

- ``vllm_tiny``: a vLLM OpenAI server on the tiny random model (2-3 minutes to start on CPU). Set
  ``RAO_TEST_VLLM_URL`` (+ ``RAO_TEST_VLLM_MODEL``, ``RAO_TEST_VLLM_MODEL_PATH``, and ``RAO_POLICY_API_KEY`` when
  it requires a key) to reuse a running one; ``.api_key`` is the key to send it.
- ``s3_server``: SeaweedFS on loopback with a bucket; ``mlflow_uri``: SQLite tracking in a temp folder;
  ``prefect_harness``: one session-wide Prefect test harness.
Tests needing them are marked ``vllm`` / ``services``; ``-m "not vllm"`` skips the slow ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One vLLM compile cache for the whole suite (infra.serving: $RAO_HOME/cache/vllm otherwise): tests that start
# servers under a temporary RAO_HOME reuse the graphs compiled by the first instead of compiling again.
os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(__file__).resolve().parent.parent / "var" / "cache" / "vllm"))


#: Free disk the whole suite needs beyond the embedded S3 store's floor (infra.disk.seaweedfs_floor_bytes): its
#: checkpoints, vLLM's compile cache and the temporary folders of one session (pytest keeps three sessions'). Seen
#: 2026-12-04: 2.8 GB of temporary folders a third of the way through `make test`. Env RAO_TEST_DISK_GB sets it
#: (GiB; 0 turns the check off), e.g. for a few unit tests on a small disk.
SUITE_NEEDS_BYTES = 4 << 30


def pytest_sessionstart(session):
    """Stop at once (exit 1, the reason starting ``error:``) when the disk is too full for the suite: under
    SeaweedFS's floor every S3 write fails after boto3's retries, and a CI run of such failures ran past its 90
    minutes (2026-12-04). Checked: the temporary folders' disk (``--basetemp``, else TMPDIR's) and $RAO_HOME's."""
    import tempfile

    from infra.disk import free_bytes, human_bytes, seaweedfs_floor_bytes
    from rao_core.paths import rao_home

    try:
        extra = int(float(os.environ.get("RAO_TEST_DISK_GB", SUITE_NEEDS_BYTES / (1 << 30))) * (1 << 30))
    except ValueError:
        pytest.exit(f"error: RAO_TEST_DISK_GB={os.environ['RAO_TEST_DISK_GB']!r} is not a number of GiB (0 turns "
                    "the disk check off)", returncode=1)
    if extra <= 0:
        return
    tmp = Path(session.config.option.basetemp or tempfile.gettempdir())
    for what, where in (("the temporary folders (--basetemp, TMPDIR)", tmp),
                        ("RAO_HOME", rao_home())):
        free, total = free_bytes(where)
        need = seaweedfs_floor_bytes(total) + extra
        if free < need:
            pytest.exit(f"error: {what} {where}: its disk has {human_bytes(free)} free of {human_bytes(total)}; the "
                        f"tests need {human_bytes(need)} ({human_bytes(extra)} for their files, 1% of the disk for "
                        "the embedded S3 store, which makes every volume read-only under that): free space, point "
                        "it at a disk with room, or set RAO_TEST_DISK_GB", returncode=1)


@pytest.fixture(scope="session", autouse=True)
def _ray_token_of_the_session(tmp_path_factory):
    """Ray's auth token for the tests' heads in a temporary file (``RAY_AUTH_TOKEN_PATH``), not the user's
    ``~/.ray/auth_token``, which ``infra.services.ensure_ray_token`` would otherwise create and leave behind.
    A token the environment already gives is kept."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        yield
        return
    import secrets

    token = tmp_path_factory.mktemp("ray") / "auth_token"
    token.write_text(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    try:
        yield
    finally:
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)


@dataclass
class ServedModel:
    """What a test needs to talk to a served model."""

    base_url: str
    model: str
    model_path: Path
    server: object | None = None
    #: The key the server requires (``Authorization: Bearer``): the started server's own, else the one this
    #: process sends to a policy server (``rao_core.policies.openai_policy.policy_client_key``).
    api_key: str = "EMPTY"


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from infra.models import require_model
    from rao_core.paths import tiny_model_path as p

    return require_model(p())


@pytest.fixture(scope="session")
def tiny() -> Path:
    """The tiny random Llama checkpoint for trainer tests; skips (instead of failing) when it is missing."""
    from rao_core.paths import tiny_model_path as p

    path = p()
    if not (path / "config.json").exists():
        pytest.skip(f"{path} missing (run `make setup`)")
    return path


@pytest.fixture(scope="session")
def vllm_tiny(tmp_path_factory, tiny_model_path):
    url = os.environ.get("RAO_TEST_VLLM_URL")
    if url:
        from rao_core.policies.openai_policy import policy_client_key

        yield ServedModel(url, os.environ.get("RAO_TEST_VLLM_MODEL", "policy"),
                          Path(os.environ.get("RAO_TEST_VLLM_MODEL_PATH", tiny_model_path)),
                          api_key=os.environ.get("RAO_POLICY_API_KEY") or policy_client_key(url))
        return
    from infra.serving import VLLMServer

    # Serve a private copy so tests that reload weights never touch the shared model folder.
    import shutil

    served = tmp_path_factory.mktemp("served") / "tiny"
    shutil.copytree(tiny_model_path, served)
    server = VLLMServer(served, served_model_name="policy", max_model_len=4096, dtype="float32", dev_mode=True,
                        log_dir=tmp_path_factory.mktemp("vllm-logs"))  # fp32: exact log-prob checks; reloads
    server.start()
    try:
        yield ServedModel(server.base_url, server.model, served, server, api_key=server.api_key)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One Prefect test harness (temporary SQLite API) for the whole session."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """SeaweedFS on loopback with bucket ``rao``; yields the server (``.settings()``, ``.endpoint_url``)."""
    from infra.storage import SeaweedFSServer

    srv = SeaweedFSServer(data_dir=tmp_path_factory.mktemp("seaweedfs"), log_dir=tmp_path_factory.mktemp("sw-logs"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
