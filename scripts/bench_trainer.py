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

The project's step on real batches (``--batches sft,rl``), beside a plain transformers loop on the same tokens:

    .venv/bin/python scripts/bench_trainer.py --batches sft[,rl] [--config configs/cpu-smoke.yaml] [--steps 3]
        [--repeats 3] [--rl-samples var/campaigns/smoke/iter-1/samples.jsonl] [--rl-rows 8]

- ``sft``: the warm start's SFT samples of ``--config`` (its expert demonstrations, built here through the real
  runtime, as ``make run`` builds them), trained with the config's ``warm_start.trainer``;
- ``rl``: a batch of RL samples from a real campaign (``--rl-samples``, e.g. ``make run``'s first iteration),
  its first ``--rl-rows`` samples, trained with the config's ``trainer`` (one optimizer step over the batch,
  repeated ``--steps`` times: ``epochs``);
- ``project``: ``rao_core.train.train`` with those settings (what a campaign runs), ``--steps`` optimizer steps;
- ``plain``: plain transformers, fp32 weights under ``torch.autocast(bfloat16)`` (``float32`` where the CPU has no
  native bf16), forward to the full logits of each right-padded micro-batch, masked log-probs, the weighted loss,
  backward, clipping, AdamW (``torch.optim.AdamW`` defaults), over the same optimizer steps of the same micro-batches
  of the same samples (the trainer's own schedule).
Each run is a fresh process; runs are interleaved (project, plain, project, plain, ...). Per run the first step is
a warm-up, left out. tokens/s counts the samples' real tokens (not padding). The machine's matmul rate is measured
in the same run (2048 x 2048 x 2048, bf16 and fp32, the trainer's thread count); "of bf16 peak" is tokens/s x 6N
FLOPs (N: the model's parameters, embeddings included; attention's L^2 FLOPs excluded) / the measured bf16 rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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


def matmul_rates(repeats: int = 5, n: int = 2048) -> dict[str, list[float]]:
    """GFLOP/s of an n x n x n matmul in bf16 and fp32 with torch's thread count: ``repeats`` timings after 2
    warm-ups, each the best of 3 calls."""
    import torch

    out: dict[str, list[float]] = {}
    for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
        for _ in range(2):
            a @ b
        rates = []
        for _ in range(repeats):
            best = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                a @ b
                best = min(best, time.perf_counter() - t0)
            rates.append(2 * n ** 3 / best / 1e9)
        out[name] = rates
    return out


def bench_batch(kind: str, a) -> tuple[list, object]:
    """(samples, TrainerConfig) of the ``sft`` or ``rl`` benchmark batch (module docstring), the config's trainer
    settings with ``max_steps`` = ``a.steps`` and no resume points."""
    from rao_core.config import load_config

    cfg = load_config(a.config)
    if kind == "sft":
        samples = sft_samples(cfg, Path(a.cache))
        tcfg = cfg.warm_start.trainer
        update = {"max_steps": a.steps, "epochs": max(tcfg.epochs, a.steps)}
    else:
        from rao_core.samples import read_samples

        samples = read_samples(a.rl_samples).samples[:a.rl_rows]
        tcfg = cfg.trainer
        update = {"max_steps": a.steps, "epochs": a.steps}  # one step per pass over the batch: repeat the pass
    return samples, tcfg.model_copy(update={**update, "resume_every_s": None, "temperature": cfg.runtime.temperature})


def sft_samples(cfg, cache: Path) -> list:
    """The warm start's SFT samples of campaign config ``cfg``: its expert demonstrations built through the real
    runtime (``rao_core.warmstart``, as the campaign's warm start builds them), cached in ``cache``."""
    import asyncio
    import hashlib

    from rao_core.envs import get_env
    from rao_core.samples import read_samples, write_samples
    from rao_core.task_sets import campaign_demo_config
    from rao_core.warmstart import build_demonstrations, demo_samples, demo_tasks

    dc = campaign_demo_config(cfg)
    key = hashlib.sha256((dc.model_dump_json() + cfg.runtime.model_dump_json() + str(cfg.model.path)).encode())
    path = cache / f"sft-{key.hexdigest()[:12]}.jsonl"
    if not path.exists():
        env = get_env(cfg.tasks.env)
        trees = asyncio.run(build_demonstrations(env, demo_tasks(env, dc), dc, tokenizer=str(cfg.model.path),
                                                 runtime_config=cfg.runtime))
        batch = demo_samples(trees, only_successful_nodes=dc.only_successful_nodes,
                             child_sample_trees=dc.child_sample_trees)
        cache.mkdir(parents=True, exist_ok=True)
        write_samples(path, batch)
    return read_samples(path).samples


def run_project(a, kind: str) -> dict:
    """``rao_core.train.train`` on the benchmark batch: per timed step (the first left out) its seconds and real
    tokens."""
    import tempfile

    from rao_core.paths import default_model_path
    from rao_core.train import train

    samples, tcfg = bench_batch(kind, a)
    with tempfile.TemporaryDirectory() as d:
        res = train(samples, a.model or default_model_path(), Path(d) / "ck", tcfg, show_progress=False)
    ms = res.metrics[1:]
    return {"step_s": [m["train/step_s"] for m in ms], "tokens": [m["train/seq_tokens"] for m in ms],
            "padded": [m["train/padded_tokens"] for m in ms]}


def run_plain_batch(a, kind: str) -> dict:
    """The plain transformers loop (module docstring) over the optimizer steps the trainer takes on the batch."""
    import torch
    from transformers import AutoModelForCausalLM

    from rao_core.paths import default_model_path
    from rao_core.train.config import cpu_has_bf16
    from rao_core.train.data import collate
    from rao_core.train.trainer import _micro_batches, _skip_zero_coefficient, _step_schedule

    samples, tcfg = bench_batch(kind, a)
    rows, _ = _skip_zero_coefficient(samples, tcfg)
    mbs = _micro_batches(rows, tcfg)
    schedule = _step_schedule(len(mbs), tcfg, iteration=0, world=1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model or default_model_path(), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tcfg.lr)
    bf16 = cpu_has_bf16()
    times, tokens = [], []
    for _, step_mbs in schedule:
        t0 = time.perf_counter()
        batches = [collate([rows[i] for i in mbs[j].indices], 0) for j in step_mbs]
        n_assistant = sum(float(b["loss_mask"].sum()) for b in batches)
        for b in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits  # [B, L, V]
            lg = logits[:, :-1].float()
            lp = torch.gather(lg, -1, b["input_ids"][:, 1:, None]).squeeze(-1) - torch.logsumexp(lg, -1)
            coef = b["coef"] if tcfg.loss_type != "sft" else torch.ones_like(b["coef"])
            loss = -(coef[:, None] * lp * b["loss_mask"][:, 1:]).sum() / n_assistant
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.max_grad_norm or math.inf)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        tokens.append(sum(float(b["attention_mask"].sum()) for b in batches))
    return {"step_s": times[1:], "tokens": tokens[1:]}


def main_batches(a) -> None:
    """The ``--batches`` benchmark (module docstring): prints the matmul rates, then per batch the project's step
    and the plain loop's, their ratio and the fraction of the bf16 rate."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rao_core.paths import default_model_path

    model = a.model or str(default_model_path())
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # as the campaign's training child
    rates = matmul_rates()
    m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    n_params = sum(p.numel() for p in m.parameters())  # tied embeddings counted once
    del m
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{torch.backends.cpu.get_cpu_capability()}; model {model}: N = {n_params / 1e6:.1f} M parameters")
    print(f"matmul 2048^3 GFLOP/s (min / median / max of {len(rates['bf16'])}): bf16 {_stats(rates['bf16'])}, "
          f"fp32 {_stats(rates['fp32'])}")
    bf16_rate = statistics.median(rates["bf16"]) * 1e9
    for kind in a.batches.split(","):
        runs: dict[str, list[dict]] = {"project": [], "plain": []}
        for rep in range(a.repeats):
            for loop in ("project", "plain"):
                cmd = [sys.executable, __file__, "--one-batch", f"{loop}-{kind}", "--config", a.config,
                       "--steps", str(a.steps), "--rl-samples", str(a.rl_samples), "--rl-rows", str(a.rl_rows),
                       "--cache", a.cache] + (["--model", a.model] if a.model else [])
                out = subprocess.run(cmd, capture_output=True, text=True)
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"{loop}-{kind} failed:\n{out.stderr[-3000:]}")
                r = json.loads(line[7:])
                r["tps"] = [t / s for t, s in zip(r["tokens"], r["step_s"])]
                runs[loop].append(r)
                print(f"  {kind} repeat {rep + 1}/{a.repeats} {loop}: steps {[round(x, 1) for x in r['step_s']]} s, "
                      f"tokens/s {[round(x) for x in r['tps']]}", flush=True)
        proj = [x for r in runs["project"] for x in r["tps"]]
        plain = [x for r in runs["plain"] for x in r["tps"]]
        ratio = [statistics.median(p["tps"]) / statistics.median(q["tps"])
                 for p, q in zip(runs["project"], runs["plain"])]
        frac = [x * 6 * n_params / bf16_rate for x in proj]
        toks = runs["project"][0]["tokens"]
        pad = runs["project"][0]["padded"]
        print(f"{kind}: {len(toks)} timed steps x {a.repeats} repeats, {statistics.median(toks):.0f} real tokens "
              f"per step ({statistics.median(pad):.0f} computed by the project's step)")
        print(f"{kind}: project tokens/s {_stats(proj)}; plain {_stats(plain)} (min / median / max over steps)")
        print(f"{kind}: project / plain {_stats(ratio)} (per repeat, medians); of the bf16 matmul rate at 6N "
              f"FLOPs per token: {_stats([100 * f for f in frac])} %")


RUNNERS = {"plain": run_plain, "chunked": run_trainer, "full": lambda a, lora: run_trainer(a, lora, chunked=False),
           "bf16": lambda a, lora: run_trainer(a, lora, dtype="bfloat16_if_native"),
           "gc": lambda a, lora: run_trainer(a, lora, dtype="bfloat16_if_native", checkpointing=True)}


def _stats(xs: list[float]) -> str:
    """'min / median / max' of the values."""
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def main() -> None:
    from rao_core.paths import default_model_path

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is warm-up), >= 2")
    p.add_argument("--seq", type=int, default=64, help="tokens per sample (half of them assistant tokens)")
    p.add_argument("--rows", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--mbs", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every run")
    p.add_argument("--kinds", default="plain,chunked", help="comma list of plain, chunked, full, bf16, gc "
                   "(plain first)")
    p.add_argument("--modes", default="full,lora", help="comma list of full, lora")
    p.add_argument("--chunk-tokens", type=int, default=1024, help="TrainerConfig.logprob_chunk_tokens (chunked)")
    p.add_argument("--batches", help="comma list of sft, rl: the project's step on real batches vs a plain "
                   "transformers loop (see the docstring); the options above except --model and --steps are unused")
    p.add_argument("--config", default="configs/cpu-smoke.yaml", help="campaign config of the --batches runs")
    p.add_argument("--rl-samples", default=None, help="RL samples of the rl batch (a campaign's samples file, "
                   "e.g. var/campaigns/smoke/iter-1/samples.jsonl after make run); needed for rl")
    p.add_argument("--rl-rows", type=int, default=8, help="samples of --rl-samples used (its first)")
    p.add_argument("--cache", default="var/bench", help="where the sft batch's samples are cached")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: "chunked-full" etc., run in a subprocess
    p.add_argument("--one-batch", help=argparse.SUPPRESS)  # internal: "project-sft" etc., run in a subprocess
    a = p.parse_args()
    if a.one_batch:
        import os

        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))  # as the campaign's training child
        loop, kind = a.one_batch.split("-")
        print("RESULT " + json.dumps((run_project if loop == "project" else run_plain_batch)(a, kind)))
        return
    if a.batches:
        if a.steps < 2 or not set(a.batches.split(",")) <= {"sft", "rl"}:
            print("error: --batches takes sft and/or rl; --steps >= 2", file=sys.stderr)
            sys.exit(2)
        if "rl" in a.batches.split(",") and not (a.rl_samples and Path(a.rl_samples).is_file()):
            print(f"error: --batches rl needs --rl-samples, a campaign's samples file (got {a.rl_samples})",
                  file=sys.stderr)
            sys.exit(2)
        main_batches(a)
        return
    a.model = a.model or str(default_model_path())
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
