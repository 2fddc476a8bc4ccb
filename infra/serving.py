"""The policy inference server: vLLM's OpenAI-compatible server in its own virtual environment.

:class:`VLLMServer` runs from ``.venv-vllm`` (vLLM's fastapi pins clash with Prefect's,
``shared/spec/stack-notes.md``); everything else speaks to it over HTTP with the ``openai`` client.

:func:`server_from_config` builds replica ``i`` of ``serving.replicas`` from a campaign config: its own port, its
share of ``gpus.serve`` (:func:`gpu_share`) or of the cores (:func:`cpu_share`), ``--max-lora-rank`` holding
``trainer.lora.r``, sleep mode for ``gpus.sleep_while_training``. The pool that starts and switches the replicas is
``infra/serving_pool.py``. A server reloads new weights in place (dev-mode ``POST /collective_rpc``
``reload_weights``, no restart) and hot-loads LoRA adapters (:func:`load_lora_adapter`, also on an external
server). Log-probs are ``processed_logprobs``: those of the distribution each token was drawn from, which the
trainer recomputes (docs/algorithm.md, "Behaviour log-probs"). Every server requires an API key
(:func:`policy_api_key`) on every route but the probes (:data:`VLLM_AUTH_MIDDLEWARE`). :class:`StartupWatch`
reports a start's phases and a heartbeat; the compile cache lives under ``$RAO_HOME``.
Docs: docs/pipeline/gpu.md, docs/pipeline/ray.md, docs/pipeline/prefect.md.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from infra.process import ManagedProcess, ServiceError, ServiceMixin, pick_ports, start_on_a_fresh_port
from rao_core.paths import rao_home, vllm_cache_dir, vllm_python
from rao_core.policies.openai_policy import bind_server_key, policy_client_key, unbind_server_key
from rao_core.train.config import cpu_has_bf16

#: The folder put on the vLLM server's ``PYTHONPATH`` and the middleware it loads from there (``--middleware``).
VLLM_PLUGINS = Path(__file__).resolve().parent / "vllm_plugins"
VLLM_AUTH_MIDDLEWARE = "rao_vllm_auth.RequireKey"


def policy_api_key() -> str:
    """The API key of the vLLM servers this process starts and the one its OpenAI clients send them:
    ``RAO_POLICY_API_KEY`` when set (a parent's, or ``rao services up``'s server's), else a fresh random key made
    for this process (a campaign, a ``rao eval``) and exported as ``RAO_POLICY_API_KEY`` to its children and Ray
    workers: the servers of another process (``rao services up --model`` records a key of its own) never share
    it, so one key seen does not open every server of the installation."""
    import secrets

    key = os.environ.get("RAO_POLICY_API_KEY")
    if not key:
        key = os.environ["RAO_POLICY_API_KEY"] = secrets.token_hex(32)
    return key


# vLLM's LoRAConfig.max_lora_rank accepts only these values (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(r: int) -> int:
    """The ``--max-lora-rank`` that serves adapters of rank ``r``: the smallest value vLLM accepts >= r.
    Raises ValueError above vLLM's largest (512)."""
    for v in VLLM_LORA_RANKS:
        if v >= r:
            return v
    raise ValueError(f"trainer.lora.r = {r}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")


def resolve_dtype(dtype: str, on_gpu: bool | None = None) -> str:
    """The ``--dtype`` vLLM is started with: ``auto`` means the checkpoint's dtype on a GPU, bfloat16 on a
    CPU with native bf16 (measured 2x faster than fp32 there, see docs/benchmarks/generation.md), else float32.
    ``on_gpu``: None = whether an NVIDIA GPU is visible here."""
    if dtype != "auto":
        return dtype
    if has_cuda_gpu() if on_gpu is None else on_gpu:
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


#: The phases of a vLLM start, in order, as its log shows them (vLLM 0.32's messages: ``vllm/v1/engine/core.py``,
#: ``v1/worker/cpu_model_runner.py``, ``model_executor/model_loader/default_loader.py``,
#: ``compilation/backends.py`` and ``monitor.py``, ``entrypoints/launchers/api_server/entry.py``; uvicorn's
#: "Application startup complete"): (phase, regular expression searched in each new log line). A phase whose
#: line never comes is simply not reported; the heartbeat still is.
VLLM_START_PHASES: tuple[tuple[str, str], ...] = (
    ("engine configured", r"Initializing a V1 LLM engine"),
    ("loading weights", r"Starting to load model"),
    ("weights loaded", r"Loading weights took|Model loading took"),
    ("compiling (torch.compile)", r"Starting torch\.compile|Dynamo bytecode transform time"),
    ("compiled graphs loaded from the cache", r"Directly load the compiled graph|Directly load AOT compilation"),
    ("compiled", r"torch\.compile took [\d.]+ s in total|Compiling a graph for compile range"),
    ("warming up", r"Warming up model"),
    ("engine ready (KV cache allocated, warmed up)", r"init engine \(profile, create kv cache, warmup model\) took"),
    ("HTTP server up", r"Starting vLLM server on|Application startup complete"),
)


#: A vLLM log line's prefix before its source file: the process tag, the level and the date and time
#: (``(EngineCore_DP0 pid=812) WARNING 12-05 23:25:01 [shm_broadcast.py:466] ...``).
_VLLM_LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+\d\d-\d\d\s+(?:[\d:.]+\s+)?")


def log_excerpt(line: str, width: int = 160) -> str:
    """A server log line as a progress message quotes it: the vLLM prefix's process tag and date dropped (the
    level kept), then cut at a word boundary to at most ``width`` characters with `` ...`` (whitespace runs become
    one space). ``log_excerpt("(EngineCore_DP0 pid=9) WARNING 12-05 23:25:01 [shm_broadcast.py:466] No available
    shared memory ...")`` starts ``"WARNING [shm_broadcast.py:466] No available"``."""
    return textwrap.shorten(_VLLM_LOG_PREFIX.sub(r"\1 ", line.strip()), width=width, placeholder=" ...")


class StartupWatch:
    """Progress lines of a server that is starting, from its log file and the clock.

    Call :meth:`poll` while waiting for the server (``ManagedProcess.on_wait``): its first call reports the
    process as up (``pid``, the log), and each call reads the lines the
    server added to its log since the watch was made and reports each phase of ``phases`` the first time its
    pattern matches (``vLLM start: weights loaded (24 s)``), and, when nothing was reported for
    ``heartbeat_s`` seconds, one line saying how long it has been and the server's last log line. Call
    :meth:`ready` once it answers: it reports the total and returns the phase times.

    Args:
        log_path: the server's log (appended to by each start: only what comes after its current end is read).
        report: where lines go (e.g. a Prefect run logger's ``info``).
        name: the server's name in the lines.
        phases: (phase, regular expression) pairs, in order (:data:`VLLM_START_PHASES`).
        heartbeat_s: the longest time without a line, seconds.
        pid: returns the server's pid (for the first line); None: not named.
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, log_path: Path, report: Callable[[str], None], *, name: str = "vLLM",
                 phases: tuple[tuple[str, str], ...] = VLLM_START_PHASES, heartbeat_s: float = 20.0,
                 pid: Callable[[], int | None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.log_path, self.report, self.name, self.pid = Path(log_path), report, name, pid
        self.up = False
        self.phases = [(p, re.compile(rx)) for p, rx in phases]
        self.heartbeat_s, self.clock = heartbeat_s, clock
        try:
            self.offset = self.log_path.stat().st_size
        except FileNotFoundError:
            self.offset = 0
        self.t0 = self.last_report = clock()
        self.times: dict[str, float] = {}  # phase -> seconds after the watch started
        self.last_line = ""
        self.last_lines: collections.deque[str] = collections.deque(maxlen=3)

    def elapsed(self) -> float:
        """Seconds since the watch started."""
        return self.clock() - self.t0

    def _say(self, text: str) -> None:
        self.last_report = self.clock()
        self.report(f"{self.name} start: {text}")

    def poll(self) -> None:
        """Report the phases the log reached since the last call, or a heartbeat after ``heartbeat_s``."""
        if not self.up:
            self.up = True
            pid = self.pid() if self.pid is not None else None
            self.times["process up"] = round(self.elapsed(), 1)
            self._say(f"process up{f' (pid {pid})' if pid else ''}, log {self.log_path}")
        try:
            with self.log_path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        for raw in data[:end].decode(errors="replace").splitlines():
            line = raw.strip()
            if not line:
                continue
            self.last_line = line
            self.last_lines.append(line)
            for phase, rx in self.phases:
                if phase not in self.times and rx.search(line):
                    self.times[phase] = round(self.elapsed(), 1)
                    self._say(f"{phase} ({self.elapsed():.0f} s)")
        if self.clock() - self.last_report >= self.heartbeat_s:
            last = f"; its last log line: {log_excerpt(self.last_line)}" if self.last_line else ""
            self._say(f"still starting, {self.elapsed():.0f} s, after {list(self.times)[-1]}{last}")

    def state(self) -> str:
        """What the start was doing when last seen, for an error line: its last phase and when it was reached, then
        its last log lines, e.g. ``still compiling (torch.compile) (reached at 41 s, nothing since); its last log
        lines: WARNING [...] ... | INFO [...] ...``; ``no phase of its start in its log yet`` before the first."""
        self.poll()
        if self.times:
            phase, at = list(self.times.items())[-1]
            what = f"still {phase} (reached at {at:.0f} s, no later phase in the {self.elapsed():.0f} s since start)"
        else:
            what = "no phase of its start in its log yet"
        lines = " | ".join(log_excerpt(x, 120) for x in self.last_lines)
        return what + (f"; its last log lines: {lines}" if lines else "; its log is empty")

    def ready(self) -> dict[str, float]:
        """Report the start as complete; returns ``{phase: seconds}`` of the phases seen, plus ``ready``."""
        self.poll()
        self.times["ready"] = round(self.elapsed(), 1)
        self._say(f"ready after {self.elapsed():.0f} s ({self._summary()})")
        return dict(self.times)

    def _summary(self) -> str:
        return ", ".join(f"{p} {s:.0f} s" for p, s in self.times.items() if p != "ready") or "no phase in its log"


@dataclass
class VLLMServer(ServiceMixin):
    """A vLLM OpenAI-compatible server for one checkpoint folder, on 127.0.0.1.

    Args:
        model_path: HF checkpoint folder (config.json + safetensors + tokenizer).
        served_model_name: the ``model`` name clients send.
        max_model_len: context length in tokens.
        port: TCP port (0 = pick a free one, outside the kernel's ephemeral range: ``infra.process.pick_ports``).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` on CPU (GiB).
        enable_lora / max_lora_rank: serve LoRA adapters loaded at run time (rank: :func:`vllm_max_lora_rank`).
        gpus: CUDA devices (CUDA_VISIBLE_DEVICES; empty: the caller's environment decides).
        cpus: on CPU, the cores vLLM binds its threads to (``VLLM_CPU_OMP_THREADS_BIND``, a replica's share:
            :func:`cpu_share`); empty: every core of the machine.
        tensor_parallel_size / data_parallel_size / gpu_memory_utilization: vLLM's flags of the same names
            (the last only when set: it means nothing to the CPU engine).
        enable_sleep_mode: ``--enable-sleep-mode``, so that :meth:`sleep` frees the GPUs during training.
        on_gpu: whether the server runs on GPUs (None: an NVIDIA GPU is visible here); decides ``--dtype auto``.
        extra_args: more ``api_server`` flags (e.g. ``--max-num-seqs 256``).
        dtype: ``auto`` (see :func:`resolve_dtype`), ``bfloat16`` or ``float32``. bf16 serving with an fp32
            trainer adds a small sampler/trainer mismatch, logged every step as ``train/kl_mismatch``.
        logprobs_mode: ``processed_logprobs`` (default: after temperature/top-k/top-p, what the trainer
            reproduces) or ``raw_logprobs`` (vLLM's own default: before any sampling processing).
        log_dir: folder of ``vllm.log`` (default ``$RAO_HOME/services``).
        host: the address it listens on and clients use (127.0.0.1; a replica placed by Ray on another node:
            that node's IP, ``infra/ray_serving.py``).
        on_progress: where the start's progress lines go (:class:`StartupWatch`); None: nowhere.
        on_spawn: called with the server's pid as soon as its process exists (before it answers), e.g. to record it.
        api_key: the key the server requires (``VLLM_API_KEY``) and this object's requests send
            (default :func:`policy_api_key`); once started, clients of this process send it to this server
            (``rao_core.policies.openai_policy.bind_server_key``) and to no other.
        dev_mode: vLLM's development routes (``VLLM_SERVER_DEV_MODE=1``: ``/collective_rpc``, ``/sleep``,
            ``/wake_up``, ``/reset_prefix_cache``, ``/server_info``, ...), which :meth:`reload_weights`,
            :meth:`sleep` and :meth:`wake_up` need; off unless asked (a server of one fixed checkpoint needs none).
    After :meth:`start`, ``start_phases`` holds the seconds at which each phase of the start was reached
    (:data:`VLLM_START_PHASES`, plus ``ready``).
    Raises ServiceError (naming the log file) if the server does not become healthy.
    """

    model_path: str | Path
    served_model_name: str = "policy"
    max_model_len: int = 4096
    port: int = 0
    kv_cache_gib: int = 2
    enable_lora: bool = False
    max_lora_rank: int = 16
    gpus: list[int] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    enable_sleep_mode: bool = False
    on_gpu: bool | None = None
    extra_args: list[str] = field(default_factory=list)
    logprobs_mode: str = "processed_logprobs"
    dtype: str = "auto"
    log_dir: Path | None = None
    start_timeout_s: float = 600.0
    python: Path | None = None
    host: str = "127.0.0.1"
    process: ManagedProcess | None = None
    on_progress: Callable[[str], None] | None = None
    on_spawn: Callable[[int], None] | None = None
    start_phases: dict[str, float] = field(default_factory=dict)
    api_key: str = field(default_factory=policy_api_key, repr=False)
    dev_mode: bool = False

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header of a request to this server."""
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def url(self) -> str:
        """Server root, e.g. ``http://127.0.0.1:8000``."""
        return f"http://{self.host}:{self.port}"

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
            "--max-model-len", str(self.max_model_len), "--host", self.host, "--port", str(self.port),
            "--dtype", resolve_dtype(self.dtype, self.on_gpu), "--logprobs-mode", self.logprobs_mode,
            "--middleware", VLLM_AUTH_MIDDLEWARE,
        ]  # no --disable-log-stats: it also empties /metrics of every vllm:* series (infra/vllm_metrics.py)
        if self.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
        if self.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.data_parallel_size > 1:
            cmd += ["--data-parallel-size", str(self.data_parallel_size)]
        if self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enable_sleep_mode:
            cmd += ["--enable-sleep-mode"]
        return cmd + list(self.extra_args)

    def _env(self) -> dict[str, str]:
        """Environment variables the server is started with (on top of this process's)."""
        env = {
            "VLLM_CPU_KVCACHE_SPACE": str(int(self.kv_cache_gib)),
            "VLLM_SERVER_DEV_MODE": "1" if self.dev_mode else "0",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            # the compile cache under $RAO_HOME (reused by the next start), unless the caller chose one
            "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT") or str(vllm_cache_dir()),
            "VLLM_API_KEY": self.api_key,
            "PYTHONPATH": os.pathsep.join([str(VLLM_PLUGINS)] + [p for p in os.environ.get("PYTHONPATH", "")
                                                                .split(os.pathsep) if p]),
        }
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        elif not (has_cuda_gpu() if self.on_gpu is None else self.on_gpu):
            # vLLM's CPU engine by default reserves one core for the API process and binds the model to the
            # rest: on 2 cores that halves generation (measured 185 vs 298 tok/s fp32, docs/benchmarks/generation.md).
            # Bind every core unless the caller's environment says otherwise.
            n = os.cpu_count() or 1
            if self.cpus:  # a replica of a pool: its own cores
                env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, self.cpus))
            elif "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{n - 1}"
            if "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ:
                env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        return env

    def start(self) -> "VLLMServer":
        """Start and wait for ``/health``; typically 2-3.5 minutes on 2 CPU cores. A port picked here (``port``
        0, or the one an earlier start picked) that was taken before the server bound it restarts it on a fresh
        one, at most ``infra.process.PORT_ATTEMPTS`` starts, each retry one ``warning:`` line. Raises
        ServiceError naming the log (:class:`infra.process.PortInUseError` naming the port and what holds it
        when every start found its port taken)."""
        py = Path(self.python or vllm_python())
        if not py.exists():
            raise ServiceError(f"vLLM environment not found at {py} (run `make setup`)")
        if not (Path(self.model_path) / "config.json").exists():
            raise ServiceError(f"model not found: {self.model_path} has no config.json")
        fixed = self.port if self.port != getattr(self, "_picked_port", 0) else 0
        os.environ.setdefault("RAO_POLICY_API_KEY", self.api_key)  # this process's clients and its children
        return start_on_a_fresh_port("vLLM server", self, fixed)

    def _start_once(self) -> "VLLMServer":
        if not self.port:
            self.port = self._picked_port = pick_ports(1, host=self.host)[0]
        log_dir = Path(self.log_dir or rao_home() / "services")
        log_path = log_dir / f"vllm-{self.port}.log"
        watch = StartupWatch(log_path, self.on_progress or (lambda line: None), pid=lambda: self.pid)
        self.process = ManagedProcess(
            name="vllm", cmd=self._cmd(), log_path=log_path, health_url=f"{self.url}/health", env=self._env(),
            start_timeout_s=self.start_timeout_s, on_wait=watch.poll, ports=(self.port,), on_spawn=self.on_spawn,
            describe=watch.state,
        )
        self.process.start()
        # /health answers before the model is fully ready on some versions: wait for /v1/models too.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/models", timeout=5, headers=self.headers).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            watch.poll()
            time.sleep(0.5)
        self.start_phases = watch.ready()
        bind_server_key(self.base_url, self.api_key)  # this key goes to this server, and no key of ours elsewhere
        return self

    def stop(self) -> None:
        """Stop the server and every process of its group; its key is no longer sent to its address."""
        unbind_server_key(self.base_url)
        super().stop()


    def reload_weights(self, timeout_s: float = 120.0) -> None:
        """Reload weights from the served folder in place (dev-mode ``/collective_rpc``).

        Raises ServiceError if the route is not available or fails.
        """
        try:
            r = httpx.post(f"{self.url}/collective_rpc", json={"method": "reload_weights"}, timeout=timeout_s,
                           headers=self.headers)
        except httpx.HTTPError as e:
            raise ServiceError(f"vLLM reload_weights failed: {e}") from e
        if r.status_code != 200:
            raise ServiceError(f"vLLM reload_weights answered {r.status_code}: {r.text[:300]}")
        try:  # cached KV from the old weights must not be reused
            httpx.post(f"{self.url}/reset_prefix_cache", timeout=30, headers=self.headers)
        except httpx.HTTPError:
            pass

    def load_lora(self, name: str, path: str | Path) -> None:
        """Hot-load (or replace) LoRA adapter ``name`` from ``path``; needs ``enable_lora``."""
        load_lora_adapter(self.base_url, name, path, api_key=self.api_key)

    def sleep(self, level: int = 1, timeout_s: float = 300.0) -> None:
        """Free the GPUs (needs ``enable_sleep_mode``): level 1 moves the weights to CPU memory and drops the
        KV cache; level 2 drops the weights too. Raises ServiceError."""
        self._dev_post(f"/sleep?level={level}", timeout_s)

    def wake_up(self, timeout_s: float = 300.0) -> None:
        """Bring a sleeping server back (weights to the GPUs, KV cache re-allocated). Raises ServiceError."""
        self._dev_post("/wake_up", timeout_s)
        try:  # the KV cache was dropped: nothing cached may be reused
            httpx.post(f"{self.url}/reset_prefix_cache", timeout=30, headers=self.headers)
        except httpx.HTTPError:
            pass

    def _dev_post(self, route: str, timeout_s: float) -> None:
        try:
            r = httpx.post(f"{self.url}{route}", timeout=timeout_s, headers=self.headers)
        except httpx.HTTPError as e:
            raise ServiceError(f"vLLM {route} failed: {e}") from e
        if r.status_code != 200:
            raise ServiceError(f"vLLM {route} answered {r.status_code}: {r.text[:300]}")


def process_state(server) -> str:
    """What became of a server's process, for an error line: ``the vLLM server (pid P) exited with status -9
    (SIGKILL); log F``, ``the vLLM server (pid P) still runs (it failed requests); log F`` or ``the vLLM server
    was not started``."""
    import signal

    proc = getattr(server, "process", None)
    if proc is None or getattr(proc, "proc", None) is None:
        return "the vLLM server was not started"
    rc = proc.proc.poll()
    if rc is None:
        state = "still runs (it failed requests)"
    else:
        name = f" ({signal.Signals(-rc).name})" if rc < 0 and -rc in {s.value for s in signal.Signals} else ""
        state = f"exited with status {rc}{name}"
    return f"the vLLM server (pid {proc.proc.pid}) {state}; log {proc.log_path}"


def load_lora_adapter(base_url: str, name: str, path: str | Path, timeout_s: float = 120.0,
                      api_key: str | None = None) -> None:
    """``POST {base_url}/load_lora_adapter`` (``base_url`` ends in ``/v1``): load or replace adapter ``name``
    from ``path``, a folder the server can read. Requests then name the adapter as their model. The server
    must run with ``--enable-lora`` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True. ``api_key``: the key sent
    (default :func:`~rao_core.policies.openai_policy.policy_client_key` of ``base_url``). Raises ServiceError."""
    try:
        r = httpx.post(f"{base_url.rstrip('/')}/load_lora_adapter", timeout=timeout_s,
                       json={"lora_name": name, "lora_path": str(path), "load_inplace": True},
                       headers={"Authorization": f"Bearer {api_key or policy_client_key(base_url)}"})
    except httpx.HTTPError as e:
        raise ServiceError(f"load_lora_adapter({name}) at {base_url} failed: {e}") from e
    if r.status_code != 200:
        raise ServiceError(f"load_lora_adapter({name}) at {base_url} answered {r.status_code}: {r.text[:300]}")


def cpu_share(replica: int, replicas: int, cores: list[int] | None = None) -> list[int]:
    """The CPU cores of replica ``replica`` (0-based) of ``replicas``: consecutive runs of ``cores`` (default:
    the cores this process may run on, ``os.sched_getaffinity``), as even as possible (5 cores over 2 replicas:
    3 + 2). Raises ServiceError when there are fewer cores than replicas."""
    from rao_core.task_sampling import split_evenly

    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if replicas > len(cores):
        raise ServiceError(f"serving.replicas = {replicas} on CPU needs at least one core per replica; this "
                           f"process has {len(cores)} core(s)")
    sizes = split_evenly(len(cores), replicas)
    start = sum(sizes[:replica])
    return cores[start:start + sizes[replica]]


def gpu_share(cfg, replica: int) -> list[int]:
    """The CUDA devices of replica ``replica`` (0-based): its run of ``tensor_parallel_size x
    data_parallel_size`` consecutive GPUs of ``gpus.serve`` (empty when gpus.serve is)."""
    s = cfg.serving
    k = s.tensor_parallel_size * s.data_parallel_size
    return list(cfg.gpus.serve[replica * k:(replica + 1) * k]) if cfg.gpus.serve else []


def server_from_config(cfg, model_path: str | Path, *, log_dir: Path | None = None,
                       on_gpu: bool | None = None, switching: bool = True, replica: int = 0) -> VLLMServer:
    """The :class:`VLLMServer` a campaign config (``rao_core.config.CampaignConfig``) asks for, not started.

    ``on_gpu``: whether it will run on GPUs (None: an NVIDIA GPU is visible here); only then is
    ``--gpu-memory-utilization`` passed. LoRA serving (``serving.switch: lora``) gets
    ``--max-lora-rank`` = :func:`vllm_max_lora_rank` of ``trainer.lora.r``. ``switching=False``: a server of
    one fixed checkpoint (``rao eval``), without LoRA slots or sleep mode; its GPUs (``gpus.serve``), tensor and
    data parallelism, memory share, dtype and limits are the campaign's.
    A switching server has vLLM's development routes (``dev_mode``: the in-place reload and sleep mode use them);
    ``switching=False`` leaves them off. ``replica``: which of the ``serving.replicas`` servers (0-based): its GPUs (:func:`gpu_share`) or, on CPU
    with more than one replica, its cores (:func:`cpu_share`; one replica binds every core, as before), of
    ``serving.cpus`` when set (the core split of asynchronous RL; ``rao eval`` binds all of them). Raises
    ServiceError for a replica beyond ``serving.replicas`` or more CPU replicas than cores. (``rao eval``,
    ``switching=False``, starts one server: on CPU it binds every core; on GPUs it takes replica 0's GPUs.)
    """
    s, lora = cfg.serving, cfg.trainer.lora
    if not 0 <= replica < s.replicas:
        raise ServiceError(f"replica {replica} of serving.replicas = {s.replicas}")
    gpu = has_cuda_gpu() if on_gpu is None else on_gpu
    pooled = s.replicas > 1 and switching  # `rao eval` (switching False) starts one server: every core
    split = (pooled or bool(s.cpus)) and not gpu and not cfg.gpus.serve  # serving.cpus: a core split
    cpus = cpu_share(replica, s.replicas if switching else 1, list(s.cpus) or None) if split else []
    return VLLMServer(
        model_path, served_model_name=s.served_model_name, max_model_len=s.max_model_len,
        kv_cache_gib=s.kv_cache_gib, extra_args=list(s.extra_args), logprobs_mode=s.logprobs_mode, dtype=s.dtype,
        enable_lora=switching and s.switch == "lora",
        max_lora_rank=vllm_max_lora_rank(lora.r) if lora is not None else 16,
        gpus=gpu_share(cfg, replica), cpus=cpus, tensor_parallel_size=s.tensor_parallel_size,
        data_parallel_size=s.data_parallel_size,
        gpu_memory_utilization=s.gpu_memory_utilization if gpu or cfg.gpus.serve else None,
        enable_sleep_mode=switching and cfg.gpus.sleep_while_training, on_gpu=on_gpu, dev_mode=switching,
        start_timeout_s=s.start_timeout_s, log_dir=log_dir)


def wait_for_server(base_url: str, timeout_s: float = 30.0, api_key: str | None = None) -> None:
    """Block until an OpenAI-compatible server answers ``GET {base_url}/models`` (``api_key``: the key sent,
    default :func:`~rao_core.policies.openai_policy.policy_client_key` of ``base_url``); raises ServiceError."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url.rstrip('/')}/models", timeout=5,
                         headers={"Authorization": f"Bearer {api_key or policy_client_key(base_url)}"}
                         ).status_code == 200:
                return
        except httpx.HTTPError as e:
            last = e
        time.sleep(0.5)
    raise ServiceError(f"no OpenAI-compatible server at {base_url} after {timeout_s:.0f} s ({last})")


def served_models(base_url: str, timeout_s: float = 30.0, api_key: str | None = None) -> list[str]:
    """The model names an OpenAI-compatible server serves (``GET {base_url}/models``: the served model name and
    every LoRA adapter loaded), how a replica reports what it serves after a checkpoint switch. ``api_key``: the
    key sent (default :func:`~rao_core.policies.openai_policy.policy_client_key` of ``base_url``). Raises
    ServiceError when it does not answer 200 with a model list."""
    try:
        r = httpx.get(f"{base_url.rstrip('/')}/models", timeout=timeout_s,
                      headers={"Authorization": f"Bearer {api_key or policy_client_key(base_url)}"})
        r.raise_for_status()
        return [str(m["id"]) for m in r.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise ServiceError(f"{base_url}/models did not list the served models: {type(e).__name__}: {e}") from None
