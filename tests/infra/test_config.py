"""Config loading: validated values, one-line errors naming file, field and value; CLI exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rao_core.config import ConfigError, load_config


def test_shipped_configs_load():
    cpu = load_config("configs/cpu-smoke.yaml")
    gpu = load_config("configs/gpu-qwen3-4b.yaml")
    assert (cpu.algo.G, cpu.runtime.context_window, cpu.tasks.env) == (4, 3072, "textcraft-synth")
    assert cpu.tasks.difficulties == ["tier1"] and cpu.trainer.temperature == cpu.runtime.temperature == 0.7
    tier1 = load_config("configs/experiment-textcraft-tier1.yaml")
    assert tier1.eval.n_tasks >= 50 and tier1.algo.G == 8 and tier1.tasks.difficulties == ["tier1"]
    assert gpu.runtime.context_window == 8192 and gpu.trainer.lora is not None and gpu.serving.switch == "lora"


def test_bad_value_names_file_field_value(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("algo:\n  G: 1\nruntime:\n  max_depth: -2\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{f}: ")
    assert "algo.G = 1: Input should be greater than or equal to 2" in msg
    assert "runtime.max_depth = -2" in msg


def test_unknown_field_unknown_env_and_bad_yaml(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("tasks:\n  env: minecraft\nrutnime: {}\n")
    msg = str(pytest.raises(ConfigError, load_config, f).value)
    assert "unknown environment 'minecraft'" in msg and "rutnime = {...}: unknown field" in msg
    f.write_text("algo: [unclosed\n")
    assert "not valid YAML" in str(pytest.raises(ConfigError, load_config, f).value)
    assert "config file not found" in str(pytest.raises(ConfigError, load_config, tmp_path / "nope.yaml").value)


def test_overrides_and_cross_field_check():
    assert load_config(overrides=["algo.G=8", "algo.lam=0.25"]).algo.G == 8
    msg = str(pytest.raises(ConfigError, load_config, None, {"runtime.context_window": 9000}).value)
    assert "exceeds serving.max_model_len" in msg


def _rao(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rao_cli.main", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


def test_cli_bad_config_is_one_line_exit_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("algo:\n  G: 1\n")
    r = _rao("run", "--config", str(f), env={"RAO_HOME": str(tmp_path)})
    assert r.returncode == 2
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and "algo.G = 1" in lines[0] and lines[0].startswith("error:")


def test_cli_missing_model_is_one_line_exit_2(tmp_path):
    r = _rao("run", "--set", f"model.path={tmp_path / 'no-model'}", env={"RAO_HOME": str(tmp_path)})
    assert r.returncode == 2
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and "model not found" in lines[0] and "no-model" in lines[0]


def test_one_sampling_temperature_for_sampler_and_trainer():
    """trainer.temperature follows runtime.temperature; conflicting or irreproducible settings are refused."""
    from rao_core.config import ConfigError, load_config

    cfg = load_config(None, ["runtime.temperature=0.7"])
    assert cfg.trainer.temperature == 0.7 and cfg.serving.logprobs_mode == "processed_logprobs"
    assert load_config(None, ["runtime.temperature=0.7", "trainer.temperature=0.7"]).trainer.temperature == 0.7
    with pytest.raises(ConfigError, match="trainer.temperature .* differs from runtime.temperature"):
        load_config(None, ["runtime.temperature=0.7", "trainer.temperature=1.0"])
    with pytest.raises(ConfigError, match="greedy"):
        load_config(None, ["runtime.temperature=0"])
    with pytest.raises(ConfigError, match="raw_logprobs"):
        load_config(None, ["runtime.temperature=0.7", "serving.logprobs_mode=raw_logprobs"])
    with pytest.raises(ConfigError, match="raw_logprobs"):
        load_config(None, ["runtime.top_p=0.9", "serving.logprobs_mode=raw_logprobs"])
    assert load_config(None, ["serving.logprobs_mode=raw_logprobs"]).trainer.temperature == 1.0


def test_vllm_is_started_with_processed_logprobs(tmp_path):
    from infra.serving import VLLMServer

    cmd = VLLMServer(tmp_path)._cmd()
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    cmd = VLLMServer(tmp_path, logprobs_mode="raw_logprobs", dtype="float32")._cmd()
    assert cmd[cmd.index("--logprobs-mode") + 1] == "raw_logprobs" and cmd[cmd.index("--dtype") + 1] == "float32"


def test_auto_dtype_is_bf16_only_on_a_cpu_with_native_bf16(monkeypatch):
    from infra import serving

    monkeypatch.setattr(serving, "has_cuda_gpu", lambda: False)
    monkeypatch.setattr(serving, "cpu_has_bf16", lambda: True)
    assert serving.resolve_dtype("auto") == "bfloat16" and serving.resolve_dtype("float32") == "float32"
    monkeypatch.setattr(serving, "cpu_has_bf16", lambda: False)
    assert serving.resolve_dtype("auto") == "float32"
    monkeypatch.setattr(serving, "has_cuda_gpu", lambda: True)
    assert serving.resolve_dtype("auto") == "auto"
