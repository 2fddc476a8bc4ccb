"""One real training step of the RAO trainer on a GPU: bf16, chunked log-probs, LoRA and full weights; with the tiny
model, or with a randomly initialised model of the paper's shape (Qwen3-4B) and a shipped GPU config's trainer.

A check on CUDA that a CPU-only machine cannot make. For each mode (``full`` weights,
``lora`` adapter) it runs ``rao_core.train.train`` once (on-policy behaviour log-probs, one optimizer step,
chunked log-probs, gradient checkpointing) and reports wall time, peak GPU memory (allocated and reserved by
PyTorch's allocator), the step's metrics (``train/step_s``, ``train/tokens_per_s``, ...), the dtype the weights
were loaded in (a LoRA base: bf16 on CUDA), and whether the checkpoint was written; with the tiny model it also
compares chunked and full-logits log-probs of the same batch in the compute dtype. Output: one JSON object on
stdout (and in ``$OUT/<--report>`` when ``$OUT`` is set, as on the device machine).

    python scripts/gpu_train_step.py                      # on a GPU machine: bf16 on CUDA, the tiny model
    python scripts/gpu_train_step.py --cpu                # the same steps on CPU in fp32 (to check the script)
    python scripts/gpu_train_step.py --shape qwen3-4b --trainer-config configs/gpu-qwen3-4b-1gpu.yaml \
        --rows 8 --length 8192 --modes lora,full --no-save   # the paper's shape, the 1-GPU config's trainer

``--shape`` builds the model from ``infra.model_shapes.KNOWN_SHAPES`` with random weights (bf16, on the GPU) and
saves it with the tiny model's tokenizer (the weights of Qwen3-4B are not downloadable here; memory and speed
depend on the shape, not on the values, so the step's metrics mean nothing but its memory and time do). The
random token ids are drawn below the tiny tokenizer's vocabulary. ``--trainer-config`` takes the ``trainer``
section of a campaign config (``process`` inline, one process: no FSDP); ``full`` then drops its ``lora``.
``--no-save`` stops after the last optimizer step (a full 4B checkpoint and its AdamW state would be ~40 GB of
disk); the peak memory is that of the step. Compare with ``rao run --config ... --plan --gpus 1 --gpu-mem-gib
141`` (docs/pipeline/gpu.md, "The paper's setting on GPUs").

The tiny model is ``var/models/tiny-llama`` (``make setup`` builds it; pass ``--model`` for another folder).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _samples(model_dir: Path, n: int, length: int, seed: int, device: str, id_limit: int | None = None):
    """``n`` samples of ``length`` random token ids below ``id_limit`` (default: the model's vocabulary), second
    half 'assistant', advantages +1/-1, with the model's own fp32 log-probs (one row at a time) as behaviour
    log-probs (on-policy: the ratio starts at 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rao_core.samples import Sample
    from rao_core.train.loss import token_logprobs

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, min(vocab, id_limit or vocab), (n, length), generator=g)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        lp = torch.cat([token_logprobs(model(input_ids=row[None].to(device)).logits, row[None].to(device)).cpu()
                        for row in ids])
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    mask = [0] * (length // 2) + [1] * (length - length // 2)
    return [Sample(tree_id=f"t{k}", node_id="n0", group_id=f"g{k // 2}", depth=k % 2, token_ids=ids[k].tolist(),
                   assistant_mask=mask, behaviour_logprobs=[x if m else 0.0 for x, m in zip(lp[k].tolist(), mask)],
                   success=float(k % 2 == 0), reward=float(k % 2 == 0), baseline=0.5,
                   advantage=0.5 if k % 2 == 0 else -0.5) for k in range(n)]


def _random_model(shape: str, tokenizer_dir: Path, out: Path) -> Path:
    """A model of ``KNOWN_SHAPES[shape]`` with random bf16 weights, built on the GPU and saved at ``out`` with the
    tokenizer files of ``tokenizer_dir``. Raises KeyError for an unknown shape."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from infra.model_shapes import KNOWN_SHAPES

    spec = dict(KNOWN_SHAPES[shape])
    config = AutoConfig.for_model(spec.pop("model_type"), **{k: v for k, v in spec.items() if k != "torch_dtype"})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(f, out / f.name)
    return out


class _Stop(Exception):
    """Raised from ``on_step`` after the last step (``--no-save``)."""


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


def _trainer_config(mode: str, device: str, n_rows: int, chunk: int, config_file: Path | None):
    """The tiny check's settings (ppo, two micro-batches of one step, LoRA r 16), or ``config_file``'s trainer
    section run inline in this process; ``full`` drops its LoRA."""
    from rao_core.train import LoraSettings, TrainerConfig

    if config_file is None:
        return TrainerConfig(loss_type="ppo", lr=1e-4, micro_batch_size=-(-n_rows // 2), grad_accum=2,
                             logprob_chunk_tokens=chunk, resume_every_s=None,
                             gradient_checkpointing=True, dtype="bfloat16" if device == "cuda" else "float32",
                             lora=LoraSettings(r=16, alpha=32) if mode == "lora" else None)
    import yaml

    section = dict(yaml.safe_load(config_file.read_text())["trainer"])
    section.update(process="inline", accelerate_config=None, cpus=[], resume_every_s=None)
    if mode == "full":
        section["lora"] = None
    elif section.get("lora") is None:
        raise ValueError(f"{config_file}: trainer.lora is not set, so there is no 'lora' mode to run")
    return TrainerConfig(**section)


def run(mode: str, model_dir: Path, samples, device: str, chunk: int, config_file: Path | None = None,
        save: bool = True) -> dict:
    import torch

    from rao_core.train import train

    cfg = _trainer_config(mode, device, len(samples), chunk, config_file)
    held_before = None
    if device == "cuda":  # the previous run's model and optimizer must be gone, or its memory counts here
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        held_before = round(torch.cuda.memory_allocated() / 2 ** 30, 2)
    steps: list[dict] = []

    def on_step(m: dict) -> None:
        steps.append(m)
        if not save:  # max_steps 1 below: the step is taken, the checkpoint is not written
            raise _Stop

    if not save:
        cfg = cfg.model_copy(update={"max_steps": 1})
    out = Path(tempfile.mkdtemp(prefix=f"gpu-step-{mode}-"))
    t0 = time.monotonic()
    res = None
    try:
        res = train(samples, model_dir, out / "ckpt", cfg, iteration=1, on_step=on_step)
    except _Stop:
        pass
    except torch.OutOfMemoryError as e:
        return {"mode": mode, "error": f"CUDA out of memory: {str(e).splitlines()[0]}",
                "peak_gpu_allocated_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}
    wall = time.monotonic() - t0
    gib = 2 ** 30
    return {"mode": mode, "loss": cfg.loss_type, "dtype": cfg.dtype,
            "lora_r": cfg.lora.r if cfg.lora else None, "micro_batch_tokens": cfg.micro_batch_tokens,
            "base_dtype": res.manifest["base_dtype"] if res else None, "wall_s": round(wall, 2),
            "steps": len(steps), "allocated_before_gib": held_before,
            "peak_gpu_allocated_gib": round(torch.cuda.max_memory_allocated() / gib, 2) if device == "cuda" else None,
            "peak_gpu_reserved_gib": round(torch.cuda.max_memory_reserved() / gib, 2) if device == "cuda" else None,
            "metrics": {k: round(v, 6) for k, v in (steps[-1] if steps else {}).items()
                        if k.startswith("train/") and isinstance(v, (int, float))},
            "checkpoint_files": sorted(p.name for p in res.checkpoint.iterdir()) if res else "not saved (--no-save)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on CPU in fp32 (checks the script without a GPU)")
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the tiny model)")
    ap.add_argument("--shape", default=None, help="a KNOWN_SHAPES key: random weights of that shape (GPU only)")
    ap.add_argument("--trainer-config", type=Path, default=None, help="campaign config whose trainer section runs")
    ap.add_argument("--rows", type=int, default=4, help="samples in the batch")
    ap.add_argument("--length", type=int, default=512, help="tokens per sample")
    ap.add_argument("--chunk", type=int, default=256, help="trainer.logprob_chunk_tokens (tiny settings)")
    ap.add_argument("--modes", default="full,lora")
    ap.add_argument("--no-save", action="store_true", help="stop after the first optimizer step, save nothing")
    ap.add_argument("--report", default="gpu_train_step.json", help="file name under $OUT")
    a = ap.parse_args(argv)
    if a.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    from rao_core.paths import tiny_model_path

    device = "cpu" if a.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device visible to torch (use --cpu to check the script on CPU)", file=sys.stderr)
        return 1
    if a.shape and device != "cuda":
        print("error: --shape builds its random model on the GPU; it needs CUDA", file=sys.stderr)
        return 1
    model = a.model or tiny_model_path()
    if not (model / "config.json").is_file():
        print(f"error: model not found: {model} has no config.json (run `make setup` or pass --model)",
              file=sys.stderr)
        return 1
    id_limit = None
    t0 = time.monotonic()
    if a.shape:
        tokenizer_dir = model
        id_limit = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
        model = _random_model(a.shape, tokenizer_dir, Path(tempfile.mkdtemp(prefix=f"{a.shape}-random-")))
    built_s = time.monotonic() - t0
    samples = _samples(model, a.rows, a.length, seed=0, device=device, id_limit=id_limit)
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
              "model": a.shape and f"{a.shape} (random weights, built and saved in {built_s:.0f} s)" or str(model),
              "trainer_config": str(a.trainer_config) if a.trainer_config else "the script's tiny settings",
              "rows": a.rows, "length": a.length,
              "chunked_vs_full_max_abs": None if a.shape else _chunked_vs_full(
                  model, samples, device, torch.bfloat16 if device == "cuda" else torch.float32, a.chunk),
              "runs": [run(m, model, samples, device, a.chunk, a.trainer_config, save=not a.no_save)
                       for m in a.modes.split(",")]}
    text = json.dumps(report, indent=1)
    print(text)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / a.report).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
