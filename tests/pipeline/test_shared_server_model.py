"""A shared policy server (``rao services up --model M``: every campaign gets ``RAO_POLICY_BASE_URL``) never silently
serves a campaign another model: a campaign that would need its own checkpoints on it (a warm start, iterations)
is refused before anything starts, with one line naming the server's model; at each switch the served model is
checked against the checkpoint (name, and the weights' sha256 where the folder is readable). Before: a
warm-started campaign's iteration-1 trees came from M while the registry said v1, and nothing was said."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from infra.process import ServiceError


@pytest.fixture
def shared_server(tmp_path, monkeypatch):
    """A stand-in for `rao services up --model M`: /v1/models lists 'shared-m' from folder M."""
    m = tmp_path / "M"
    m.mkdir()
    (m / "config.json").write_text("{}")
    (m / "model.safetensors").write_bytes(b"weights of M")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            body = json.dumps({"object": "list", "data": [{"id": "shared-m", "root": str(m)}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    monkeypatch.setenv("RAO_POLICY_BASE_URL", url)
    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    yield url, m
    srv.shutdown()


def _cfg(model: Path, **over):
    from rao_core.config import load_config

    return load_config("configs/cpu-smoke.yaml", {"model.path": str(model), "serving.served_model_name": "shared-m",
                                                  **over}).with_env_overrides()


def test_a_warm_started_campaign_on_a_shared_server_is_refused_in_one_line(shared_server, tiny_model_path):
    from flows.campaign import CampaignParams
    from rao_cli import InputError
    from rao_cli.pipeline_cmd import checked_run_inputs

    url, m = shared_server
    params = CampaignParams(config="configs/cpu-smoke.yaml", name="warm", model_path=str(tiny_model_path))
    with pytest.raises(InputError) as e:
        checked_run_inputs(params)  # rao run: before any service, flow run or process starts (exit 2)
    assert str(e.value) == (
        f"the policy server at {url} (RAO_POLICY_BASE_URL: the policy server of `rao services up --model`) serves "
        f"'shared-m' from {m}, not this campaign's checkpoints: this campaign warm-starts a checkpoint of its own "
        "(warm_start.mode demos), which that server cannot load (serving.switch reload: full weights); stop it "
        "(`rao services down`) or unset RAO_POLICY_BASE_URL so that the campaign starts its own server, or set "
        "serving.switch lora (LoRA adapters) or none (sample that server's model on purpose)")


def test_only_a_campaign_that_keeps_the_served_weights_passes(shared_server, tmp_path):
    from infra.serving_pool import check_external_server

    url, m = shared_server
    with pytest.raises(ServiceError, match=r"its 2 iteration\(s\) train new checkpoints"):
        check_external_server(_cfg(m, **{"warm_start.mode": "none"}))
    copy = tmp_path / "copy-of-M"
    shutil.copytree(m, copy)
    check_external_server(_cfg(copy, **{"warm_start.mode": "none", "iterations": 0}))  # the same weights: served
    (copy / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(ServiceError, match=r"serves 'shared-m' from .*M, not this campaign's checkpoints: this "
                                           r"campaign's checkpoint is model.path .*copy-of-M"):
        check_external_server(_cfg(copy, **{"warm_start.mode": "none", "iterations": 0}))
    check_external_server(_cfg(copy, **{"serving.switch": "none", "serving.base_url": url, "iterations": 0}))


def test_each_switch_checks_the_served_model_against_the_checkpoint(shared_server, tmp_path):
    from infra.serving_pool import ServingPool

    url, m = shared_server
    cfg = _cfg(m, **{"warm_start.mode": "none", "iterations": 0})
    out = ServingPool().serve(cfg, "iter-0", m, work_dir=tmp_path)
    assert (out.model, out.base_url, out.how) == ("shared-m", url, "external")
    other = tmp_path / "iter-1"
    shutil.copytree(m, other)
    (other / "model.safetensors").write_bytes(b"trained weights")
    with pytest.raises(ServiceError, match=rf"the policy server at {url} .* serves 'shared-m' from {m}, not "
                                           rf"checkpoint iter-0 \('shared-m' from {other}\); refused"):
        ServingPool().serve(cfg, "iter-0", other, work_dir=tmp_path)
