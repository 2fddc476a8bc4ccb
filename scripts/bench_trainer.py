"""Trainer throughput and peak memory vs a minimal plain-PyTorch loop over the same tokens.

    .venv/bin/python scripts/bench_trainer.py [--model DIR] [--steps 3] [--seq 64] [--rows 4] [--mbs 2]
        [--repeats 3] [--kinds plain,chunked] [--modes full,lora] [--chunk-tokens 1024]

Loops (``--kinds``), for full fine-tuning and LoRA (``--modes``), each run in a fresh subprocess so that
peak RSS is per run:
- ``plain``: model forward to the full [B, L, V] logits, masked log-prob of the assistant tokens, weighted
  loss, backward, grad clip, AdamW step, over the same micro-batches;
- ``chunked``: ``rao_core.train.train`` (PPO loss, metrics, validation, accelerate) with the LM head
  applied in checkpointed chunks of ``--chunk-tokens`` (``TrainerConfig.logprob_chunk_tokens``);
- ``full``: the same trainer with ``logprob_chunk_tokens=None`` (full logits), to separate the chunking
  from the rest of the trainer;
- ``bf16``: ``chunked`` with ``dtype=bfloat16_if_native`` (bf16 autocast where the CPU or GPU has native
  bf16, else the same as ``chunked``);
- ``gc``: ``bf16`` with ``gradient_checkpointing=True`` (the decoder layers' activations recomputed in the
  backward pass instead of kept: the cheap memory reduction; compare it with ``bf16``).
Each run does ``--steps`` optimizer steps of ``--mbs`` micro-batches of ``--rows`` x ``--seq`` tokens.
The runs are interleaved (repeat 1: plain, chunked, ...; repeat 2: plain, chunked, ...) so that a drift of
the machine's speed hits all loops alike. Per run: median step time over the steps after the first
(warm-up); peak memory = max RSS on CPU, max allocated on CUDA. Prints min / median / max over the
repeats of step time, tokens/s and peak MB per loop, and of the per-repeat ratios loop/plain (time and
peak memory; targets: time <= 1.15, peak <= 1.0). Checkpoint saving is not timed.
Figures mean something only on an otherwise idle machine.
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


def run_trainer(a, lora: bool, chunked: bool = True, dtype: str = "auto", checkpointing: bool = False) -> dict:
    import tempfile

    from transformers import AutoConfig

    from rao_core.train import LoraSettings, TrainerConfig, train

    samples = make_samples(a.rows * a.mbs * a.steps, a.seq, int(AutoConfig.from_pretrained(a.model).vocab_size))
    cfg = TrainerConfig(loss_type="ppo", lr=1e-6, micro_batch_size=a.rows, grad_accum=a.mbs, shuffle=False,
                        lora=LoraSettings(r=16, alpha=32) if lora else None,
                        logprob_chunk_tokens=a.chunk_tokens if chunked else None, dtype=dtype,
                        gradient_checkpointing=checkpointing)
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
    samples = make_samples(a.rows * a.mbs * a.steps, a.seq, int(model.config.vocab_size))
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


RUNNERS = {"plain": run_plain, "chunked": run_trainer, "full": lambda a, lora: run_trainer(a, lora, chunked=False),
           "bf16": lambda a, lora: run_trainer(a, lora, dtype="bfloat16_if_native"),
           "gc": lambda a, lora: run_trainer(a, lora, dtype="bfloat16_if_native", checkpointing=True)}


def _stats(xs: list[float]) -> str:
    """'min / median / max' of the values."""
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def main() -> None:
    from rao_core.paths import default_model_path

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(default_model_path()))
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is warm-up), >= 2")
    p.add_argument("--seq", type=int, default=64, help="tokens per sample (half of them assistant tokens)")
    p.add_argument("--rows", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--mbs", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every run")
    p.add_argument("--kinds", default="plain,chunked", help="comma list of plain, chunked, full, bf16, gc "
                   "(plain first)")
    p.add_argument("--modes", default="full,lora", help="comma list of full, lora")
    p.add_argument("--chunk-tokens", type=int, default=1024, help="TrainerConfig.logprob_chunk_tokens (chunked)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: "chunked-full" etc., run in a subprocess
    a = p.parse_args()
    if a.one:
        kind, mode = a.one.split("-")
        print("RESULT " + json.dumps(RUNNERS[kind](a, mode == "lora")))
        return
    kinds, modes = a.kinds.split(","), a.modes.split(",")
    if kinds[0] != "plain" or not set(kinds) <= set(RUNNERS) or not set(modes) <= {"full", "lora"} or a.steps < 2:
        sys.exit("--kinds must start with plain and name only plain/chunked/full/bf16/gc; --modes full/lora; "
                 "--steps >= 2")
    runs: dict[tuple[str, str], list[dict]] = {(k, m): [] for m in modes for k in kinds}
    for rep in range(a.repeats):
        for mode in modes:
            for kind in kinds:
                cmd = [sys.executable, __file__, "--one", f"{kind}-{mode}", "--model", a.model,
                       "--steps", str(a.steps), "--seq", str(a.seq), "--rows", str(a.rows), "--mbs", str(a.mbs),
                       "--chunk-tokens", str(a.chunk_tokens)]
                out = subprocess.run(cmd, capture_output=True, text=True)
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"{kind}-{mode} failed:\n{out.stderr[-3000:]}")
                r = json.loads(line[7:])
                runs[kind, mode].append(r)
                print(f"  repeat {rep + 1}/{a.repeats} {mode} {kind}: step {r['step_s']:.3f} s, "
                      f"peak {r['peak_mb']:.0f} MB", flush=True)
    print(f"model {a.model}; {a.rows} x {a.seq} tokens per micro-batch, {a.mbs} micro-batches per step, "
          f"{a.steps} steps (first = warm-up), {a.repeats} interleaved repeats, chunk {a.chunk_tokens} tokens")
    print("min / median / max over the repeats")
    print(f"{'mode':6} {'loop':8} {'step s':>24} {'tokens/s':>30} {'peak MB':>30}")
    for (kind, mode), rs in runs.items():
        tps = [r["tokens_per_step"] / r["step_s"] for r in rs]
        print(f"{mode:6} {kind:8} {_stats([r['step_s'] for r in rs]):>24} {_stats(tps):>30} "
              f"{_stats([r['peak_mb'] for r in rs]):>30}")
    for mode in modes:
        for kind in kinds[1:]:
            pairs = list(zip(runs[kind, mode], runs["plain", mode]))
            t = [x["step_s"] / y["step_s"] for x, y in pairs]
            m = [x["peak_mb"] / y["peak_mb"] for x, y in pairs]
            print(f"{mode}: {kind}/plain time ratio {_stats(t)} "
                  f"({'OK' if statistics.median(t) <= 1.15 else 'ABOVE'} target 1.15), "
                  f"peak ratio {_stats(m)} ({'OK' if statistics.median(m) <= 1.0 else 'ABOVE'} target 1.0)")
    assert all(math.isfinite(r["step_s"]) for rs in runs.values() for r in rs)


if __name__ == "__main__":
    main()
