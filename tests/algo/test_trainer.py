"""The trainer on the tiny random Llama: measured direction of the update, checkpoints, bad input."""

import json
import math
from pathlib import Path

import pytest
import torch

from rao_core.samples import Sample
from rao_core.train import LoraSettings, TrainerConfig, train
from rao_core.train.checkpoint import MANIFEST_NAME
from rao_core.train.loss import token_logprobs




def _logprobs(model_path: Path, samples: list[Sample]) -> list[float]:
    """Mean log-prob of each sample's assistant tokens under the checkpoint at ``model_path``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.token_ids])
            lp = token_logprobs(model(input_ids=ids).logits, ids)[0]
            m = torch.tensor(s.assistant_mask, dtype=torch.float32)
            out.append(float((lp * m).sum() / m.sum()))
    return out


def _samples(tiny: Path, on_policy: bool = True) -> list[Sample]:
    """Two groups' worth of node samples: prompt ids then 6 'assistant' ids; advantages +1 / -1."""
    from transformers import AutoModelForCausalLM

    prompt = [1, 520, 3412, 28, 905, 2]
    conts = [[4110, 3310, 2970, 812, 1001, 77], [9051, 6200, 7310, 14002, 330, 41],
             [4110, 3310, 2970, 812, 1002, 78], [9051, 6200, 7310, 14002, 331, 42]]
    advs = [1.0, -1.0, 1.0, -1.0]
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    out = []
    for k, (c, a) in enumerate(zip(conts, advs)):
        ids = prompt + c
        mask = [0] * len(prompt) + [1] * len(c)
        with torch.no_grad():
            lp = token_logprobs(model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids]))[0].tolist()
        old = [x if m else 0.0 for x, m in zip(lp, mask)] if on_policy else [-1.0 if m else 0.0 for m in mask]
        out.append(Sample(tree_id=f"t{k}", node_id="r", group_id="g", depth=k % 2, token_ids=ids,
                          assistant_mask=mask, behaviour_logprobs=old, success=float(a > 0), reward=float(a > 0),
                          baseline=0.5, advantage=a, weight=1.0))
    return out


def test_one_step_moves_logprobs_in_advantage_direction(tiny, tmp_path):
    samples = _samples(tiny)
    before = _logprobs(tiny, samples)
    steps = []
    cfg = TrainerConfig(loss_type="ppo", lr=1e-3, micro_batch_size=2, max_grad_norm=1.0)
    res = train(samples, tiny, tmp_path / "ckpt", cfg, iteration=3, on_step=steps.append)
    after = _logprobs(res.checkpoint, samples)
    # measured: positive-advantage samples' log-probs rose, negative ones fell
    for s, b, a in zip(samples, before, after):
        assert (a > b) if s.advantage > 0 else (a < b), (s.tree_id, b, a)
    # one optimizer step (grad_accum None = whole batch), metrics namespaced and sane
    assert len(res.metrics) == 1 and steps == res.metrics
    m = res.metrics[0]
    assert m["train/tokens"] == 24 and m["train/samples"] == 4 and m["train/adv_abs_mean"] == 1.0
    # on-policy behaviour log-probs: trainer and behaviour agree, ratio 1, nothing clipped
    assert m["train/kl_mismatch"] == pytest.approx(0.0, abs=1e-6) and m["train/clip_frac"] == 0.0
    assert m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert {"train/kl_mismatch_depth_0", "train/kl_mismatch_depth_1"} <= set(m)
    assert m["train/grad_norm"] > 0 and math.isfinite(m["train/loss"])
    # checkpoint: manifest, tied embeddings kept, full safetensors, tokenizer
    ck = res.checkpoint
    man = json.loads((ck / MANIFEST_NAME).read_text())
    assert man["iteration"] == 3 and man["kind"] == "full" and man["parent_checkpoint"] == str(tiny)
    assert man["data_hash"] == res.manifest["data_hash"] and len(man["config_hash"]) == 16
    cfg_json = json.loads((ck / "config.json").read_text())
    assert cfg_json["tie_word_embeddings"] is True
    assert (ck / "model.safetensors").exists() and (ck / "tokenizer.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left


def test_mismatch_metric_and_micro_batching_invariance(tiny, tmp_path):
    # behaviour log-probs all -1 (off-policy): the mismatch metric is > 0 and per-depth keys present
    samples = _samples(tiny, on_policy=False)
    cfg = dict(loss_type="reinforce", lr=1e-4, max_steps=1)
    a = train(samples, tiny, tmp_path / "a", TrainerConfig(micro_batch_size=4, **cfg)).metrics[0]
    b = train(samples, tiny, tmp_path / "b", TrainerConfig(micro_batch_size=1, **cfg)).metrics[0]
    assert a["train/kl_mismatch"] > 0.01
    # token-mean over the whole step: splitting into micro-batches changes neither loss nor gradient
    assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-6)
    assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)


def test_lora_checkpoint_and_continue(tiny, tmp_path):
    samples = _samples(tiny)
    cfg = TrainerConfig(loss_type="cispo", lr=1e-2, micro_batch_size=4, clip_eps_high=4.0,
                        lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    r1 = train(samples, tiny, tmp_path / "l1", cfg)
    assert (r1.checkpoint / "adapter_model.safetensors").exists()
    acfg = json.loads((r1.checkpoint / "adapter_config.json").read_text())
    assert acfg["r"] == 4 and Path(acfg["base_model_name_or_path"]) == tiny.resolve()
    assert r1.manifest["kind"] == "lora"
    # continue training the adapter from the LoRA checkpoint
    r2 = train(samples, r1.checkpoint, tmp_path / "l2", cfg, iteration=1)
    assert r2.manifest["parent_checkpoint"] == str(r1.checkpoint) and r2.manifest["parent_iteration"] == 0
    with pytest.raises(ValueError, match="set config.lora"):
        train(samples, r1.checkpoint, tmp_path / "l3", TrainerConfig())


def test_sft_loss_type_raises_logprob(tiny, tmp_path):
    samples = _samples(tiny)
    before = _logprobs(tiny, samples)
    res = train(samples, tiny, tmp_path / "s", TrainerConfig(loss_type="sft", lr=1e-3, micro_batch_tokens=64))
    after = _logprobs(res.checkpoint, samples)
    assert all(a > b for a, b in zip(after, before))  # cross-entropy: every sample, whatever its advantage


@pytest.mark.parametrize("break_it, msg", [
    (lambda s: s.assistant_mask.__setitem__(slice(None), [0] * len(s.assistant_mask)), "no assistant tokens"),
    (lambda s: s.token_ids.__setitem__(-1, 10**6), "out of vocabulary"),
    (lambda s: s.behaviour_logprobs.pop(), "mismatched lengths"),
    (lambda s: setattr(s, "advantage", math.nan), "non-finite advantage"),
])
def test_bad_input_rejected_before_any_step(tiny, tmp_path, break_it, msg):
    samples = [Sample(tree_id="t", node_id=f"n{i}", group_id="g", depth=0, token_ids=[1, 2, 3, 4],
                      assistant_mask=[0, 0, 1, 1], behaviour_logprobs=[0, 0, -1.0, -1.0], success=1.0,
                      reward=1.0, baseline=0.0, advantage=1.0) for i in range(2)]
    break_it(samples[1])
    with pytest.raises(ValueError, match=msg):
        train(samples, tiny, tmp_path / "x", TrainerConfig(lr=1e-3))
    assert not (tmp_path / "x").exists()


def test_checkpoint_keeps_parent_dtype(tiny, tmp_path):
    # a bf16 parent is trained with fp32 master weights but saved back in bf16 (half the size, as served)
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parent = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16).save_pretrained(parent)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(parent)
    res = train(_samples(tiny), parent, tmp_path / "ck", TrainerConfig(lr=1e-3, micro_batch_size=4))
    with safe_open(res.checkpoint / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert json.loads((res.checkpoint / "config.json").read_text())["dtype"] == "bfloat16"


def test_zero_advantage_samples_are_skipped_without_changing_the_update(tiny, tmp_path):
    # two extra samples with advantage 0: skipping them must give the same step (same normaliser)
    samples = _samples(tiny, on_policy=False)
    zeros = [s.model_copy(update={"tree_id": f"z{k}", "advantage": 0.0}) for k, s in enumerate(samples[:2])]
    cfg = dict(loss_type="ppo", lr=1e-4, micro_batch_size=2)
    on = train(samples + zeros, tiny, tmp_path / "on", TrainerConfig(**cfg)).metrics[0]
    off = train(samples + zeros, tiny, tmp_path / "off", TrainerConfig(skip_zero_advantage=False, **cfg)).metrics[0]
    assert on["train/samples"] == 4 and off["train/samples"] == 6
    assert on["train/grad_norm"] == pytest.approx(off["train/grad_norm"], rel=1e-4)
    assert on["train/pg_loss"] * on["train/tokens"] == pytest.approx(off["train/pg_loss"] * off["train/tokens"],
                                                                      rel=1e-4, abs=1e-7)


def test_shuffle_order_changes_with_the_iteration():
    from rao_core.train.trainer import epoch_order

    a = epoch_order(20, seed=0, iteration=1, epoch=0)
    assert sorted(a) == list(range(20)) and a == epoch_order(20, seed=0, iteration=1, epoch=0)
    assert a != epoch_order(20, seed=0, iteration=2, epoch=0)  # max_steps cuts train other micro-batches
    assert a != epoch_order(20, seed=0, iteration=1, epoch=1)
    assert epoch_order(5, seed=0, iteration=3, epoch=0, shuffle=False) == [0, 1, 2, 3, 4]


def test_optimizer_state_carries_over_iterations_unless_reset(tiny, tmp_path):
    """Each iteration continues the parent's AdamW moments and step count (saved in optimizer/), so the
    second update is not Adam's first step again; 'reset' starts fresh."""
    from rao_core.train.trainer import OPTIMIZER_DIR

    samples = _samples(tiny)
    cfg = TrainerConfig(loss_type="reinforce", lr=1e-3)
    r1 = train(samples, tiny, tmp_path / "it1", cfg, iteration=1)
    state1 = torch.load(tmp_path / "it1" / OPTIMIZER_DIR / "state.pt", weights_only=True)
    assert state1["steps"] == 1 and state1["loss_type"] == "reinforce"
    assert r1.manifest["optimizer_state"]["continued"] is False
    assert not (tmp_path / "it1" / "optimizer.pt").exists()  # nothing extra at the served top level
    r2 = train(samples, tmp_path / "it1", tmp_path / "it2", cfg, iteration=2)
    assert r2.manifest["optimizer_state"] == {"continued": True, "why": "continued", "steps_total": 2}
    assert r2.metrics[-1]["train/optimizer_steps_total"] == 2.0
    state2 = torch.load(tmp_path / "it2" / OPTIMIZER_DIR / "state.pt", weights_only=True)
    assert state2["steps"] == 2
    assert all(int(s["step"]) == 2 for s in state2["optimizer"]["state"].values())  # Adam's own step count
    r3 = train(samples, tmp_path / "it1", tmp_path / "it3", cfg.model_copy(update={"optimizer_state": "reset"}),
               iteration=2)
    assert r3.manifest["optimizer_state"]["continued"] is False and r3.metrics[-1]["train/optimizer_steps_total"] == 1.0
    # a state from another loss type (e.g. the SFT warm start) is not continued
    r4 = train(samples, tmp_path / "it1", tmp_path / "it4", cfg.model_copy(update={"loss_type": "ppo"}), iteration=2)
    assert r4.manifest["optimizer_state"]["continued"] is False and "loss_type" in r4.manifest["optimizer_state"]["why"]


def test_sequence_mean_aggregation_trains(tiny, tmp_path):
    samples = _samples(tiny)
    res = train(samples, tiny, tmp_path / "seq", TrainerConfig(loss_type="reinforce", lr=1e-3,
                                                                 loss_aggregation="sequence_mean"))
    before, after = _logprobs(tiny, samples), _logprobs(tmp_path / "seq", samples)
    assert after[0] > before[0] and after[1] < before[1]  # still moves along the advantages
    assert res.manifest["config"]["loss_aggregation"] == "sequence_mean"


def test_grad_accum_steps_and_gradients_match_one_micro_batch_per_step(tiny, tmp_path, monkeypatch):
    """grad_accum=2 over 5 one-sample micro-batches: 3 optimizer steps (2 + 2 + 1 micro-batches), each the same
    loss, gradient and update as one 2-sample micro-batch per step (the token-mean over the step's tokens); through
    accelerate's accumulate() the gradients sync on each step's last micro-batch only (one process: no FSDP)."""
    from accelerate import Accelerator

    samples = _samples(tiny, on_policy=False)
    samples.append(samples[0].model_copy(update={"tree_id": "t4", "depth": 1}))
    syncs: list[bool] = []
    backward = Accelerator.backward
    monkeypatch.setattr(Accelerator, "backward", lambda self, loss, **kw: (syncs.append(self.sync_gradients),
                                                                             backward(self, loss, **kw))[1])
    cfg = dict(loss_type="ppo", lr=1e-3, max_grad_norm=1.0, shuffle=False, kl_coef=0.1)
    acc = train(samples, tiny, tmp_path / "acc", TrainerConfig(grad_accum=2, micro_batch_size=1, **cfg)).metrics
    assert syncs == [False, True, False, True, True]
    one = train(samples, tiny, tmp_path / "one", TrainerConfig(grad_accum=1, micro_batch_size=2, **cfg)).metrics
    assert len(acc) == len(one) == 3 and [m["train/samples"] for m in acc] == [2.0, 2.0, 1.0]
    for a, b in zip(acc, one):
        assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-6)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
    assert _logprobs(tmp_path / "acc", samples) == pytest.approx(_logprobs(tmp_path / "one", samples), abs=1e-5)


def test_fsdp_reduces_every_micro_batch_and_one_process_waits_for_the_last():
    from accelerate.utils import DistributedType

    from rao_core.train.trainer import _accelerator, _sync_each_micro_batch

    assert _sync_each_micro_batch(DistributedType.FSDP)  # FSDP's no_sync would keep full unsharded gradients
    assert not _sync_each_micro_batch(DistributedType.MULTI_GPU) and not _sync_each_micro_batch(DistributedType.NO)
    acc = _accelerator(TrainerConfig())
    assert acc.gradient_state.plugin_kwargs == {"num_steps": 1, "adjust_scheduler": False,
                                                "sync_with_dataloader": False, "sync_each_batch": False}


def test_lora_base_loads_in_bf16_only_on_a_bf16_gpu_without_fsdp(monkeypatch):
    from accelerate.utils import DistributedType

    from rao_core.train.trainer import policy_load_dtype

    lora = TrainerConfig(lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # CPU (even with bf16 autocast): fp32, as before
    assert policy_load_dtype(lora, "bf16", DistributedType.NO) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert policy_load_dtype(lora, "bf16", DistributedType.NO) == torch.bfloat16  # one GPU (the 1-GPU config)
    assert policy_load_dtype(lora, "bf16", DistributedType.MULTI_GPU) == torch.bfloat16  # DDP
    assert policy_load_dtype(lora, "bf16", DistributedType.FSDP) == torch.float32  # FSDP 1: one dtype per flat tensor
    assert policy_load_dtype(lora, "no", DistributedType.NO) == torch.float32  # dtype float32 (or no bf16 GPU)
    assert policy_load_dtype(TrainerConfig(), "bf16", DistributedType.NO) == torch.float32  # full weights: fp32 master
    assert policy_load_dtype(lora, "bf16", "FSDP", cuda=True) == torch.float32  # names from an accelerate yaml
    assert policy_load_dtype(lora, "bf16", "NO", cuda=True) == torch.bfloat16


def test_bf16_lora_base_keeps_the_adapter_in_fp32(tiny, tmp_path):
    """The objects the trainer builds for a bf16 base (forced here on CPU): frozen base weights in bf16, the
    trainable adapter in fp32 (peft's autocast_adapter_dtype), also when continuing a saved adapter."""
    from rao_core.train.trainer import _load_policy

    cfg = TrainerConfig(lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    model, ref, _ = _load_policy(cfg, tiny, None, torch.bfloat16)
    assert ref is None
    dtypes = {(p.requires_grad, p.dtype) for p in model.parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    model.save_pretrained(tmp_path / "adapter")
    again, _, _ = _load_policy(cfg, tiny, tmp_path / "adapter", torch.bfloat16)
    assert {(p.requires_grad, p.dtype) for p in again.parameters()} == dtypes


def test_planned_steps_counts_what_train_takes():
    from rao_core.train.trainer import planned_steps

    assert planned_steps(5, TrainerConfig(grad_accum=2)) == 3  # 2 + 2 + 1 micro-batches
    assert planned_steps(5, TrainerConfig(grad_accum=None)) == 1  # one step per epoch
    assert planned_steps(5, TrainerConfig(grad_accum=2), world=2) == 2  # 5 padded to 6, 4 per step
    assert planned_steps(4, TrainerConfig(grad_accum=1, epochs=3, max_steps=7)) == 7  # 12, cut at max_steps
    assert planned_steps(0, TrainerConfig(grad_accum=None)) == 0


def test_on_progress_counts_optimizer_steps_of_the_plan(tiny, tmp_path):
    """The callback the train stage turns into a Prefect progress artifact: (done, planned) after each step,
    planned = 2 epochs x 4 one-sample steps cut at max_steps 5."""
    calls: list[tuple[int, int]] = []
    cfg = TrainerConfig(loss_type="ppo", lr=1e-4, micro_batch_size=1, grad_accum=1, epochs=2, max_steps=5)
    res = train(_samples(tiny), tiny, tmp_path / "ck", cfg, on_progress=lambda d, t: calls.append((d, t)))
    assert len(res.metrics) == 5 and calls == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]


def test_a_training_child_reports_progress_to_this_process(tmp_path, monkeypatch, capsys):
    """``process: subprocess``: the child's {"progress": ...} records reach ``on_progress`` here and the bar is
    drawn on this process's terminal (the child's own output goes to its log). The child is a stand-in
    that writes the records ``rao train --metrics-out`` writes, and a checkpoint folder."""
    import sys

    from rao_core.train import launch

    script = ("import json, pathlib, sys, time\n"
              "m, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
              "for d in (1, 2):\n"
              "    with m.open('a') as f:\n"
              "        f.write(json.dumps({'step': {'train/step': d}}) + '\\n')\n"
              "        f.write(json.dumps({'progress': {'done': d, 'total': 2}}) + '\\n')\n"
              "    time.sleep(0.2)\n"
              "out.mkdir(parents=True); (out / 'config.json').write_text('{}')\n"
              "with m.open('a') as f: f.write(json.dumps({'end': {'peak_rss_mb': 1.0, 'steps': 2}}) + '\\n')\n")
    monkeypatch.setattr(launch, "launch_command",
                        lambda samples, model, out, cfg, metrics, **kw: [sys.executable, "-c", script, str(metrics),
                                                                         str(out)])
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.delenv("RAO_PROGRESS", raising=False)
    calls: list[tuple[int, int]] = []
    steps: list[dict] = []
    res = launch.train_in_subprocess(tmp_path / "s.jsonl", tmp_path, tmp_path / "ck", TrainerConfig(),
                                     on_step=steps.append, on_progress=lambda d, t: calls.append((d, t)), poll_s=0.05)
    assert calls == [(1, 2), (2, 2)] and [s["train/step"] for s in steps] == [1, 2] and res.peak_rss_mb == 1.0
    out = capsys.readouterr().out
    assert "training steps" in out and "2/2" in out


def test_an_interrupted_training_stops_the_launcher_s_child_too(tmp_path, monkeypatch):
    """Interrupted (Ctrl-C, SIGTERM, a cancelled task), the training leaves no process behind: the stand-in
    launcher, like ``accelerate launch``, exits on SIGTERM without passing it on, and its child (the trainer)
    must not go on training with no parent."""
    import os
    import sys
    import time

    from rao_core.train import launch

    pid_file = tmp_path / "trainer.pid"
    trainer = f"import os, pathlib, time; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(120)"
    launcher = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {trainer!r}]); time.sleep(120)"
    monkeypatch.setattr(launch, "launch_command", lambda *a, **kw: [sys.executable, "-c", launcher])

    def interrupt_once_training(line: str) -> None:
        if pid_file.exists() and pid_file.read_text():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch.train_in_subprocess(tmp_path / "s.jsonl", tmp_path, tmp_path / "ck", TrainerConfig(), poll_s=0.05,
                                   on_status=interrupt_once_training, heartbeat_s=0.05, show_progress=False)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:  # gone, or a zombie no one has reaped yet (its parent exited)
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail(f"the trainer child (pid {pid}) was still running 5 s after the interrupted training returned")


def test_an_interrupted_training_resumes_after_its_last_saved_step_with_the_same_result(tiny, tmp_path):
    # a warm start killed mid-way (the OOM killer) continues from its resume point, not from step 0
    from safetensors.torch import load_file

    samples = _samples(tiny)
    cfg = TrainerConfig(loss_type="sft", lr=1e-3, micro_batch_size=1, grad_accum=1, epochs=2, max_grad_norm=1.0,
                        resume_every_s=0.0)  # a resume point after every step
    whole = train(samples, tiny, tmp_path / "whole", cfg, iteration=1)
    assert len(whole.metrics) == 8 and not (tmp_path / "whole.resume").exists()  # removed once saved

    class Killed(Exception):
        pass

    def kill_after_step_5(m):
        if m["train/step"] == 5:
            raise Killed

    with pytest.raises(Killed):
        train(samples, tiny, tmp_path / "cut", cfg, iteration=1, on_step=kill_after_step_5)
    assert (tmp_path / "cut.resume" / "state.pt").exists() and not (tmp_path / "cut").exists()
    phases, seen = [], []
    res = train(samples, tiny, tmp_path / "cut", cfg, iteration=1, on_phase=phases.append, on_step=seen.append)
    assert any(p.startswith("resumed after optimizer step 4") for p in phases)  # step 5's point was not saved
    assert [m["train/step"] for m in seen] == [1, 2, 3, 4, 5, 6, 7, 8]  # every step reported, 1-4 replayed
    assert res.manifest["num_steps"] == 8
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert [m["train/loss"] for m in res.metrics] == pytest.approx([m["train/loss"] for m in whole.metrics])
    # another config (or samples, parent, iteration) does not pick up a stale resume point
    with pytest.raises(Killed):
        train(samples, tiny, tmp_path / "other", cfg, iteration=1, on_step=kill_after_step_5)
    phases = []
    train(samples, tiny, tmp_path / "other", cfg.model_copy(update={"lr": 2e-3}), iteration=1, on_phase=phases.append)
    assert not any(p.startswith("resumed") for p in phases)


def test_gradient_checkpointing_changes_memory_not_the_update(tiny, tmp_path):
    """trainer.gradient_checkpointing (the cheap cut of the activations' memory) recomputes the decoder
    layers in the backward pass: the same loss, gradient norm and weights as without it, to float32 rounding."""
    from safetensors.torch import load_file

    samples = _samples(tiny)
    cfg = TrainerConfig(loss_type="ppo", lr=1e-3, micro_batch_size=2, max_grad_norm=1.0, grad_accum=2)
    plain = train(samples, tiny, tmp_path / "plain", cfg)
    ckpt = train(samples, tiny, tmp_path / "gc", cfg.model_copy(update={"gradient_checkpointing": True}))
    for m, n in zip(plain.metrics, ckpt.metrics, strict=True):
        for key in ("train/loss", "train/grad_norm", "train/ratio_mean"):
            assert n[key] == pytest.approx(m[key], rel=1e-5, abs=1e-7), key
    w0, w1 = load_file(plain.checkpoint / "model.safetensors"), load_file(ckpt.checkpoint / "model.safetensors")
    start = load_file(tiny / "model.safetensors")
    assert w0.keys() == w1.keys()
    moved = max(float((w0[k] - start[k]).abs().max()) for k in w0 if k in start)
    assert moved > 1e-5  # the step changed the weights, so equal weights mean equal updates
    assert max(float((w0[k] - w1[k]).abs().max()) for k in w0) < 1e-6


def test_gradient_checkpointing_on_a_transformers_without_the_new_name(tiny, tmp_path, monkeypatch):
    """transformers 5.17 (the GPU machine's, 2026-12-04) has only ``gradient_checkpointing_enable``; the trainer
    crashed there with AttributeError on ``activation_checkpointing_enable``. It now takes the old name when the
    new one is missing, and checkpointing is on."""
    from transformers import PreTrainedModel

    # the old name does the work, as in 5.17 (in newer releases it forwards to the new name, deleted here)
    real = getattr(PreTrainedModel, "activation_checkpointing_enable", PreTrainedModel.gradient_checkpointing_enable)
    if hasattr(PreTrainedModel, "activation_checkpointing_enable"):
        monkeypatch.delattr(PreTrainedModel, "activation_checkpointing_enable")
    calls = []

    def recording(self, *a, **kw):
        calls.append(type(self).__name__)
        return real(self, *a, **kw)

    monkeypatch.setattr(PreTrainedModel, "gradient_checkpointing_enable", recording)
    cfg = TrainerConfig(loss_type="ppo", lr=1e-3, micro_batch_size=2, gradient_checkpointing=True)
    res = train(_samples(tiny), tiny, tmp_path / "gc", cfg)
    assert calls == ["LlamaForCausalLM"] and len(res.metrics) == 1
    assert res.metrics[0]["train/grad_norm"] > 0
