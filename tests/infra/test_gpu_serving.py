"""The paper's setting on GPUs, checked on CPU: the LoRA rank vLLM is started with, the GPU
placement in the vLLM command, and an external policy server that gets each new LoRA adapter through its API
or is refused."""

from __future__ import annotations

import pytest

from rao_core.config import ConfigError, load_config

GPU8 = "configs/gpu-qwen3-4b.yaml"
GPU1 = "configs/gpu-qwen3-4b-1gpu.yaml"


def _cfg(path=GPU8, *overrides):
    return load_config(path, list(overrides), check_paths=False)  # the model lives on the GPU machine


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


# --- 1. --max-lora-rank follows trainer.lora.r -------------------------------------------------------------

def test_vllm_max_lora_rank_is_the_smallest_accepted_rank_holding_r():
    from infra.serving import vllm_max_lora_rank

    # vLLM accepts 1, 8, 16, 32, 64, 128, 256, 320, 512 only
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 16, 17, 64, 65, 300, 512)] == \
        [1, 8, 8, 16, 16, 32, 64, 128, 320, 512]
    with pytest.raises(ValueError, match="up to 512"):
        vllm_max_lora_rank(513)


def test_the_served_lora_rank_follows_the_trainer(tmp_path):
    from infra.serving import server_from_config

    cmd = server_from_config(_cfg(), tmp_path, on_gpu=True)._cmd()  # trainer.lora.r = 64 in the GPU config
    assert "--enable-lora" in cmd and _flag(cmd, "--max-lora-rank") == "64"  # was a fixed 16
    cmd = server_from_config(_cfg(GPU8, "trainer.lora.r=20"), tmp_path, on_gpu=True)._cmd()
    assert _flag(cmd, "--max-lora-rank") == "32"


def test_gpu_placement_reaches_the_vllm_command_and_environment(tmp_path):
    from infra.serving import server_from_config

    srv = server_from_config(_cfg(), tmp_path, on_gpu=True)
    cmd, env = srv._cmd(), srv._env()
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert _flag(cmd, "--data-parallel-size") == "4" and "--tensor-parallel-size" not in cmd  # TP 1: no flag
    assert _flag(cmd, "--gpu-memory-utilization") == "0.9" and _flag(cmd, "--dtype") == "auto"
    assert "--enable-sleep-mode" not in cmd  # serving and training GPUs are disjoint
    one = server_from_config(_cfg(GPU1), tmp_path, on_gpu=True)
    assert one._env()["CUDA_VISIBLE_DEVICES"] == "0" and "--enable-sleep-mode" in one._cmd()
    assert _flag(one._cmd(), "--gpu-memory-utilization") == "0.85"


def test_the_cpu_config_gets_no_gpu_flags(tmp_path):
    from infra.serving import VLLMServer, server_from_config

    cfg = load_config("configs/cpu-smoke.yaml", check_paths=False)
    srv = server_from_config(cfg, tmp_path, on_gpu=False)
    s = cfg.serving
    plain = VLLMServer(tmp_path, served_model_name=s.served_model_name, max_model_len=s.max_model_len,
                       kv_cache_gib=s.kv_cache_gib, extra_args=list(s.extra_args), logprobs_mode=s.logprobs_mode,
                       dtype=s.dtype, on_gpu=False)
    assert srv._cmd() == plain._cmd()  # the CPU command did not change
    assert "CUDA_VISIBLE_DEVICES" not in srv._env()


def test_parallelism_has_one_source():
    with pytest.raises(ConfigError, match="serving.extra_args has --tensor-parallel-size"):
        _cfg(GPU8, 'serving.extra_args=["--tensor-parallel-size", "2"]')
    with pytest.raises(ConfigError, match=r"gpus.serve has 4 GPUs but .* = 1 x 2 = 2"):
        _cfg(GPU8, "serving.data_parallel_size=2")
    with pytest.raises(ConfigError, match="must be distinct"):
        _cfg(GPU8, "gpus.train=[4, 4, 5, 6]")


# --- 2. an external policy server gets the new weights, or the config refuses --------------------------------

def test_an_external_server_with_full_weight_switching_is_refused_at_load():
    with pytest.raises(ConfigError, match="serving.base_url is set with serving.switch 'reload': new full weights "
                                          "cannot be sent to an external server"):
        load_config("configs/cpu-smoke.yaml", ["serving.base_url=http://h:8000/v1"], check_paths=False)
    with pytest.raises(ConfigError, match="switch 'restart'"):
        load_config("configs/cpu-smoke.yaml", ["serving.base_url=http://h/v1", "serving.switch=restart"],
                    check_paths=False)
    # accepted: no iterations (evaluation only), a fixed policy said out loud, LoRA through the API
    assert load_config("configs/cpu-smoke.yaml", ["serving.base_url=http://h/v1", "iterations=0"], check_paths=False)
    assert load_config("configs/cpu-smoke.yaml", ["serving.base_url=http://h/v1", "serving.switch=none"],
                       check_paths=False).serving.switch == "none"
    assert _cfg(GPU8, "serving.base_url=http://h/v1").serving.switch == "lora"
    with pytest.raises(ConfigError, match="switch 'none' needs serving.base_url"):
        load_config("configs/cpu-smoke.yaml", ["serving.switch=none"], check_paths=False)


class _LoraServer:
    """A loopback HTTP server that records ``POST /v1/load_lora_adapter`` bodies."""

    def __enter__(self):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posts: list[tuple[str, dict]] = []
        posts = self.posts

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else {}
                posts.append((self.path, body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()


def _ctx(cfg):
    from infra.stage_io import RunContext

    return RunContext(config=cfg, s3={"endpoint_url": "http://127.0.0.1:9", "bucket": "rao"}, mlflow_uri="")


def test_an_external_server_gets_each_lora_adapter_through_its_api(tmp_path):
    from tasks import serve
    from infra.stage_records import Checkpoint

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    adapter = tmp_path / "iter-1"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    serve.shutdown_server()
    with _LoraServer() as srv:
        ctx = _ctx(_cfg(GPU8, f"serving.base_url={srv.base_url}"))
        first = serve.serve_checkpoint.fn(ctx, Checkpoint(name="iter-0", local=str(base)))
        out = serve.serve_checkpoint.fn(ctx, Checkpoint(name="iter-1", local=str(adapter)))
    serve.shutdown_server()
    assert first.model == "policy" and srv.posts == [
        ("/v1/load_lora_adapter", {"lora_name": "iter-1", "lora_path": str(adapter.resolve()), "load_inplace": True})]
    assert (out.model, out.how, out.base_url) == ("iter-1", "external-lora", srv.base_url)


def test_an_external_server_from_the_environment_is_checked_at_each_full_weight_switch(tmp_path, monkeypatch):
    """Its first switch is no longer taken on trust: what it serves is asked (here nothing answers), and a switch
    to new full weights is refused (tests/pipeline/test_shared_server_model.py: a server that answers)."""
    from infra.process import ServiceError
    from tasks import serve
    from infra.stage_records import Checkpoint

    monkeypatch.setenv("RAO_POLICY_BASE_URL", "http://127.0.0.1:9/v1")  # set after the config was validated
    cfg = load_config("configs/cpu-smoke.yaml", check_paths=False).with_env_overrides()
    serve.shutdown_server()
    ctx = _ctx(cfg)
    with pytest.raises(ServiceError, match="http://127.0.0.1:9/v1 did not list the models it serves"):
        serve.serve_checkpoint.fn(ctx, Checkpoint(name="iter-0", local=str(tmp_path)))
    with pytest.raises(ServiceError, match="new full weights cannot be sent to an external server"):
        serve.serve_checkpoint.fn(ctx, Checkpoint(name="iter-1", local=str(tmp_path)))
    serve.shutdown_server()


def test_vllm_sleeps_while_the_trainer_shares_its_gpus(tmp_path, monkeypatch):
    """gpus.sleep_while_training: POST /sleep?level=1 before the body, /wake_up (and a prefix-cache reset) after,
    also when the body fails; without it, nothing is sent."""
    from infra.serving import VLLMServer
    from tasks import serve

    monkeypatch.setattr(VLLMServer, "alive", lambda self: True)
    with _LoraServer() as srv:
        server = VLLMServer(tmp_path, port=int(srv.base_url.split(":")[2].split("/")[0]))
        monkeypatch.setattr(serve.POOL, "servers", [server])
        with serve.gpus_released(_ctx(_cfg(GPU1))):
            assert [p for p, _ in srv.posts] == ["/sleep?level=1"]
        assert [p for p, _ in srv.posts] == ["/sleep?level=1", "/wake_up", "/reset_prefix_cache"]
        with pytest.raises(RuntimeError, match="trainer died"):
            with serve.gpus_released(_ctx(_cfg(GPU1))):
                raise RuntimeError("trainer died")
        assert [p for p, _ in srv.posts][-2:] == ["/wake_up", "/reset_prefix_cache"]
        before = len(srv.posts)
        with serve.gpus_released(_ctx(_cfg(GPU8))):  # disjoint GPUs: vLLM stays awake
            pass
        assert len(srv.posts) == before
