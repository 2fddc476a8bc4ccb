"""Prefect task ``serve_checkpoint``: start or re-point the vLLM policy server at a checkpoint.

The server is process-wide (one per flow run) and stopped by :func:`shutdown_server` when the flow ends.
Switching (``serving.switch``): ``reload`` copies the new weight files over the served folder and
reloads them in place (dev-mode ``reload_weights``, no restart); ``restart`` restarts the server;
``lora`` hot-loads the adapter under a new name. An external ``serving.base_url`` is used as is.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from tasks.common import RunContext, fetch_dir

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"server": None, "served": None, "lora": None}


def checkpoint_local(ctx: RunContext, ckpt: dict[str, Any]) -> Path:
    """Local folder of checkpoint ``ckpt`` (``{"uri": s3 prefix | None, "local": path | None, "name": str}``)."""
    local = ckpt.get("local")
    if local and (Path(local) / "config.json").exists() or (local and (Path(local) / "adapter_config.json").exists()):
        return Path(local)
    if not ckpt.get("uri"):
        raise FileNotFoundError(f"checkpoint {ckpt.get('name')} has neither a local folder nor an S3 URI")
    return fetch_dir(ctx, ckpt["uri"], f"checkpoints/{ckpt['name']}")


def _copy_weights(src: Path, dst: Path) -> None:
    """Copy checkpoint files into the served folder, each file replaced atomically."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file():
            tmp = dst / f".{p.name}.tmp"
            shutil.copy2(p, tmp)
            tmp.replace(dst / p.name)


def serve(ctx: RunContext, ckpt: dict[str, Any]) -> dict[str, Any]:
    """Make the policy server serve ``ckpt``; returns ``{"base_url", "model", "switch_s", "how"}``."""
    cfg = ctx.config.serving
    if cfg.base_url:
        return {"base_url": cfg.base_url, "model": cfg.served_model_name, "switch_s": 0.0, "how": "external"}
    from infra.serving import VLLMServer

    with _LOCK:
        t0 = time.monotonic()
        src = checkpoint_local(ctx, ckpt)
        server: VLLMServer | None = _STATE["server"]
        if server is not None and not server.alive():
            server, _STATE["server"] = None, None
        if server is not None and _STATE["served"] == ckpt["name"]:
            return {"base_url": server.base_url, "model": _STATE["lora"] or server.model, "switch_s": 0.0,
                    "how": "same"}
        served_dir = ctx.local("served")
        lora = (src / "adapter_config.json").exists()
        how = "start"
        if server is None:
            if lora:
                raise NotImplementedError("serving a LoRA checkpoint needs the base model served first")
            if served_dir.exists():
                shutil.rmtree(served_dir)
            _copy_weights(src, served_dir)
            server = VLLMServer(served_dir, served_model_name=cfg.served_model_name, max_model_len=cfg.max_model_len,
                                kv_cache_gib=cfg.kv_cache_gib, extra_args=list(cfg.extra_args),
                                logprobs_mode=cfg.logprobs_mode, dtype=cfg.dtype,
                                enable_lora=cfg.switch == "lora", start_timeout_s=cfg.start_timeout_s,
                                log_dir=ctx.local("logs"))
            server.start()
            _STATE["server"] = server
        elif cfg.switch == "lora" and lora:
            server.load_lora(ckpt["name"], src)
            _STATE["lora"] = ckpt["name"]
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
        _STATE["served"] = ckpt["name"]
        model = _STATE["lora"] if how == "lora" else server.model
        return {"base_url": server.base_url, "model": model, "switch_s": round(time.monotonic() - t0, 3), "how": how}


def shutdown_server() -> None:
    """Stop the flow's vLLM server, if any."""
    with _LOCK:
        if _STATE["server"] is not None:
            _STATE["server"].stop()
        _STATE.update(server=None, served=None, lora=None)


@task(name="serve-checkpoint", cache_policy=NONE, retries=1, retry_delay_seconds=5)
def serve_checkpoint(ctx: RunContext, ckpt: dict[str, Any]) -> dict[str, Any]:
    """Start or re-point the vLLM service at ``ckpt``; returns its URL and served model name."""
    return serve(ctx, ckpt)
