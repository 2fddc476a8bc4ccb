"""Config loading: validated values, one-line errors naming file, field and value; CLI exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rao_core.config import ConfigError, load_config


def test_shipped_configs_load():
    cpu = load_config("configs/cpu-smoke.yaml")
    gpu = load_config("configs/gpu-qwen3-4b.yaml", check_paths=False)  # its model lives on the GPU machine
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


def test_duplicate_keys_are_refused_with_their_line(tmp_path):
    """PyYAML keeps the last of two equal keys silently; a config file with one is refused."""
    f = tmp_path / "dup.yaml"
    f.write_text("name: a\nalgo:\n  G: 4\n  lam: 0.5\n  G: 8\n")
    assert str(pytest.raises(ConfigError, load_config, f).value) == f"{f}: line 5: duplicate key 'G'"
    f.write_text("name: a\nalgo: {G: 4}\nname: b\n")
    assert str(pytest.raises(ConfigError, load_config, f).value) == f"{f}: line 3: duplicate key 'name'"
    f.write_text("base: &b {G: 4, lam: 0.5}\nalgo:\n  <<: *b\n  G: 8\n")  # a merge key then an override: fine
    from rao_core.config import read_yaml

    assert read_yaml(f)["algo"] == {"G": 8, "lam": 0.5}


def test_set_errors_name_the_set_not_the_file(tmp_path):
    """An error about a value given with --set names that --set (it named the config file); one about
    a file value names the file; a check across both names the file with the --set values."""
    f = tmp_path / "c.yaml"
    f.write_text("algo:\n  nope: 1\n")

    def err(path, sets):
        return str(pytest.raises(ConfigError, load_config, path, sets).value)

    assert err(f, ["algo.G=1"]) == (f"--set algo.G=1: algo.G = 1: Input should be greater than or equal to 2; "
                                    f"{f}: algo.nope = 1: unknown field")
    assert err(None, ["algo=5"]).startswith("--set algo=5: algo = 5: Input should be a valid dictionary")
    assert err("configs/cpu-smoke.yaml", ["algo.G.x=1"]) == "--set algo.G.x=1: G is not a section"
    assert err(None, ["algo.G.x=1"]) == "--set algo.G.x=1: algo.G = {...}: Input should be a valid integer"
    assert err(None, ["algo.G=[1"]).startswith("--set algo.G=[1: not a YAML value: ")
    assert err(None, ["algo.G"]) == "--set algo.G: expected KEY=VALUE"
    assert err(None, [f"model.path={tmp_path}"]) == (f"--set model.path={tmp_path}: model.path = '{tmp_path}': "
                                                     "model not found (no config.json there)")
    assert err(None, {"iterations": -1}) == "--set iterations=-1: iterations = -1: Input should be greater than or equal to 0"
    assert err("configs/cpu-smoke.yaml", ["tasks.env=arte"]).startswith(
        "configs/cpu-smoke.yaml with --set tasks.env=arte: tasks.difficulties = ['tier1']: unknown arte difficulty")


def test_difficulties_are_checked_against_the_environment_at_load():
    """tasks, eval and warm_start difficulties must be ones the environment's generator knows."""
    shapes = ", ".join(f"'tier1x{k}'" for k in range(2, 13))  # the tier1x<K> delegation shapes
    expected = f"expected one of ['tier1', {shapes}, 'nest1', 'nest2', 'easy', 'medium', 'hard', 'extreme', 'mixed']"
    msg = str(pytest.raises(ConfigError, load_config, "configs/cpu-smoke.yaml", ["tasks.difficulties=[nope]"]).value)
    assert msg == ("--set tasks.difficulties=[nope]: tasks.difficulties = ['nope']: unknown textcraft-synth "
                   f"difficulty 'nope'; {expected} (tasks.env = 'textcraft-synth')")  # the value came from --set
    msg = str(pytest.raises(ConfigError, load_config, None, ["eval.difficulties=[hard, zzz]"]).value)
    assert msg.startswith("--set eval.difficulties=[hard, zzz]: eval.difficulties = ['hard', 'zzz']: unknown "
                          "textcraft-synth difficulty 'zzz'")
    msg = str(pytest.raises(ConfigError, load_config, None, ["warm_start.mode=demos",
                                                             "warm_start.difficulties=[tier2]"]).value)
    assert "warm_start.difficulties = ['tier2']: unknown textcraft-synth difficulty 'tier2'" in msg
    # the environment changed, the difficulties not: cpu-smoke's tier1 is no Oolong question type
    msg = str(pytest.raises(ConfigError, load_config, "configs/cpu-smoke.yaml", ["tasks.env=oolong"]).value)
    assert "tasks.difficulties = ['tier1']: unknown oolong difficulty 'tier1'" in msg and "'mixed'" in msg
    # DeepDive accepts its named levels and k<N>
    dd = load_config(None, ["tasks.env=deepdive", "tasks.difficulties=[k3, easy]", "eval.difficulties=[hard]"])
    assert dd.tasks.difficulties == ["k3", "easy"]
    with pytest.raises(ConfigError, match=r"eval.difficulties = \['k0'\]: unknown DeepDive difficulty 'k0'"):
        load_config(None, ["tasks.env=deepdive", "tasks.difficulties=[easy]", "eval.difficulties=[k0]"])
    # lists that are not used are not checked: a task file, evaluation off, no demonstrations
    unused = load_config(None, ["tasks.train_file=configs/cpu-smoke.yaml", "tasks.difficulties=[nope]",
                                "eval.enabled=false", "eval.difficulties=[nope]", "warm_start.difficulties=[nope]"])
    assert unused.tasks.difficulties == ["nope"] and unused.warm_start.mode == "none"
    assert "at least 1 item" in str(pytest.raises(ConfigError, load_config, None, ["tasks.difficulties=[]"]).value)


def test_env_options_are_checked_at_load():
    msg = str(pytest.raises(ConfigError, load_config, None, ["tasks.env_options={colour: red}"]).value)
    assert "tasks.env_options = {'colour': 'red'}: not accepted by textcraft-synth" in msg and "\n" not in msg
    msg = str(pytest.raises(ConfigError, load_config, None, ["tasks.env=deepdive", "tasks.difficulties=[easy]",
                                                             "eval.difficulties=[easy]",
                                                             "tasks.env_options={page_chars: 5}"]).value)
    assert "not accepted by deepdive: page_chars: Input should be greater than or equal to 200 (got 5)" in msg


def test_paths_the_config_names_must_exist(tmp_path):
    msg = str(pytest.raises(ConfigError, load_config, None, [f"model.path={tmp_path / 'no-model'}"]).value)
    assert msg == (f"--set model.path={tmp_path / 'no-model'}: model.path = '{tmp_path / 'no-model'}': model not "
                   "found (no config.json there)")
    ckpt = ["warm_start.mode=checkpoint", f"warm_start.checkpoint={tmp_path / 'no-ckpt'}"]
    msg = str(pytest.raises(ConfigError, load_config, "configs/cpu-smoke.yaml", ckpt).value)
    assert msg.startswith(f"--set warm_start.checkpoint={tmp_path / 'no-ckpt'}: warm_start.checkpoint = "
                          f"'{tmp_path / 'no-ckpt'}': no checkpoint folder there")
    msg = str(pytest.raises(ConfigError, load_config, None, [f"tasks.train_file={tmp_path / 'no.jsonl'}"]).value)
    assert msg == (f"--set tasks.train_file={tmp_path / 'no.jsonl'}: tasks.train_file = '{tmp_path / 'no.jsonl'}': "
                   "file not found")
    msg = str(pytest.raises(ConfigError, load_config, None, ["warm_start.mode=checkpoint",
                                                             "warm_start.checkpoint=models:/rao-policy"]).value)
    assert "warm_start.checkpoint = 'models:/rao-policy': 'models:/rao-policy' is not 'models:/NAME@ALIAS'" in msg
    # a checkpoint the mode would ignore (cpu-smoke's warm start builds demonstrations) is refused, not dropped
    msg = str(pytest.raises(ConfigError, load_config, "configs/cpu-smoke.yaml",
                            [f"warm_start.checkpoint={tmp_path}"]).value)
    assert "warm_start.checkpoint is set but warm_start.mode is 'demos'; set warm_start.mode=checkpoint" in msg
    assert "\n" not in msg
    # what exists, or cannot be checked before the campaign runs, is accepted
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "adapter_config.json").write_text("{}")
    for ref in (str(tmp_path / "ck"), "models:/rao-policy@champion", "models:/rao-policy/3", "s3://rao/x/ckpt"):
        assert load_config(None, ["warm_start.mode=checkpoint", f"warm_start.checkpoint={ref}"]).warm_start.checkpoint == ref
    # a config prepared for another machine: paths unchecked on request, named otherwise
    assert load_config("configs/gpu-qwen3-4b.yaml", check_paths=False).model.path.name == "Qwen3-4B-Instruct-2507"
    with pytest.raises(ConfigError, match="model.path = '/models/Qwen3-4B-Instruct-2507': model not found"):
        load_config("configs/gpu-qwen3-4b.yaml")


def test_unreadable_config_files_name_the_file(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("name: caf\xe9\n".encode("latin-1"))
    msg = str(pytest.raises(ConfigError, load_config, f).value)
    assert msg == f"{f}: not UTF-8 text (invalid continuation byte at byte 9)"
    assert str(pytest.raises(ConfigError, load_config, tmp_path).value) == f"{tmp_path}: is a folder, not a config file"


def _rao(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rao_cli.main", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


#: Every service pointed at a closed port: a command that got as far as using one would hang or fail there.
NOWHERE = {"PREFECT_API_URL": "http://127.0.0.1:9/api", "RAO_S3_ENDPOINT": "http://127.0.0.1:9",
           "MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "RAO_POLICY_BASE_URL": "http://127.0.0.1:9/v1"}


def _one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and r.stderr.startswith("error: "), r.stdout + r.stderr
    return lines[0]


def test_cli_bad_config_is_one_line_exit_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("algo:\n  G: 1\n")
    r = _rao("run", "--config", str(f), env={"RAO_HOME": str(tmp_path), **NOWHERE})
    assert r.returncode == 2 and "algo.G = 1" in _one_error_line(r)


def test_cli_missing_model_is_one_line_exit_2(tmp_path):
    r = _rao("run", "--set", f"model.path={tmp_path / 'no-model'}", env={"RAO_HOME": str(tmp_path), **NOWHERE})
    line = _one_error_line(r)
    assert r.returncode == 2 and "model.path" in line and "model not found" in line and "no-model" in line


@pytest.mark.parametrize("override, key", [
    ("tasks.difficulties=[nope]", "tasks.difficulties = ['nope']"),
    ("eval.difficulties=[nope]", "eval.difficulties = ['nope']"),
    ("warm_start.difficulties=[nope]", "warm_start.difficulties = ['nope']"),  # cpu-smoke warm-starts on demos
    ("tasks.env=arte", "tasks.difficulties = ['tier1']: unknown arte difficulty"),
    ("warm_start.checkpoint=/no/such/ckpt", "warm_start.checkpoint = '/no/such/ckpt'"),
])
def test_cli_run_refuses_a_bad_config_before_any_service(tmp_path, override, key):
    """``rao run --set ...``: the config mistake is one line naming the key, before Prefect, S3, MLflow or vLLM
    are touched (all point nowhere) and before anything is written under RAO_HOME."""
    extra = ["--set", "warm_start.mode=checkpoint"] if override.startswith("warm_start.checkpoint") else []
    r = _rao("run", "--set", override, *extra, env={"RAO_HOME": str(tmp_path / "home"), **NOWHERE})
    assert r.returncode == 2 and key in _one_error_line(r)
    assert not (tmp_path / "home" / "campaigns").exists()


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
