"""``rao run --plan`` checked on CPU: placement, vLLM and trainer commands, memory per GPU and
what does not fit, for 1 and 8 GPUs of the shipped GPU configs."""

from __future__ import annotations

import pytest

from rao_core.config import load_config

GPU8 = "configs/gpu-qwen3-4b.yaml"
GPU1 = "configs/gpu-qwen3-4b-1gpu.yaml"
GiB = 1024 ** 3


def _cfg(path=GPU8, *overrides):
    return load_config(path, list(overrides), check_paths=False)  # the model lives on the GPU machine


# --- the plan ---------------------------------------------------------------------------------------------

def test_qwen3_4b_shape_by_hand():
    from infra.plan import model_shape

    sh = model_shape(_cfg().model.path)  # not on this machine: the built-in shape
    assert "built-in" in sh.source
    # embeddings 151936 x 2560 = 388,956,160 (tied: no separate LM head)
    # one block: q 2560x4096 + o 4096x2560 = 20,971,520; k, v 2560x1024 each = 5,242,880;
    #   gate, up, down 2560x9728 each = 74,711,040; norms 2 x 2560 + q/k norms 2 x 128 = 5,376 -> 100,930,816
    # 36 blocks = 3,633,509,376; + embeddings + final norm 2560 = 4,022,468,096
    assert sh.params == 4_022_468_096
    # LoRA r=64 on all 7 linears: 64 x (6656 + 3584 + 3584 + 6656 + 3 x 12288) = 3,670,016 per block, x 36
    assert sh.lora_params(64, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]) \
        == 132_120_576
    # K and V: 2 x 36 layers x 8 KV heads x 128 x 2 bytes = 147,456 bytes per token; TP 2 halves the heads
    assert sh.kv_bytes_per_token() == 147_456 and sh.kv_bytes_per_token(tp=2) == 73_728


def test_eight_gpu_plan_of_the_shipped_config():
    from infra.plan import build_plan, format_plan

    plan = build_plan(_cfg(), 8, 80, config_name=GPU8)
    assert plan.problems == []
    rows = {(tuple(u.gpus), u.phase): u for u in plan.memory}
    serve, train = rows[((0, 1, 2, 3), "rollouts+training")], rows[((4, 5, 6, 7), "training")]
    # serving GPU: bf16 weights 4,022,468,096 x 2 B = 7.49 GiB; vLLM takes 0.9 x 80 = 72 GiB in all
    assert serve.parts["weights"] == pytest.approx(4_022_468_096 * 2 / GiB)
    assert serve.total == pytest.approx(72.0)
    # KV = 72 - 7.49 - LoRA slot (132,120,576 x 2 B = 0.25) - 2.0 overhead = 62.26 GiB
    assert serve.parts["kv_cache"] == pytest.approx(72 - 7.4924 - 0.2461 - 2.0, abs=1e-3)
    # training GPU, FSDP over 4: fp32 LoRA base 16.09 GB / 4 = 3.75 GiB + two gathered bf16 blocks 0.38 GiB
    assert train.parts["weights"] == pytest.approx(4_022_468_096 * 4 / 4 / GiB + 2 * 100_930_816 * 2 / GiB, rel=1e-3)
    # log-probs in chunks of 1024 tokens: 1024 x 151936 x 4 B x 3 = 1.74 GiB (not the 32768-token 55.6 GiB)
    assert train.parts["logits"] == pytest.approx(1024 * 151936 * 12 / GiB)
    assert 15 < train.total < 40
    cmds = dict(plan.commands)
    assert cmds["vLLM"].startswith("CUDA_VISIBLE_DEVICES=0,1,2,3 ")
    assert "--data-parallel-size 4" in cmds["vLLM"] and "--max-lora-rank 64" in cmds["vLLM"]
    assert "accelerate.commands.launch --config_file configs/accelerate/fsdp.yaml --quiet -m rao_cli.main train" \
        in cmds["trainer (iteration 1)"]
    assert "--model /models/Qwen3-4B-Instruct-2507 --out " in cmds["trainer (iteration 1)"]
    text = format_plan(plan)
    assert "GPUs 0-3: tensor parallel 1 x data parallel 4" in text and "GPUs 4-7: accelerate launch, 4 process" in text
    assert "lora: adapter 0.53 GB" in text  # 132,120,576 x 4 B


def test_the_plan_shows_the_rollout_shards_workers_and_replicas():
    """``rao run --plan`` says where the rollouts run: one process for backend local; for backend ray
    the shards (whole groups, split as infra.ray_rollouts.plan_shards splits them), the workers and retries."""
    from infra.plan import build_plan, format_plan

    local = format_plan(build_plan(_cfg(GPU8, "tasks.tasks_per_iteration=5", "algo.G=4"), 8, 80, config_name=GPU8))
    assert "  rollouts       this process (execution.backend local, no Ray): 5 groups x G 4 = 20 trees per " \
           "iteration, one run_trees\n" in local
    assert "  policy server  1 replica (vLLM): every request goes to it" in local
    ray = build_plan(_cfg(GPU8, "tasks.tasks_per_iteration=5", "algo.G=4", "execution.backend=ray",
                          "execution.shards=2", "execution.ray_address=10.0.0.5:6379"), 8, 80, config_name=GPU8)
    text = format_plan(ray)
    assert "  rollouts       Ray at 10.0.0.5:6379: 5 groups x G 4 = 20 trees per iteration in 2 shards of 3, 2 " \
           "groups (whole groups; the seeds of the local backend)\n" in text
    assert "  Ray workers    one per shard running, 1 CPU each: the cluster's CPUs / 1 at once, at most 2; 2 " \
           "retries of a shard whose worker is lost\n" in text
    many = build_plan(_cfg(GPU8, "tasks.tasks_per_iteration=3", "execution.backend=ray", "execution.shards=8"), 8, 80)
    assert "in 3 shards of 1, 1, 1 groups" in format_plan(many)  # never more shards than groups
    assert ray.problems == []


def test_one_gpu_plan_shares_the_gpu_and_sleeps_vllm():
    from infra.plan import build_plan

    plan = build_plan(_cfg(GPU1), 1, 80, config_name=GPU1)
    assert plan.problems == []
    roll, train = plan.memory
    assert (roll.gpus, roll.phase, train.phase) == ([0], "rollouts", "training")
    assert roll.total == pytest.approx(0.85 * 80)
    assert train.parts["vllm_asleep"] == 1.0 and "kv_cache" not in train.parts
    # no sharding on one GPU: the whole LoRA base in bf16 (the trainer's load dtype), 4,022,468,096 x 2 B = 7.49 GiB
    assert train.parts["weights"] == pytest.approx(4_022_468_096 * 2 / GiB)
    assert any("base in bfloat16 as the trainer loads it" in f for f in plan.facts)
    fp32 = build_plan(_cfg(GPU1, "trainer.dtype=float32"), 1, 80)  # no bf16 autocast: the base stays fp32
    assert fp32.memory[1].parts["weights"] == pytest.approx(4_022_468_096 * 4 / GiB)
    assert any("sleep/wake" in s for s in plan.switch)


def test_plans_that_cannot_run_say_why():
    from infra.plan import build_plan

    # the 8-GPU placement on a 1-GPU machine
    assert any("GPU 1 does not exist on a machine of 1 GPU" in p for p in build_plan(_cfg(), 1, 80).problems)
    # full fine-tuning of 4B on one 80 GiB GPU: fp32 weights 15 + grads and AdamW 44.9 GiB + activations ...
    full = build_plan(_cfg(GPU1, "trainer.lora=null", "serving.switch=reload"), 1, 80)
    assert len(full.problems) == 1 and "GPU 0 (training) needs" in full.problems[0]
    assert "largest part: grads+optimizer 45.0 GiB" in full.problems[0]  # 4,022,468,096 x 12 B
    # the full [32768, 151936] fp32 logits (x3) are 55.6 GiB: the FSDP ranks no longer fit
    logits = build_plan(_cfg(GPU8, "trainer.logprob_chunk_tokens=null"), 8, 80)
    assert any("GPU 4-7 (training)" in p and "logits 55.6 GiB" in p for p in logits.problems)
    # the placement and the accelerate config disagree
    three = build_plan(_cfg(GPU8, "gpus.train=[4, 5, 6]"), 8, 80)
    assert any("num_processes 4 != 3" in p for p in three.problems)
    assert any("gpu_ids 4-7 != gpus.train 4-6" in p for p in three.problems)
    # a KV cache too small for one sequence (vLLM would refuse to start)
    small = build_plan(_cfg(GPU8, "serving.gpu_memory_utilization=0.12"), 8, 80)
    assert any("less than one sequence" in p for p in small.problems)


def test_rao_run_plan_prints_and_starts_nothing(capsys, monkeypatch):
    from infra import plan as plan_mod
    from rao_cli.main import main

    started = []
    monkeypatch.setattr("infra.serving.VLLMServer.start", lambda self: started.append(self))
    monkeypatch.setattr("infra.process.ManagedProcess.start", lambda self: started.append(self))
    with pytest.raises(SystemExit) as e:
        main(["run", "--config", GPU8, "--plan", "--gpus", "8", "--gpu-mem-gib", "80"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and not started
    assert out.startswith(f"plan of {GPU8} on 8 GPU(s) x 80 GiB (nothing is started)")
    with pytest.raises(SystemExit) as e:
        main(["run", "--config", GPU8, "--plan", "--gpus", "1", "--gpu-mem-gib", "80"])
    cap = capsys.readouterr()
    assert e.value.code == 1 and "does not fit / cannot run:" in cap.out
    errors = [x for x in cap.err.splitlines() if x.startswith("error: ")]
    assert errors == [x for x in cap.err.splitlines() if x.strip()]  # one line, nothing else
    assert len(errors) == 1 and errors[0].startswith(f"error: plan of {GPU8} on 1 x 80 GiB cannot run: gpus.")
    monkeypatch.setattr(plan_mod, "detect_gpus", lambda: None)
    with pytest.raises(SystemExit) as e:
        main(["run", "--config", GPU8, "--plan"])
    assert e.value.code == 2 and "give the target machine as --gpus N --gpu-mem-gib M" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # without --plan they would be ignored by a real campaign
        main(["run", "--config", GPU8, "--gpus", "8", "--gpu-mem-gib", "80"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--gpus and --gpu-mem-gib only go with --plan" in err and not started


def test_the_refusal_is_one_error_line_from_the_cli(capsys):
    from rao_cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--config", GPU8, "--plan", "--gpus", "8", "--gpu-mem-gib", "80",
              "--set", "serving.base_url=http://h/v1", "--set", "serving.switch=reload"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1  # a config mistake: an input error
    assert err[0].startswith("error: ") and "serving.switch 'reload'" in err[0]


def test_a_plan_without_a_gpu_names_the_missing_option(monkeypatch):
    """On a machine without GPUs, --gpus alone is told that --gpu-mem-gib is missing (it said to give both)."""
    import infra.plan as plan

    monkeypatch.setattr(plan, "detect_gpus", lambda: None)
    with pytest.raises(ValueError, match=r"give the target machine's --gpu-mem-gib M too"):
        plan.run_plan(str(GPU8), [], gpus=1, echo=lambda s: None)
    with pytest.raises(ValueError, match=r"give the target machine as --gpus N --gpu-mem-gib M"):
        plan.run_plan(str(GPU8), [], echo=lambda s: None)


def test_the_plan_prints_the_asynchronous_layout():
    # with algo.max_staleness >= 1 the plan says which GPUs serve and which train in a step
    from infra.plan import build_plan, format_plan

    text = format_plan(build_plan(_cfg(GPU8, "algo.max_staleness=1"), 8, 80, config_name=GPU8))
    assert ("asynchronous   algo.max_staleness 1: in step k vLLM (GPUs 0-3) serves checkpoint k-1, evaluates it and "
            "generates iteration k+1 while the trainer (GPUs 4-7) trains iteration k on trees one version old; "
            "no GPU is shared") in text
    assert text.count("--max-staleness 1") == 1  # the trainer's command
    assert "asynchronous" not in format_plan(build_plan(_cfg(), 8, 80, config_name=GPU8))


def test_the_plan_blocks_in_the_docs_are_what_the_plan_prints(monkeypatch):
    """Every ``rao run --plan`` block of docs/pipeline/gpu.md and ray.md is what the code prints for its
    command (``scripts/doc_plans.py --write`` rewrites a stale one)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("doc_plans", root / "scripts" / "doc_plans.py")
    doc_plans = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc_plans)
    monkeypatch.delenv("RAO_HOME", raising=False)
    monkeypatch.delenv("RAO_VLLM_PYTHON", raising=False)
    blocks = {rel: doc_plans.BLOCK.findall((root / rel).read_text()) for rel in doc_plans.PAGES}
    assert [len(b) for b in blocks.values()] == [2, 1]  # the 8-GPU and 1-GPU plans; the Ray replicas' sections
    for rel in doc_plans.PAGES:
        text, stale = doc_plans.stale_blocks(root / rel)
        assert stale == [], f"{rel}: stale plan blocks {stale} (run python scripts/doc_plans.py --write)"
    # a block of sections holds exactly the sections it names, in the plan's order
    cmd, shown = blocks["docs/pipeline/ray.md"][0]
    assert [line for line in shown.splitlines() if line and not line.startswith(" ")] == \
        ["placement", "commands", "checkpoint switch (expected)"]
    assert "  rollouts       Ray at auto: 16 groups x G 8 = 128 trees per iteration in 4 shards of 4, 4, 4, 4 groups" \
        in doc_plans.block_text(cmd, shown)
