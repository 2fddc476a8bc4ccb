"""One real training step of the RAO trainer on a GPU, with the tiny model: bf16, chunked log-probs, LoRA and full.

Issue 18 asks for a check on CUDA that this machine (no GPU) cannot make. For each mode (``full`` weights,
``lora`` adapter) it runs ``rao_core.train.train`` once (loss ``ppo``, on-policy behaviour log-probs, one
optimizer step of two accumulated micro-batches, chunked log-probs, gradient checkpointing) and reports wall
time, peak GPU memory, the step's metrics, the dtype the weights were loaded in (a LoRA base: bf16 on CUDA),
and whether the checkpoint was written; it also compares chunked and full-logits log-probs
of the same batch in the compute dtype. Output: one JSON object on stdout (and in ``$OUT/gpu_train_step.json``
when ``$OUT`` is set, as on the device machine).

    python scripts/gpu_train_step.py                      # on a GPU machine: bf16 on CUDA
    python scripts/gpu_train_step.py --cpu                # the same steps on CPU in fp32 (to check the script)

The tiny model is ``var/models/tiny-llama`` (``make setup`` builds it; pass ``--model`` for another folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _samples(model_dir: Path, n: int, length: int, seed: int, device: str):
    """``n`` samples of ``length`` random tokens (second half 'assistant'), advantages +1/-1, with the
    model's own log-probs as behaviour log-probs (on-policy: the PPO ratio starts at 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rao_core.samples import Sample
    from rao_core.train.loss import token_logprobs

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, length), generator=g)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids.to(device)).logits, ids.to(device)).cpu()
    del model
    mask = [0] * (length // 2) + [1] * (length - length // 2)
    return [Sample(tree_id=f"t{k}", node_id="n0", group_id=f"g{k // 2}", depth=k % 2, token_ids=ids[k].tolist(),
                   assistant_mask=mask, behaviour_logprobs=[x if m else 0.0 for x, m in zip(lp[k].tolist(), mask)],
                   success=float(k % 2 == 0), reward=float(k % 2 == 0), baseline=0.5,
                   advantage=0.5 if k % 2 == 0 else -0.5) for k in range(n)]


def _chunked_vs_full(model_dir: Path, samples, device: str, dtype, chunk: int) -> float:
    """Max |chunked - full| log-prob over the batch, both under autocast in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    from rao_core.train.loss import chunked_token_logprobs, model_hidden_states, token_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    ids = torch.tensor([s.token_ids for s in samples], device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    head = model.get_output_embeddings()
    with torch.no_grad(), torch.autocast(device_type=device, dtype=dtype, enabled=dtype != torch.float32):
        full = token_logprobs(model(**inputs).logits, ids)
        chunked = chunked_token_logprobs(model_hidden_states(model, head, **inputs), head, ids, 1.0, chunk)
    return float((full - chunked).abs().max())


def run(mode: str, model_dir: Path, samples, device: str, chunk: int) -> dict:
    import torch

    from rao_core.train import LoraSettings, TrainerConfig, train

    cfg = TrainerConfig(loss_type="ppo", lr=1e-4, micro_batch_size=-(-len(samples) // 2), grad_accum=2,
                        logprob_chunk_tokens=chunk,
                        gradient_checkpointing=True, dtype="bfloat16" if device == "cuda" else "float32",
                        lora=LoraSettings(r=16, alpha=32) if mode == "lora" else None)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    steps: list[dict] = []
    out = Path(tempfile.mkdtemp(prefix=f"gpu-step-{mode}-"))
    t0 = time.monotonic()
    res = train(samples, model_dir, out / "ckpt", cfg, iteration=1, on_step=steps.append)
    wall = time.monotonic() - t0
    saved = sorted(p.name for p in res.checkpoint.iterdir())
    return {"mode": mode, "dtype": cfg.dtype, "base_dtype": res.manifest["base_dtype"], "wall_s": round(wall, 2),
            "steps": len(steps),
            "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2 ** 20, 1) if device == "cuda" else None,
            "metrics": {k: round(v, 6) for k, v in (steps[-1] if steps else {}).items()
                        if k.startswith("train/") and isinstance(v, (int, float))},
            "checkpoint_files": saved}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on CPU in fp32 (checks the script without a GPU)")
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the tiny model)")
    ap.add_argument("--rows", type=int, default=4, help="samples in the batch")
    ap.add_argument("--length", type=int, default=512, help="tokens per sample")
    ap.add_argument("--chunk", type=int, default=256, help="trainer.logprob_chunk_tokens")
    ap.add_argument("--modes", default="full,lora")
    a = ap.parse_args(argv)
    if a.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    from rao_core.paths import tiny_model_path

    device = "cpu" if a.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device visible to torch (use --cpu to check the script on CPU)", file=sys.stderr)
        return 1
    model = a.model or tiny_model_path()
    if not (model / "config.json").is_file():
        print(f"error: model not found: {model} has no config.json (run `make setup` or pass --model)",
              file=sys.stderr)
        return 1
    samples = _samples(model, a.rows, a.length, seed=0, device=device)
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
              "model": str(model), "rows": a.rows, "length": a.length, "chunk": a.chunk,
              "chunked_vs_full_max_abs": _chunked_vs_full(model, samples, device,
                                                          torch.bfloat16 if device == "cuda" else torch.float32,
                                                          a.chunk),
              "runs": [run(m, model, samples, device, a.chunk) for m in a.modes.split(",")]}
    text = json.dumps(report, indent=1)
    print(text)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "gpu_train_step.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
