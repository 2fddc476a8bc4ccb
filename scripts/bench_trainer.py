"""Trainer throughput and peak memory vs a minimal plain-PyTorch loop over the same tokens.

    .venv/bin/python scripts/bench_trainer.py [--model DIR] [--steps 3] [--seq 64] [--rows 4] [--mbs 2]

For full fine-tuning and LoRA, runs (each in a fresh subprocess, so peak RSS is per run):
- ``trainer``: ``rao_core.train.train`` (PPO loss, metrics, validation, accelerate) for ``--steps``
  optimizer steps of ``--mbs`` micro-batches of ``--rows`` x ``--seq`` tokens;
- ``plain``: model forward, masked log-prob of the assistant tokens, weighted loss, backward, grad clip,
  AdamW step, over the same micro-batches.
Throughput = tokens forwarded per second over the steps after the first (warm-up). Prints a table and
the trainer/plain time ratio (target <= 1.15). Peak memory: max RSS on CPU, max allocated on CUDA.
Checkpoint saving is not timed (it is the same I/O in any trainer).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def make_samples(n: int, seq: int, vocab: int, seed: int = 0):
    import random

    from rao_core.samples import Sample

    rng = random.Random(seed)
    half = seq // 2
    out = []
    for i in range(n):
        ids = [rng.randrange(3, vocab) for _ in range(seq)]
        mask = [0] * half + [1] * (seq - half)
        out.append(Sample(tree_id=f"t{i}", node_id="r", group_id=f"g{i // 2}", depth=i % 3, token_ids=ids,
                          assistant_mask=mask, behaviour_logprobs=[-3.0 * m for m in mask], success=float(i % 2),
                          reward=float(i % 2), baseline=0.5, advantage=(i % 2) - 0.5, weight=1.0))
    return out


def peak_mem_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_trainer(a, lora: bool) -> dict:
    import tempfile

    from rao_core.train import LoraSettings, TrainerConfig, train

    samples = make_samples(a.rows * a.mbs * a.steps, a.seq, 49152)
    cfg = TrainerConfig(loss_type="ppo", lr=1e-6, micro_batch_size=a.rows, grad_accum=a.mbs, shuffle=False,
                        lora=LoraSettings(r=16, alpha=32) if lora else None)
    with tempfile.TemporaryDirectory() as d:
        res = train(samples, a.model, Path(d) / "ck", cfg)
    times = [m["train/step_s"] for m in res.metrics][1:]
    return {"step_s": statistics.median(times), "tokens_per_step": a.rows * a.mbs * a.seq, "peak_mb": peak_mem_mb()}


def run_plain(a, lora: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(dev).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    samples = make_samples(a.rows * a.mbs * a.steps, a.seq, 49152)
    ids = torch.tensor([s.token_ids for s in samples], device=dev)  # [N, T]
    mask = torch.tensor([s.assistant_mask for s in samples], device=dev, dtype=torch.float32)
    coef = torch.tensor([s.advantage for s in samples], device=dev)
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        for k in range(a.mbs):
            sl = slice((step * a.mbs + k) * a.rows, (step * a.mbs + k + 1) * a.rows)
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                logits = model(input_ids=ids[sl]).logits  # [B, T, V]
            lg = logits[:, :-1].float()
            lp = torch.gather(lg, -1, ids[sl, 1:, None]).squeeze(-1) - torch.logsumexp(lg, -1)  # [B, T-1]
            loss = -(coef[sl, None] * lp * mask[sl, 1:]).sum() / mask[step * a.mbs * a.rows:(step + 1) * a.mbs * a.rows].sum()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times[1:]), "tokens_per_step": a.rows * a.mbs * a.seq, "peak_mb": peak_mem_mb()}


def main() -> None:
    from rao_core.paths import default_model_path

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(default_model_path()))
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (the first is warm-up)")
    p.add_argument("--seq", type=int, default=64, help="tokens per sample (half of them assistant tokens)")
    p.add_argument("--rows", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--mbs", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: "trainer-full" etc., run in a subprocess
    a = p.parse_args()
    if a.one:
        kind, mode = a.one.split("-")
        fn = run_trainer if kind == "trainer" else run_plain
        print("RESULT " + json.dumps(fn(a, mode == "lora")))
        return
    rows = {}
    for mode in ("full", "lora"):
        for kind in ("plain", "trainer"):
            cmd = [sys.executable, __file__, "--one", f"{kind}-{mode}", "--model", a.model, "--steps", str(a.steps),
                   "--seq", str(a.seq), "--rows", str(a.rows), "--mbs", str(a.mbs)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{kind}-{mode} failed:\n{out.stderr[-3000:]}")
            rows[kind, mode] = json.loads(line[7:])
            r = rows[kind, mode]
            print(f"  {mode} {kind}: step {r['step_s']:.2f} s, peak {r['peak_mb']:.0f} MB", flush=True)
    print(f"model {a.model}; {a.rows} x {a.seq} tokens per micro-batch, {a.mbs} micro-batches per step, "
          f"{a.steps} steps (first = warm-up)")
    print(f"{'mode':6} {'loop':8} {'step s':>8} {'tokens/s':>9} {'peak MB':>8}")
    for (kind, mode), r in rows.items():
        print(f"{mode:6} {kind:8} {r['step_s']:8.2f} {r['tokens_per_step'] / r['step_s']:9.1f} {r['peak_mb']:8.0f}")
    for mode in ("full", "lora"):
        ratio = rows["trainer", mode]["step_s"] / rows["plain", mode]["step_s"]
        print(f"{mode}: trainer/plain time ratio {ratio:.3f} ({'OK' if ratio <= 1.15 else 'ABOVE'} target 1.15)")
    assert all(math.isfinite(r["step_s"]) for r in rows.values())


if __name__ == "__main__":
    main()
