"""Prefect task ``serve_checkpoint``: start or re-point the vLLM policy server at a checkpoint.

The server is process-wide (one per flow run) and stopped by :func:`shutdown_server` when the flow ends.
Switching (``serving.switch``): ``reload`` copies the new weight files over the served folder and
reloads them in place (dev-mode ``reload_weights``, no restart); ``restart`` restarts the server;
``lora`` hot-loads the adapter under a new name. An external ``serving.base_url`` gets each LoRA adapter
through its ``/v1/load_lora_adapter`` route; with ``none`` it keeps its weights; it cannot be given full
weights (refused at config load, and here when the base URL came from RAO_POLICY_BASE_URL).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from rao_core.train.checkpoint import is_checkpoint, is_lora_checkpoint
from tasks.common import RunContext, fetch_dir
from tasks.records import Checkpoint, ServedEndpoint

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"server": None, "served": None, "lora": None}


def checkpoint_local(ctx: RunContext, ckpt: Checkpoint) -> Path:
    """Local folder of checkpoint ``ckpt``: its own folder when complete, else a copy of its S3 prefix."""
    if ckpt.local and is_checkpoint(ckpt.local):
        return Path(ckpt.local)
    if not ckpt.uri:
        raise FileNotFoundError(f"checkpoint {ckpt.name} has neither a local folder nor an S3 URI")
    return fetch_dir(ctx, ckpt.uri, f"checkpoints/{ckpt.name}")


def _lora_base(adapter: Path) -> Path:
    """The base model folder of a LoRA checkpoint (``base_model_name_or_path`` of its adapter_config.json)."""
    import json

    base = Path(json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path") or "")
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"LoRA checkpoint {adapter}: its base model {base} has no config.json")
    return base


def _copy_weights(src: Path, dst: Path) -> None:
    """Copy checkpoint files into the served folder, each file replaced atomically."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file():
            tmp = dst / f".{p.name}.tmp"
            shutil.copy2(p, tmp)
            tmp.replace(dst / p.name)


@task(name="serve-checkpoint", cache_policy=NONE, retries=1, retry_delay_seconds=5)
def serve_checkpoint(ctx: RunContext, ckpt: Checkpoint) -> ServedEndpoint:
    """Start or re-point the vLLM service at ``ckpt``; returns its URL and served model name."""
    cfg = ctx.config.serving
    if cfg.base_url:
        return _serve_external(ctx, ckpt)
    from infra.serving import VLLMServer, server_from_config

    with _LOCK:
        t0 = time.monotonic()
        src = checkpoint_local(ctx, ckpt)
        server: VLLMServer | None = _STATE["server"]
        if server is not None and not server.alive():
            server, _STATE["server"] = None, None
        if server is not None and _STATE["served"] == ckpt.name:
            return ServedEndpoint(base_url=server.base_url, model=_STATE["lora"] or server.model, how="same")
        served_dir = ctx.local("served")
        lora = is_lora_checkpoint(src)
        how = "start"
        if server is None:  # a LoRA checkpoint (a resumed campaign): start on its base model, then load it
            base = _lora_base(src) if lora else src
            if served_dir.exists():
                shutil.rmtree(served_dir)
            _copy_weights(base, served_dir)
            server = server_from_config(ctx.config, served_dir, log_dir=ctx.local("logs"))
            server.start()
            _STATE["server"] = server
            if lora:
                server.load_lora(ckpt.name, src)
                _STATE["lora"], how = ckpt.name, "start+lora"
        elif cfg.switch == "lora" and lora:
            server.load_lora(ckpt.name, src)
            _STATE["lora"] = ckpt.name
            how = "lora"
        elif cfg.switch == "reload":
            _copy_weights(src, served_dir)
            server.reload_weights()
            how = "reload"
        else:
            server.stop()
            _copy_weights(src, served_dir)
            server.start()
            how = "restart"
        _STATE["served"] = ckpt.name
        model = _STATE["lora"] if how in ("lora", "start+lora") else server.model
        return ServedEndpoint(base_url=server.base_url, model=model, switch_s=round(time.monotonic() - t0, 3), how=how)


def _serve_external(ctx: RunContext, ckpt: Checkpoint) -> ServedEndpoint:
    """An external server (``serving.base_url``): LoRA checkpoints are loaded through its API; full weights
    only for the first checkpoint it is asked for (the one it already serves)."""
    from infra.serving import load_lora_adapter
    from infra.process import ServiceError
    from rao_core.config import external_switch_problem

    cfg = ctx.config.serving
    t0 = time.monotonic()
    with _LOCK:
        _STATE["served"] = _STATE["served"] or ckpt.name  # the checkpoint the server already serves
        model, how = cfg.served_model_name, "external"
        if cfg.switch == "lora":
            src = checkpoint_local(ctx, ckpt)
            if is_lora_checkpoint(src):
                load_lora_adapter(cfg.base_url, ckpt.name, src.resolve())
                model, how = ckpt.name, "external-lora"
        elif cfg.switch != "none" and ckpt.name != _STATE["served"]:
            raise ServiceError(external_switch_problem(ctx.config.model_copy(update={"iterations": 1})))
    return ServedEndpoint(base_url=cfg.base_url, model=model, switch_s=round(time.monotonic() - t0, 3), how=how)


@contextlib.contextmanager
def gpus_released(ctx: RunContext):
    """While the body runs (the trainer), the flow's vLLM server sleeps when ``gpus.sleep_while_training``
    (level 1: weights to CPU memory, KV cache freed); it wakes afterwards, also on failure."""
    server = _STATE["server"]
    if not ctx.config.gpus.sleep_while_training or server is None or not server.alive():
        yield
        return
    server.sleep(level=1)
    try:
        yield
    finally:
        server.wake_up()


def shutdown_server() -> None:
    """Stop the flow's vLLM server, if any."""
    with _LOCK:
        if _STATE["server"] is not None:
            _STATE["server"].stop()
        _STATE.update(server=None, served=None, lora=None)
