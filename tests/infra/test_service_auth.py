"""The local services are the owner's alone: each refuses a request on loopback that lacks the installation's
credential, the credential is made per installation, and every file holding one is mode 0600."""

from __future__ import annotations

import os
import socket
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

RAO = [sys.executable, "-m", "rao_cli.main"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(Path(path).stat().st_mode)


def _in_home(home: Path, code: str) -> str:
    """Run ``code`` in a fresh interpreter whose RAO_HOME is ``home``; returns its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAO_POLICY", "RAO_S3"))}
    env["RAO_HOME"] = str(home)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


def test_the_secret_is_made_once_per_installation_mode_0600_and_differs_between_two(tmp_path):
    code = ("from infra.credentials import secret_path, service_secret; "
            "print(service_secret('s3'), service_secret('prefect'), service_secret('vllm'), secret_path())")
    a1, a2 = _in_home(tmp_path / "a", code).split(), _in_home(tmp_path / "a", code).split()
    b = _in_home(tmp_path / "b", code).split()
    assert a1 == a2  # made once, then reused
    assert a1[:3] != b[:3] and not set(a1[:3]) & set(b[:3])  # another installation, other credentials
    assert len(set(a1[:3])) == 3  # one per service
    assert "rao-local-secret" not in a1
    for home in ("a", "b"):
        key = tmp_path / home / "secrets" / "installation.key"
        assert Path(a1[3] if home == "a" else b[3]) == key
        assert _mode(key) == 0o600 and _mode(key.parent) == 0o700


def test_write_private_never_makes_a_readable_file(tmp_path, monkeypatch):
    from infra.credentials import write_private

    old = os.umask(0)  # even with a permissive umask
    try:
        p = write_private(tmp_path / "x" / "secret.json", "{}")
    finally:
        os.umask(old)
    assert _mode(p) == 0o600 and p.read_text() == "{}"
    assert [f.name for f in p.parent.iterdir()] == ["secret.json"]  # no temporary file left


def test_the_services_state_file_is_mode_0600(tmp_path, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    from infra.services import record, state_path

    record("s3", pid=1, env={"AWS_SECRET_ACCESS_KEY": "x"})
    assert _mode(state_path()) == 0o600


def test_ray_token_file_is_made_mode_0600_and_a_readable_one_is_tightened(tmp_path, monkeypatch):
    from infra.services import ensure_ray_token

    monkeypatch.setenv("HOME", str(tmp_path))
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    ensure_ray_token()
    token = tmp_path / ".ray" / "auth_token"
    assert _mode(token) == 0o600 and len(token.read_text()) == 64
    assert _mode(token.parent) == 0o700
    token.chmod(0o644)
    ensure_ray_token()
    assert _mode(token) == 0o600


def test_prefect_credentials_go_to_the_installations_own_apis_only(tmp_path):
    """The ephemeral API (no PREFECT_API_URL) and the recorded server get the auth string; a PREFECT_API_URL of
    the user's choosing (another server, Prefect Cloud) does not."""
    code = ("import os, json; from infra.orchestration import configure_prefect, prefect_auth; configure_prefect(); "
            "print(json.dumps([os.environ.get('PREFECT_SERVER_API_AUTH_STRING') == prefect_auth(), "
            "os.environ.get('PREFECT_API_AUTH_STRING') == prefect_auth()]))")
    assert _in_home(tmp_path, code) == "[true, true]"
    other = ("import os; os.environ['PREFECT_API_URL'] = 'http://127.0.0.1:9/api'; " + code)
    assert _in_home(tmp_path, other) == "[true, false]"
    own = ("import os; from infra.services import record; "
           "record('prefect', pid=os.getpid(), api_url='http://127.0.0.1:4242/api'); "
           "os.environ['PREFECT_API_URL'] = 'http://127.0.0.1:4242/api'; " + code)
    assert _in_home(tmp_path, own) == "[true, true]"
    cmd = _in_home(tmp_path, "import os; from infra.services import record; from infra.orchestration import "
                             "worker_command; record('prefect', pid=os.getpid(), api_url='http://127.0.0.1:4242/api');"
                             " print(worker_command('http://127.0.0.1:4242/api'))")
    auth_file = tmp_path / "secrets" / "prefect"
    assert f'PREFECT_API_AUTH_STRING="$(cat {auth_file})"' in cmd and _mode(auth_file) == 0o600
    assert auth_file.read_text() not in cmd


def test_vllm_is_started_with_the_key_in_its_environment_not_on_its_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    monkeypatch.delenv("RAO_POLICY_API_KEY", raising=False)
    from infra.credentials import service_secret
    from infra.serving import VLLMServer

    srv = VLLMServer(tmp_path / "m", on_gpu=False)
    assert len(srv.api_key) == 64 and srv.api_key != service_secret("vllm")  # this process's own key
    assert os.environ["RAO_POLICY_API_KEY"] == srv.api_key  # for its children and Ray workers
    assert srv._env()["VLLM_API_KEY"] == srv.api_key
    assert srv._env()["VLLM_SERVER_DEV_MODE"] == "0"  # the development routes are off unless asked
    assert VLLMServer(tmp_path / "m", on_gpu=False, dev_mode=True)._env()["VLLM_SERVER_DEV_MODE"] == "1"
    other = _in_home(tmp_path, "from infra.serving import VLLMServer; print(VLLMServer('m', on_gpu=False).api_key)")
    assert len(other) == 64 and other != srv.api_key  # another process (another campaign): another key
    assert srv.api_key not in " ".join(srv._cmd()) and srv.api_key not in repr(srv)
    assert srv.headers == {"Authorization": f"Bearer {srv.api_key}"}
    cmd = srv._cmd()
    assert cmd[cmd.index("--middleware") + 1] == "rao_vllm_auth.RequireKey"
    assert srv._env()["PYTHONPATH"].split(os.pathsep)[0] == str(Path("infra/vllm_plugins").resolve())


def test_the_installations_policy_key_goes_to_its_own_servers_only(monkeypatch):
    """The installation's vLLM key (``RAO_POLICY_API_KEY``) reaches the pipeline's own servers (started by the
    pool: ``own``; ``RAO_POLICY_BASE_URL``; a server this process started gets the key it was started with) and
    never another server, on loopback or not, which gets the variable ``serving.api_key_env`` /
    ``judge.api_key_env`` names; the request headers are checked, not only the function."""
    import asyncio

    import httpx as _httpx

    from rao_core.policies.openai_policy import bind_server_key, policy_client_key, unbind_server_key
    from rao_core.judge.client import make_client
    from rao_core.judge.config import JudgeConfig
    from rao_core.policies.openai_policy import OpenAIPolicy
    from rao_core.policies.pool import PolicyPool

    monkeypatch.setenv("RAO_POLICY_API_KEY", "installation-key")
    monkeypatch.setenv("RAO_POLICY_BASE_URL", "http://10.0.0.5:8000/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "provider-key")
    monkeypatch.delenv("MY_KEY", raising=False)
    ext = "https://api.example.com/v1"
    assert policy_client_key(ext) == "provider-key"
    assert policy_client_key(ext, key_env="MY_KEY") == "EMPTY"  # unset: nothing of ours instead
    assert policy_client_key("http://127.0.0.1:8123/v1") == "provider-key"  # loopback is not ours by itself
    bind_server_key("http://127.0.0.1:8123/v1", "server-key")  # ... a server this process started is
    try:
        assert policy_client_key("http://localhost:8123/v1/") == "server-key"
        assert policy_client_key("http://127.0.0.1:8124/v1") == "provider-key"
    finally:
        unbind_server_key("http://127.0.0.1:8123/v1")
    assert policy_client_key("http://127.0.0.1:8123/v1") == "provider-key"
    assert policy_client_key("http://10.0.0.5:8000/v1/") == "installation-key"  # `rao services up`'s server
    assert policy_client_key("http://10.0.0.7:8000/v1", own=True) == "installation-key"  # a Ray replica elsewhere
    assert policy_client_key("http://127.0.0.1:8123/v1", own=False) == "provider-key"

    sent: list[tuple[str, str]] = []

    def handler(request: _httpx.Request) -> _httpx.Response:
        sent.append((request.url.host, request.headers.get("authorization", "")))
        return _httpx.Response(401, json={"error": "no"})

    async def ask(client) -> None:
        with pytest.raises(Exception):
            await client.models.list()

    for client in (OpenAIPolicy(ext, "m").client, make_client(JudgeConfig(base_url=ext, model="m"))):
        asyncio.run(ask(client.with_options(http_client=_httpx.AsyncClient(transport=_httpx.MockTransport(handler)),
                                            max_retries=0)))
    pool = PolicyPool.of_endpoints([ext, "http://127.0.0.1:9/v1"], "m",
                                   key=lambda u: policy_client_key(u, key_env="OPENAI_API_KEY"))
    assert [p.client.api_key for p in pool.replicas] == ["provider-key", "provider-key"]
    assert sent == [("api.example.com", "Bearer provider-key")] * 2


def test_the_stages_send_each_server_its_own_key(monkeypatch):
    """Through the serve stage's records: external servers (``serving.base_urls``) get ``serving.api_key_env``'s
    variable, the pool's own replicas the installation's key even on another node's address, and the checkpoint
    switch's model listing of such a replica sends its key too; the Ray workers get the external variable."""
    import infra.serving
    from infra.ray_rollouts import worker_runtime_env
    from infra.serving_pool import ServingPool
    from infra.stage_io import RunContext
    from infra.stage_records import ServedEndpoint
    from rao_core.config import load_config
    from tasks.stages import _policy

    monkeypatch.setenv("RAO_POLICY_API_KEY", "installation-key")
    monkeypatch.delenv("RAO_POLICY_BASE_URL", raising=False)
    monkeypatch.setenv("EXT_KEY", "provider-key")
    urls = ["https://h1.example.com/v1", "https://h2.example.com/v1"]
    cfg = load_config(None, ["name=keys", f"serving.base_urls={urls}", "serving.switch=none",
                             "serving.api_key_env=EXT_KEY"])
    ctx = RunContext(config=cfg, s3={}, mlflow_uri="")
    served = ServingPool()._serve_external(cfg, "iter-0", lambda: None)
    assert served.own is None
    assert [p.client.api_key for p in _policy(ctx, served).replicas] == ["provider-key", "provider-key"]
    own = ServedEndpoint(base_url="http://10.0.0.7:8000/v1", model="policy", own=True)  # a Ray replica elsewhere
    assert [p.client.api_key for p in _policy(ctx, own).replicas] == ["installation-key"]
    assert worker_runtime_env("EXT_KEY")["env_vars"]["EXT_KEY"] == "provider-key"

    seen = []

    class Answer:
        def raise_for_status(self) -> None:
            pass

        def json(self) -> dict:
            return {"data": [{"id": "policy"}]}

    def get(url, timeout, headers):
        seen.append(headers["Authorization"])
        return Answer()

    monkeypatch.setattr(infra.serving.httpx, "get", get)
    assert infra.serving.served_models("http://10.0.0.7:8000/v1", api_key="replica-key") == ["policy"]
    assert infra.serving.served_models("http://10.0.0.7:8000/v1") == ["policy"]
    assert seen == ["Bearer replica-key", "Bearer EMPTY"]  # not ours, and no key variable set: nothing of ours


@pytest.mark.parametrize("name", ["RAO_POLICY_API_KEY", "PYTHONPATH", "my-key"])
def test_an_api_key_env_that_would_leak_or_clobber_is_refused_at_load(name):
    from rao_core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="api_key_env"):
        load_config(None, [f"serving.api_key_env={name}"])
    with pytest.raises(ConfigError, match="api_key_env"):
        load_config(None, [f"judge.api_key_env={name}"])


def test_the_vllm_middleware_guards_every_route_but_the_probes(monkeypatch):
    """vLLM's ``--api-key`` guards ``/v1`` only; the middleware the servers load guards ``/collective_rpc``,
    ``/sleep``, ``/invocations`` and the rest too."""
    import asyncio

    monkeypatch.syspath_prepend(str(Path("infra/vllm_plugins").resolve()))
    monkeypatch.setenv("VLLM_API_KEY", "k1")
    from rao_vllm_auth import RequireKey

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def status(path: str, auth: bytes | None = None, method: str = "POST") -> int:
        out = []

        async def send(message):
            out.append(message)

        headers = [(b"authorization", auth)] if auth is not None else []
        asyncio.run(RequireKey(app)({"type": "http", "method": method, "path": path, "headers": headers}, None, send))
        return out[0]["status"]

    for path in ("/collective_rpc", "/sleep", "/wake_up", "/invocations", "/tokenize", "/v1/completions"):
        assert status(path) == 401 and status(path, b"Bearer k2") == 401 and status(path, b"Basic k1") == 401
        assert status(path, b"Bearer k1") == 200
    assert status("/health", method="GET") == 200 and status("/metrics", method="GET") == 200


def _grpc_answers(port: int) -> bool:
    """True when ``127.0.0.1:port`` speaks gRPC (HTTP/2) to a client without a certificate: in plaintext (the
    server's SETTINGS frame answers the connection preface), or over TLS with no client certificate."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

    def settings(s) -> bool:
        s.sendall(preface)
        head = b""
        while len(head) < 9:
            more = s.recv(9 - len(head))
            if not more:
                return False
            head += more
        return head[3] == 0x04  # an HTTP/2 SETTINGS frame

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            if settings(raw):
                return True
    except OSError:
        pass
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            return settings(s)
    except (ssl.SSLError, OSError):
        return False


@pytest.mark.services
def test_seaweedfs_answers_only_its_authenticated_s3_gateway(tmp_path):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from infra.storage import SeaweedFSServer

    data = tmp_path / "sw"
    srv = SeaweedFSServer(data_dir=data, log_dir=tmp_path).start()
    try:
        c = srv.settings().client()
        c.put_object(Bucket="rao", Key="camp/a.txt", Body=b"secret data")
        assert c.get_object(Bucket="rao", Key="camp/a.txt")["Body"].read() == b"secret data"

        # S3 without a key, and with a wrong one: refused
        assert httpx.get(f"{srv.endpoint_url}/rao?list-type=2", timeout=10).status_code == 403
        assert httpx.get(f"{srv.endpoint_url}/rao/camp/a.txt", timeout=10).status_code == 403
        wrong = boto3.client("s3", endpoint_url=srv.endpoint_url, aws_access_key_id=srv.access_key,
                             aws_secret_access_key="rao-local-secret", region_name="us-east-1",
                             config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
        with pytest.raises(ClientError) as e:
            wrong.list_objects_v2(Bucket="rao")
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

        # the filer's and the master's HTTP APIs are off; the volume server wants a JWT
        p = srv.ports
        for url in (f"http://127.0.0.1:{p['filer']}/buckets/rao/camp/",
                    f"http://127.0.0.1:{p['filer']}/buckets/rao/camp/a.txt",
                    f"http://127.0.0.1:{p['master']}/dir/assign",
                    f"http://127.0.0.1:{p['master']}/vol/status",
                    f"http://127.0.0.1:{p['master']}/col/delete?collection=rao",
                    f"http://127.0.0.1:{p['volume']}/ui/index.html"):
            r = httpx.get(url, timeout=10)
            assert r.status_code in (401, 403, 404), (url, r.status_code, r.text[:200])
            assert b"secret data" not in r.content
        r = httpx.post(f"http://127.0.0.1:{p['filer']}/buckets/rao/camp/evil.txt", files={"file": b"x"}, timeout=10)
        assert r.status_code in (401, 403, 404), r.text[:200]
        r = httpx.post(f"http://127.0.0.1:{p['volume']}/1,01637037d6", files={"file": b"x"}, timeout=10)
        assert r.status_code == 401, r.text[:200]
        r = httpx.get(f"http://127.0.0.1:{p['volume']}/1,01637037d6", timeout=10)
        assert r.status_code in (401, 404), r.text[:200]

        # gRPC takes mutual TLS only
        for name in ("master.grpc", "volume.grpc", "filer.grpc"):
            assert not _grpc_answers(p[name]), name

        # what holds a credential is mode 0600; the old constant is not the key
        assert srv.secret_key != "rao-local-secret"
        for f in ("s3-identities.json", "security.toml", "tls/tls.key"):
            assert _mode(data / f) == 0o600, f
        assert srv.secret_key not in (tmp_path / f"seaweedfs-{srv.s3_port}.log").read_text(errors="replace")

        # the store's own maintenance still works (through weed shell and the certificate)
        c.delete_object(Bucket="rao", Key="camp/a.txt")
        srv.vacuum(settle_s=1.0)
        assert c.list_objects_v2(Bucket="rao").get("KeyCount", 0) == 0
    finally:
        srv.stop()


@pytest.mark.services
def test_prefect_server_refuses_a_request_without_the_auth_string(tmp_path, monkeypatch):
    import base64

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    from infra.orchestration import PrefectServer, prefect_auth

    srv = PrefectServer(log_dir=tmp_path).start()
    try:
        api = srv.api_url
        assert httpx.get(f"{api}/health", timeout=30).status_code == 200  # the probe alone is open
        assert httpx.post(f"{api}/flows/filter", json={}, timeout=30).status_code == 401
        bad = {"Authorization": "Basic " + base64.b64encode(b"rao-local").decode()}
        assert httpx.post(f"{api}/flows/filter", json={}, headers=bad, timeout=30).status_code == 401
        good = {"Authorization": "Basic " + base64.b64encode(prefect_auth().encode()).decode()}
        assert httpx.post(f"{api}/flows/filter", json={}, headers=good, timeout=60).status_code == 200
    finally:
        srv.stop()


@pytest.mark.services
@pytest.mark.timeout(600)
def test_the_ephemeral_prefect_api_takes_the_installations_auth_string(tmp_path):
    """A flow run on the embedded (ephemeral) API: the server each process starts requires the auth string, and
    the process's own client sends it."""
    code = ("from infra.orchestration import configure_prefect; configure_prefect()\n"
            "import os, httpx\n"
            "from prefect import flow\n"
            "from prefect.client.orchestration import get_client\n"
            "@flow\n"
            "def f(): return 42\n"
            "assert f() == 42\n"
            "with get_client(sync_client=True) as c:\n"
            "    url = str(c.api_url).rstrip('/')\n"
            "    print(httpx.post(url + '/flows/filter', json={}, timeout=30).status_code)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(RAO_HOME=str(tmp_path), PREFECT_LOGGING_LEVEL="WARNING")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "401"


@pytest.mark.vllm
def test_vllm_refuses_a_request_without_the_key(vllm_tiny):
    server = vllm_tiny.server
    if server is None:
        pytest.skip("RAO_TEST_VLLM_URL: a server this session did not start")
    base = vllm_tiny.base_url
    assert httpx.get(f"{base}/models", timeout=30).status_code == 401
    assert httpx.get(f"{base}/models", headers={"Authorization": "Bearer EMPTY"}, timeout=30).status_code == 401
    r = httpx.post(f"{base}/completions", json={"model": vllm_tiny.model, "prompt": "hi", "max_tokens": 1},
                   timeout=60)
    assert r.status_code == 401
    assert httpx.get(f"{base}/models", headers=server.headers, timeout=30).status_code == 200
    # beyond /v1 (vLLM's own check): the dev-mode routes and /invocations want the key too
    rpc = httpx.post(f"{server.url}/collective_rpc", json={"method": "reload_weights"}, timeout=60)
    assert rpc.status_code == 401
    assert httpx.post(f"{server.url}/reset_prefix_cache", timeout=60).status_code == 401
    assert httpx.post(f"{server.url}/invocations", json={"model": vllm_tiny.model, "prompt": "hi", "max_tokens": 1},
                      timeout=60).status_code == 401
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    server.reload_weights()  # the pipeline's own calls send the key (collective_rpc, reset_prefix_cache)


@pytest.mark.services
@pytest.mark.timeout(900)
def test_the_printed_worker_command_runs_a_deployment_on_the_authenticated_server(prefect_up, tmp_path):
    """`rao services up --prefect-server` prints a worker command that reads the auth string from its file: pasted
    in a shell, it runs a deployment's flow (a bad config: the flow itself fails, FAILED, not CRASHED); `rao
    deploy` finds the server and authenticates by itself."""
    import base64
    import re

    from prefect.client.base import PrefectHttpxSyncClient

    from tests.infra.prefect_worker import printed_worker, wait_for_flow_run

    env, out, port = prefect_up
    api = f"http://127.0.0.1:{port}/api"
    worker_line = re.search(r"worker: +(.*)", out).group(1)
    assert "PREFECT_API_AUTH_STRING=" in worker_line
    auth_file = Path(re.search(r'\$\(cat (\S+)\)', worker_line).group(1))
    assert _mode(auth_file) == 0o600 and auth_file.read_text() not in out
    assert httpx.post(f"{api}/deployments/filter", json={}, timeout=60).status_code == 401
    r = subprocess.run(RAO + ["deploy"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    headers = {"Authorization": "Basic " + base64.b64encode(auth_file.read_text().encode()).decode()}
    with PrefectHttpxSyncClient(base_url=f"{api}/", timeout=60, headers=headers) as client:
        deps = {d["name"]: d for d in client.post("deployments/filter", json={}).json()}
        fr = client.post(f"deployments/{deps['campaign']['id']}/create_flow_run",
                         json={"parameters": {"params": {"config": "configs/no-such-config.yaml"}}}).json()
        with printed_worker(worker_line, env, tmp_path) as worker_log:
            run = wait_for_flow_run(client, fr["id"], timeout_s=300)
    log = worker_log.read_text()[-3000:]
    assert run["state"]["type"] == "FAILED", log
    assert "no-such-config.yaml" in run["state"]["message"], run["state"]["message"]
