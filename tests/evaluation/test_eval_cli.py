"""``rao eval``: any checkpoint on any task file, through the campaign's evaluation code.

The fast tests replace the endpoint policy by a scripted one (the command builds its policy inside
``rao_core.evaluation.evaluate_suite``, the function the campaign uses); the ``vllm`` test lets the
command start vLLM on the tiny model itself.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.cli import one_error_line, run_cli
from rao_core.envs.base import write_tasks
from rao_core.paths import tiny_model_path
from tests.evaluation.test_evaluation import answering, oolong_tasks

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
TINY = tiny_model_path()
needs_tok = pytest.mark.skipif(not (TINY / "tokenizer_config.json").exists(),
                               reason="tiny model not prepared (make setup)")
FAST = ["--set", f"runtime.sandbox={SANDBOX}", "--set", "runtime.context_window=2048",
        "--set", "runtime.max_new_tokens=128"]


@pytest.fixture
def scripted(monkeypatch):
    """The endpoint policy becomes a scripted Oolong answerer (gold 4, 10, 7 -> answers 4, 11, 9); the
    server check passes. Returns the list of (base_url, model) the command asked for."""
    import infra.serving
    import rao_core.evaluation as evaluation
    import rao_core.policies.openai_policy as op

    asked: list[tuple[str, str]] = []
    policy = answering({"Question 0": "4", "Question 1": "11", "Question 2": "9"})

    def fake(base_url, model, **kw):
        asked.append((base_url, model))
        return policy

    monkeypatch.setattr(op, "OpenAIPolicy", fake)
    monkeypatch.setattr(infra.serving, "wait_for_server", lambda url, timeout_s=30.0, api_key=None: None)
    calls = []
    real = evaluation.evaluate_suite
    monkeypatch.setattr(evaluation, "evaluate_suite", lambda *a, **k: calls.append(k["model"]) or real(*a, **k))
    return asked, calls


def _scripted_eval(capsys, tmp_path, *args: str) -> str:
    """``rao eval`` of the tiny checkpoint on three Oolong tasks (gold 4, 10, 7) at a fake URL; its stdout."""
    f = write_tasks(tmp_path / "oolong.jsonl", oolong_tasks(["4", "10", "7"]))
    code, out, err = run_cli(capsys, "eval", "--model", str(TINY), "--task-file", str(f), "--base-url",
                          "http://127.0.0.1:9/v1", *args, *FAST)
    assert code == 0, err
    return out


@needs_tok
def test_json_is_one_object_with_graded_wilson_interval(capsys, tmp_path, scripted):
    out = _scripted_eval(capsys, tmp_path, "--json", "--served-model-name", "m")
    assert scripted[0] == [("http://127.0.0.1:9/v1", "m")] and scripted[1] == ["m"]  # the library function
    (line,) = out.strip().splitlines()  # exactly one JSON object on stdout
    got = json.loads(line)
    assert list(got) == ["n", "successes", "success", "ci95", "mean_depth", "delegation_rate", "child_success",
                       "tree_wall_s", "tokens_per_success"]
    # 1 + 0.75 + 0.75^2 = 2.3125 of 3; Wilson with p = 0.770833, n = 3, z^2 = 3.841459:
    # centre 1.411076, half 1.959964 * sqrt(0.058883 + 0.106707) = 0.797564, denominator 2.280486
    assert got["n"] == 3 and got["successes"] == pytest.approx(2.3125)
    assert got["success"] == pytest.approx(0.770833, abs=1e-6)
    assert got["ci95"] == pytest.approx([0.269027, 0.968495], abs=1e-6)
    assert got["mean_depth"] == 0.0 and got["delegation_rate"] == 0.0


@needs_tok
def test_n_mode_and_human_output(capsys, tmp_path, scripted):
    out = _scripted_eval(capsys, tmp_path, "--n", "2", "--mode", "single")
    assert "success 0.875 (95% CI [0.264, 0.993]) = 1.75 / 2 tasks" in out  # (1 + 0.75) / 2
    assert "evaluating 2 oolong tasks of" in out and "mode single" in out


@needs_tok
def test_binary_scoring_from_the_config(capsys, tmp_path, scripted):
    got = json.loads(_scripted_eval(capsys, tmp_path, "--json", "--set", "eval.graded=false"))
    assert (got["n"], got["successes"], got["success"]) == (3, 1, pytest.approx(1 / 3, abs=1e-6))


@pytest.mark.parametrize("args,code,needle", [
    (["--mode", "both"], 2, "must be 'recursive' or 'single', got 'both'"),
    (["--n", "5"], 2, "Invalid value for '--n': 5 is more than the 2 tasks of "),
    (["--n", "0"], 2, "'--n'"),
])
def test_bad_input_isone_error_line(capsys, tmp_path, args, code, needle):
    f = write_tasks(tmp_path / "t.jsonl", oolong_tasks(["1", "2"]))
    got, out, err = run_cli(capsys, "eval", "--model", str(TINY), "--task-file", str(f), *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert got == code and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert out == ""


def test_missing_model_and_mixed_file_areone_error_line(capsys, tmp_path):
    from rao_core.envs import get_env

    f = write_tasks(tmp_path / "t.jsonl", oolong_tasks(["1"]))
    code, _, err = run_cli(capsys, "eval", "--model", str(tmp_path / "nope"), "--task-file", str(f))
    assert code == 2 and err.strip() == f"error: model not found: {tmp_path / 'nope'} has no config.json " \
                                        "(a checkpoint folder is expected)"
    mixed = write_tasks(tmp_path / "m.jsonl", oolong_tasks(["1"]) + get_env("textcraft-synth").generate_tasks(
        n=1, seed=0, difficulty="easy"))
    code, _, err = run_cli(capsys, "eval", "--model", str(TINY), "--task-file", str(mixed))
    assert code == 2 and "mixes environments ['oolong', 'textcraft-synth']" in err and len(err.splitlines()) == 1


@pytest.mark.vllm
@pytest.mark.slow
def test_eval_starts_vllm_on_the_checkpoint(capsys, tmp_path, tiny_model_path):
    """The command serves the folder itself and prints one JSON object; the random tiny model solves no
    TextCraft task, and every field follows from the counts."""
    from rao_core.envs import get_env
    from rao_core.evaluation import wilson_interval

    f = write_tasks(tmp_path / "t.jsonl", get_env("textcraft-synth").generate_tasks(n=2, seed=0, difficulty="easy",
                                                                                     split="validation"))
    code, out, err = run_cli(capsys, "eval", "--model", str(tiny_model_path), "--task-file", str(f), "--json",
                          "--set", "serving.max_model_len=2048", "--set", "runtime.max_steps_per_node=2",
                          "--set", "runtime.max_depth=1", *FAST)
    assert code == 0, err
    got = json.loads(out)
    assert got["n"] == 2 and got["successes"] == 0 and got["success"] == 0.0
    assert got["ci95"] == pytest.approx(list(wilson_interval(0, 2)), abs=1e-6)
    assert 0.0 <= got["delegation_rate"] <= 1.0 and got["mean_depth"] <= 1.0
    assert "starting vLLM" in err


def _without_switching(cmd: list[str]) -> list[str]:
    """A campaign's vLLM command less what only weight switching needs (LoRA slots, sleep mode)."""
    out, skip = [], 0
    for i, x in enumerate(cmd):
        if skip:
            skip -= 1
        elif x == "--enable-lora":
            skip = 2 if cmd[i + 1:i + 2] == ["--max-lora-rank"] else 0
        elif x != "--enable-sleep-mode":
            out.append(x)
    return out


@pytest.mark.parametrize("config,gpus,parallel", [
    ("configs/gpu-qwen3-4b.yaml", "0,1,2,3", ["--data-parallel-size", "4"]),
    ("configs/gpu-qwen3-4b-1gpu.yaml", "0", []),
])
def test_eval_serves_on_the_campaigns_gpus(capsys, tmp_path, monkeypatch, config, gpus, parallel):
    """rao eval starts vLLM through the serving stage's server_from_config (on a GPU machine, faked here): the
    GPUs of gpus.serve, vLLM's data parallelism and memory share; only LoRA slots and sleep mode are left out."""
    import infra.serving as serving
    from rao_core.config import load_config

    started: list = []

    def start(self):
        started.append(self)
        raise serving.ServiceError("not started by this test")

    monkeypatch.setattr(serving, "has_cuda_gpu", lambda: True)
    monkeypatch.setattr(serving.VLLMServer, "start", start)
    f = write_tasks(tmp_path / "t.jsonl", oolong_tasks(["1"]))
    code, out, err = run_cli(capsys, "eval", "--model", str(TINY), "--task-file", str(f), "--config", config,
                          "--set", f"model.path={TINY}")
    assert code == 1 and err == "error: not started by this test\n" and f"on GPUs {gpus} " in out
    cmd, env = started[0]._cmd(), started[0]._env()
    assert env["CUDA_VISIBLE_DEVICES"] == gpus
    assert "--gpu-memory-utilization" in cmd and (not parallel or " ".join(parallel) in " ".join(cmd))
    assert "--enable-lora" not in cmd and "--enable-sleep-mode" not in cmd
    campaign = serving.server_from_config(load_config(config, [f"model.path={TINY}"]), TINY)
    assert cmd == _without_switching(campaign._cmd())
    # the same environment, except vLLM's dev-mode routes: on for a campaign's switching server, off for rao eval's
    assert env["VLLM_SERVER_DEV_MODE"] == "0" and campaign._env()["VLLM_SERVER_DEV_MODE"] == "1"
    assert {**env, "VLLM_SERVER_DEV_MODE": "1"} == campaign._env()


def test_eval_on_cpu_starts_vllm_as_before(monkeypatch):
    """The CPU config: the same command and environment as the VLLMServer rao eval built before (no GPU flags)."""
    import infra.serving as serving
    from rao_core.config import load_config

    monkeypatch.setattr(serving, "has_cuda_gpu", lambda: False)
    cfg = load_config("configs/cpu-smoke.yaml", check_paths=False)
    s = cfg.serving
    before = serving.VLLMServer(TINY, served_model_name=s.served_model_name, max_model_len=s.max_model_len,
                                kv_cache_gib=s.kv_cache_gib, extra_args=list(s.extra_args),
                                logprobs_mode=s.logprobs_mode, dtype=s.dtype, start_timeout_s=s.start_timeout_s)
    now = serving.server_from_config(cfg, TINY, switching=False)
    assert now._cmd() == before._cmd() and now._env() == before._env()
