"""``rao run --plan``: what a campaign would start on a GPU machine, and whether it fits, without starting it.

:func:`build_plan` turns a campaign config and a machine (GPU count, memory per GPU) into a
:class:`Plan`: the GPUs each process gets (``gpus.serve`` with vLLM's tensor x data parallelism,
``gpus.train`` with the ``accelerate launch`` processes of ``trainer.accelerate_config``), the exact vLLM
and trainer command lines the campaign runs (built by the same functions: ``infra.serving.
server_from_config``, ``rao_core.train.launch.launch_command``), a memory estimate per GPU and phase, and
the expected time of a checkpoint switch. :func:`format_plan` prints it; ``Plan.problems`` lists what
cannot work (out of memory, a GPU index the machine lacks, placement and accelerate config that disagree).

The memory model is an estimate from the model's shape (``config.json`` of ``model.path``, or a built-in
shape for a model that is not on this machine) and the constants of :class:`Assumptions`, which the plan
prints. It follows what the code does today: the trainer keeps fp32 master weights of full fine-tuning and
loads a LoRA base in bf16 on one GPU or DDP, in fp32 under FSDP (``rao_core.train.trainer.policy_load_dtype``,
for a bf16-capable GPU); log-probs are computed in
chunks of ``trainer.logprob_chunk_tokens`` when the model's LM head is plain. None of the figures has been
measured on a GPU (docs/pipeline/gpu.md, "The paper's setting on GPUs").
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.model_shapes import KNOWN_SHAPES
from rao_core.config import CampaignConfig
from rao_core.paths import REPO_ROOT, rao_home

__all__ = ["Assumptions", "GpuUse", "ModelShape", "Plan", "build_plan", "format_plan", "detect_gpus"]

GiB = 1024 ** 3


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory depends on (HF ``config.json`` names)."""

    name: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    dtype_bytes: int = 2  # of the checkpoint (bf16 for Qwen3), what vLLM serves and the trainer saves
    source: str = "config.json"

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str, source: str) -> ModelShape:
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        return cls(name=name, model_type=cfg.get("model_type", "?"), hidden=h, layers=cfg["num_hidden_layers"],
                   heads=heads, kv_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or h // heads, intermediate=cfg["intermediate_size"],
                   vocab=cfg["vocab_size"], tied=bool(cfg.get("tie_word_embeddings", False)),
                   dtype_bytes=4 if str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))) == "float32" else 2,
                   source=source)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one block (Llama/Qwen naming)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}

    @property
    def params(self) -> int:
        """Parameter count: embeddings (+ untied LM head) + blocks (linears, two norms, q/k norms) + final norm."""
        block = sum(i * o for i, o in self.linear_shapes().values()) + 2 * self.hidden + 2 * self.head_dim
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return emb + self.layers * block + self.hidden

    def lora_params(self, r: int, targets: list[str]) -> int:
        """Parameters of rank-``r`` adapters (A: r x in, B: out x r) on the ``targets`` of every block."""
        return self.layers * sum(r * (i + o) for n, (i, o) in self.linear_shapes().items() if n in targets)

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """K and V of every layer for one token on one GPU of a tensor-parallel group (heads split by tp)."""
        return 2 * self.layers * max(1, self.kv_heads // tp) * self.head_dim * self.dtype_bytes


def model_shape(path: Path) -> ModelShape:
    """The shape of the model at ``path``: its config.json, else the built-in shape its folder name matches.
    Raises ValueError when neither is there."""
    if (path / "config.json").is_file():
        return ModelShape.from_config(json.loads((path / "config.json").read_text()), path.name,
                                      f"{path}/config.json")
    for key, cfg in KNOWN_SHAPES.items():
        if key in path.name.lower():
            return ModelShape.from_config(cfg, path.name, f"built-in shape of {key} ({path} is not on this machine)")
    raise ValueError(f"model.path = {path}: no config.json there and no built-in shape matches its name "
                     f"(known: {', '.join(KNOWN_SHAPES)})")


@dataclass(frozen=True)
class Assumptions:
    """Constants of the estimate (printed with every plan). Not measured on a GPU, except that the trainer's
    estimate was checked once against one H200 (docs/benchmarks/trainer.md, "Trainer on one GPU"): 12-15% above the
    measured peak (full weights: mostly the 10% allocator slack, which came to 1%; LoRA: the activations and
    logits, ~12.6 GiB measured against 17.0 assumed)."""

    cuda_context_gib: float = 1.0  # CUDA context, NCCL buffers, kernels: per process per GPU
    vllm_overhead_gib: float = 2.0  # vLLM's activation peak, CUDA graphs and sampler, outside weights and KV
    vllm_asleep_gib: float = 1.0  # what a level-1 sleeping vLLM keeps on each GPU
    fragmentation: float = 0.10  # the PyTorch caching allocator's slack on top of the trainer's tensors
    disk_gb_s: float = 1.0  # local disk, write and read
    s3_gb_s: float = 0.5  # upload to S3, SHA-256 included (the embedded SeaweedFS on local disk)
    host_to_gpu_gb_s: float = 10.0  # weights back from CPU memory when vLLM wakes
    lora_load_s: float = 0.1  # fixed cost of POST /v1/load_lora_adapter (0.09 s measured on CPU, tiny adapter)
    vllm_start_s: float = 90.0  # vLLM start-up on GPUs (load, profile, CUDA graph capture)
    master_bytes: int = 4  # fp32 master weights of full fine-tuning
    adam_bytes: int = 8  # two fp32 AdamW moments per trained parameter


@dataclass
class GpuUse:
    """Estimated memory (GiB) of one group of identical GPUs in one phase of an iteration."""

    gpus: list[int]
    phase: str  # "rollouts" (vLLM serving) or "training"
    parts: dict[str, float] = field(default_factory=dict)
    capacity: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


@dataclass
class Plan:
    """Everything ``rao run --plan`` prints; ``problems`` empty = the plan fits."""

    config: str
    gpus: int
    gpu_mem_gib: float
    shape: ModelShape
    placement: list[str] = field(default_factory=list)
    commands: list[tuple[str, str]] = field(default_factory=list)
    memory: list[GpuUse] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    switch: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    assumptions: Assumptions = field(default_factory=Assumptions)


def detect_gpus() -> tuple[int, float] | None:
    """(count, GiB of the smallest) of the NVIDIA GPUs ``nvidia-smi`` sees, or None."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    mib = [float(x) for x in out if x.replace(".", "").isdigit()]
    return (len(mib), min(mib) / 1024) if mib else None


def _accelerate(cfg: CampaignConfig) -> tuple[dict[str, Any], str | None]:
    """The trainer's accelerate config file (parsed; {} without one) and its path as configured."""
    p = cfg.trainer.accelerate_config
    if not p:
        return {}, None
    path = Path(p) if Path(p).is_absolute() else REPO_ROOT / p
    if not path.is_file():
        raise ValueError(f"trainer.accelerate_config = {p}: file not found")
    return yaml.safe_load(path.read_text()) or {}, p


def _gpu_ids(acc: dict[str, Any]) -> list[int] | None:
    ids = acc.get("gpu_ids")
    if ids in (None, "all"):
        return None
    return [int(x) for x in str(ids).split(",") if x.strip()]


def _ranges(ids: list[int]) -> str:
    ids = sorted(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def _serve_memory(cfg: CampaignConfig, shape: ModelShape, mem: float, a: Assumptions, plan: Plan) -> dict[str, float]:
    """vLLM's use of one serving GPU (GiB) and the KV-cache facts; problems go to ``plan.problems``."""
    from infra.serving import vllm_max_lora_rank

    s, tp = cfg.serving, cfg.serving.tensor_parallel_size
    budget = s.gpu_memory_utilization * mem
    weights = shape.params * shape.dtype_bytes / tp / GiB
    lora = 0.0
    if s.switch == "lora" and cfg.trainer.lora is not None:
        rank = vllm_max_lora_rank(cfg.trainer.lora.r)
        lora = shape.lora_params(rank, cfg.trainer.lora.target_modules) * shape.dtype_bytes / tp / GiB
    kv = budget - weights - lora - a.vllm_overhead_gib
    per_tok = shape.kv_bytes_per_token(tp)
    tokens = int(kv * GiB / per_tok) if kv > 0 else 0
    seqs = tokens / s.max_model_len
    want = cfg.runtime.max_concurrent_requests / (s.data_parallel_size * s.replicas)
    plan.facts.append(f"vLLM KV cache per replica: {max(kv, 0):.1f} GiB = {tokens:,} tokens at "
                      f"{per_tok / 1024:.0f} KiB/token: {seqs:.1f} sequences of max_model_len {s.max_model_len} "
                      f"(runtime.max_concurrent_requests {cfg.runtime.max_concurrent_requests} = {want:.0f} per "
                      f"replica; shorter contexts share the rest)")
    if tokens < s.max_model_len:
        plan.problems.append(f"vLLM KV cache holds {tokens:,} tokens per replica, less than one sequence of "
                             f"serving.max_model_len {s.max_model_len} (vLLM refuses to start): raise "
                             "serving.gpu_memory_utilization or tensor_parallel_size")
    return {"weights": weights, **({"lora_slots": lora} if lora else {}), "kv_cache": max(kv, 0.0),
            "overhead": a.vllm_overhead_gib}


def _train_memory(cfg: CampaignConfig, shape: ModelShape, acc: dict[str, Any], n: int, a: Assumptions,
                  plan: Plan) -> dict[str, float]:
    """One training process's use of its GPU (GiB)."""
    from rao_core.train.loss import PLAIN_LM_HEAD_MODEL_TYPES
    from rao_core.train.trainer import policy_load_dtype

    t, P = cfg.trainer, shape.params
    fsdp = acc.get("distributed_type") == "FSDP"
    strategy = (acc.get("fsdp_config") or {}).get("fsdp_sharding_strategy", "FULL_SHARD") if fsdp else "NO_SHARD"
    shard_params = n if strategy in ("FULL_SHARD", 1, "1") else 1
    shard_state = n if strategy in ("FULL_SHARD", "SHARD_GRAD_OP", 1, 2, "1", "2") else 1
    parts: dict[str, float] = {}
    if t.lora is not None:
        lp = shape.lora_params(t.lora.r, t.lora.target_modules)
        base = policy_load_dtype(t, "no" if t.dtype == "float32" else "bf16", acc.get("distributed_type", "NO"),
                                 cuda=True)  # as the trainer loads it on a bf16-capable GPU
        parts["weights"] = P * base.itemsize / shard_params / GiB
        parts["lora_adapter"] = lp * a.master_bytes / shard_params / GiB
        parts["grads+optimizer"] = lp * (a.master_bytes + a.adam_bytes) / shard_state / GiB
        kind = (f"LoRA r={t.lora.r} ({lp / 1e6:.0f} M trained parameters; base in "
                f"{str(base).removeprefix('torch.')} as the trainer loads it)")
    else:
        parts["weights"] = P * a.master_bytes / shard_params / GiB
        parts["grads+optimizer"] = P * (a.master_bytes + a.adam_bytes) / shard_state / GiB
        kind = f"full fine-tuning ({P / 1e9:.2f} B trained parameters, fp32 master weights + AdamW)"
        if t.kl_coef > 0:
            parts["kl_reference"] = P * a.master_bytes / GiB
    if fsdp and shard_params > 1:  # a wrapped block is gathered for compute (and the next one prefetched)
        block = (P - shape.vocab * shape.hidden) / shape.layers
        parts["weights"] += 2 * block * 2 / GiB
    T = t.micro_batch_tokens or 8192
    h, i, kv = shape.hidden, shape.intermediate, shape.kv_heads * shape.head_dim
    block_act = T * ((6 * h + 2 * kv + 4 * i) * 2 + 2 * h * 4)  # one block's saved tensors, bf16 + fp32 norms
    if t.gradient_checkpointing:
        parts["activations"] = (shape.layers * T * h * 4 + block_act) / GiB
    else:
        parts["activations"] = shape.layers * block_act / GiB
    chunked = t.logprob_chunk_tokens is not None and shape.model_type in PLAIN_LM_HEAD_MODEL_TYPES
    rows = min(t.logprob_chunk_tokens, T) if chunked else T
    parts["logits"] = rows * shape.vocab * 4 * 3 / GiB  # fp32 logits, log-softmax and their gradient
    parts["overhead"] = a.cuda_context_gib + a.fragmentation * sum(parts.values())
    plan.facts.append(f"trainer: {kind}; {n} process(es), "
                      + (f"FSDP {strategy}" if fsdp else "no sharding") + f"; micro-batch {T} tokens, "
                      + ("gradient checkpointing" if t.gradient_checkpointing else "no gradient checkpointing")
                      + "; log-probs " + (f"in chunks of {rows} tokens" if chunked else
                                          f"from the full [B, L, V] fp32 logits ({T} x {shape.vocab})"))
    return parts


def _switch_times(cfg: CampaignConfig, shape: ModelShape, a: Assumptions) -> list[str]:
    """Expected seconds from the end of training to the server answering with the new weights."""
    how = cfg.serving.switch
    out = []
    if how == "lora" and cfg.trainer.lora is not None:
        gb = shape.lora_params(cfg.trainer.lora.r, cfg.trainer.lora.target_modules) * 4 / 1e9
        s = gb / a.disk_gb_s + gb / a.s3_gb_s + gb / a.disk_gb_s + a.lora_load_s
        out.append(f"lora: adapter {gb:.2f} GB (fp32) saved, uploaded with SHA-256, loaded by "
                   f"POST /v1/load_lora_adapter: ~{s:.0f} s")
    elif how in ("reload", "restart"):
        gb = shape.params * shape.dtype_bytes / 1e9
        io = gb / a.disk_gb_s + gb / a.s3_gb_s + 2 * gb / a.disk_gb_s  # save, upload, copy to the served folder
        s = io + (gb / a.disk_gb_s if how == "reload" else a.vllm_start_s)
        out.append(f"{how}: checkpoint {gb:.1f} GB saved, uploaded with SHA-256, copied into the served folder, "
                   + ("reloaded in place (/collective_rpc reload_weights)" if how == "reload" else "vLLM restarted")
                   + f": ~{s:.0f} s; {2 * gb:.0f} GB of local disk per kept iteration")
    else:
        out.append("none: the external server keeps its weights")
    n = cfg.serving.pool_size
    if n > 1 and how != "none":
        out.append(f"pool: each of the {n} replicas gets the checkpoint"
                   + (" at the same time (one thread each); the stage returns when each lists the new model or "
                      "adapter on GET /v1/models" if not cfg.serving.external_urls else
                      " (POST /v1/load_lora_adapter to each); the stage returns when each took it"))
    if cfg.gpus.sleep_while_training:
        gb = shape.params * shape.dtype_bytes / cfg.serving.tensor_parallel_size / 1e9
        out.append(f"sleep/wake: level 1 moves {gb:.1f} GB per GPU to CPU memory and back: ~{2 * gb / a.host_to_gpu_gb_s:.0f} s "
                   "per iteration")
    return out


def rollout_placement(cfg: CampaignConfig) -> list[str]:
    """Where an iteration's rollouts run (``execution``): the shards and their groups
    (``infra.ray_rollouts.plan_shards``' rule), the Ray workers that grow them, the policy server replicas."""
    from rao_core.task_sampling import split_evenly

    ex, n, G = cfg.execution, cfg.tasks.tasks_per_iteration, cfg.algo.G
    if ex.backend == "local":
        out = [f"rollouts       this process (execution.backend local, no Ray): {n} groups x G {G} = {n * G} "
               f"trees per iteration, one run_trees"]
    else:
        sizes = split_evenly(n, min(ex.shards, n))
        out = [f"rollouts       Ray at {ex.ray_address}: {n} groups x G {G} = {n * G} trees per iteration in "
               f"{len(sizes)} shards of {', '.join(map(str, sizes))} groups (whole groups; the seeds of the local "
               f"backend)",
               f"Ray workers    one per shard running, {ex.cpus_per_shard:g} CPU each: the cluster's CPUs / "
               f"{ex.cpus_per_shard:g} at once, at most {len(sizes)}; {ex.max_retries} retries of a shard whose "
               f"worker is lost"]
    s = cfg.serving
    n_rep = s.pool_size
    k = s.tensor_parallel_size * s.data_parallel_size
    cpus = f"{ex.cpus_per_replica:g} Ray CPU" if ex.cpus_per_replica else "no Ray CPU"
    gpus = (f"GPUs {' | '.join(_ranges(cfg.gpus.serve[i * k:(i + 1) * k]) for i in range(n_rep))} of gpus.serve "
            f"when on the flow's node" if cfg.gpus.serve else f"{k} GPU each on a cluster with GPUs, as Ray assigns")
    actors = (f"vLLM as Ray actors (scheduling SPREAD over the nodes), {cpus} each, {gpus}, each server on its "
              f"node's IP") if ex.backend == "ray" and ex.ray_replicas else ""
    if n_rep == 1:
        where = (f"external at {s.base_url}" if s.base_url else
                 actors.replace("Ray actors", "a Ray actor").replace(" each", "") if actors else "vLLM")
        every = "every shard's requests" if ex.backend == "ray" else "every request"
        return out + [f"policy server  1 replica ({where}): {every} goes to it"]
    if s.base_urls:
        where = f"external at {', '.join(s.base_urls)}"
    elif actors:
        where = actors + ", started and switched by the serve stage"
    else:
        shares = [_ranges(cfg.gpus.serve[i * k:(i + 1) * k]) for i in range(n_rep)] if cfg.gpus.serve else []
        where = ("vLLM, GPUs " + " | ".join(shares) if shares else "vLLM on CPU, each its share of the cores") + \
            ", each its own port, started and switched by the serve stage"
    who = "each shard's trees" if ex.backend == "ray" else "the trees"
    return out + [f"policy server  {n_rep} replicas ({where}): {who} pinned one replica per tree for its whole life "
                  f"(prefix cache), a new tree to the replica with the fewest trees in flight"
                  + (" (counted per shard, ties from replica shard index mod N)" if ex.backend == "ray" else "")
                  + "; a checkpoint switch reaches every replica before the next stage; a replica lost ends its "
                  "trees policy_error, the others go on"]


def build_plan(cfg: CampaignConfig, gpus: int, gpu_mem_gib: float, *, config_name: str = "",
               assumptions: Assumptions | None = None) -> Plan:
    """The plan of ``cfg`` on a machine of ``gpus`` GPUs of ``gpu_mem_gib`` GiB each (module docstring)."""
    from infra.serving import server_from_config, vllm_max_lora_rank
    from rao_core.train.launch import launch_command

    a = assumptions or Assumptions()
    plan = Plan(config=config_name, gpus=gpus, gpu_mem_gib=gpu_mem_gib, shape=model_shape(cfg.model.path),
                assumptions=a)
    s, g, t = cfg.serving, cfg.gpus, cfg.trainer
    try:
        acc, acc_path = _accelerate(cfg)
    except ValueError as e:
        plan.problems.append(str(e))
        acc, acc_path = {}, None
    for name, ids in (("gpus.serve", g.serve), ("gpus.train", g.train)):
        bad = [i for i in ids if i >= gpus]
        if bad:
            plan.problems.append(f"{name} = {ids}: GPU {bad[0]} does not exist on a machine of {gpus} GPU(s)")
    if not g.serve and not s.external_urls:
        plan.problems.append("gpus.serve is empty: say which GPUs vLLM gets")
    if not g.train:
        plan.problems.append("gpus.train is empty: say which GPUs the trainer gets")
    n_train = max(1, len(g.train))
    if len(g.train) > 1 and not acc:
        plan.problems.append(f"gpus.train has {len(g.train)} GPUs but trainer.accelerate_config is not set "
                             "(one process would train)")
    if acc:
        if int(acc.get("num_processes", 1)) != n_train:
            plan.problems.append(f"{acc_path}: num_processes {acc.get('num_processes')} != {n_train} GPU(s) of "
                                 "gpus.train")
        ids = _gpu_ids(acc)
        if ids is not None and g.train and ids != g.train:
            plan.problems.append(f"{acc_path}: gpu_ids {_ranges(ids)} != gpus.train {_ranges(g.train)}")
    if t.process != "subprocess" and g.train:
        plan.problems.append("trainer.process 'inline' trains in the flow process on its first visible GPU; "
                             "use 'subprocess' (accelerate launch) with gpus.train")
    if t.lora is not None and s.switch == "lora":
        try:
            vllm_max_lora_rank(t.lora.r)
        except ValueError as e:
            plan.problems.append(str(e))
            return plan
    shared = sorted(set(g.serve) & set(g.train))

    # placement and commands (the same builders the campaign uses)
    if s.external_urls:
        plan.placement.append(f"vLLM server    external at {', '.join(s.external_urls)} (switch '{s.switch}')")
    else:
        from infra.serving import gpu_share

        for i in range(s.replicas):
            gpus_i = gpu_share(cfg, i)
            label = "vLLM server   " if s.replicas == 1 else f"vLLM replica {i + 1}"
            plan.placement.append(f"{label} GPUs {_ranges(gpus_i) or '-'}: tensor parallel "
                                  f"{s.tensor_parallel_size} x data parallel {s.data_parallel_size}")
            # the campaign serves a copy of the checkpoint (infra/serving_pool.py: $RAO_HOME/campaigns/NAME/served)
            srv = server_from_config(cfg, rao_home() / "campaigns" / cfg.name / "served", on_gpu=True, replica=i)
            srv.port = 8000 + i  # a free port is picked at start
            if cfg.execution.backend == "ray" and cfg.execution.ray_replicas:
                srv.host = "NODE_IP"  # a Ray actor's server listens on its node's address
            env = srv._env()
            shown = {k: env[k] for k in ("CUDA_VISIBLE_DEVICES", "VLLM_SERVER_DEV_MODE",
                                         "VLLM_ALLOW_RUNTIME_LORA_UPDATING") if k in env}
            plan.commands.append(("vLLM" if s.replicas == 1 else f"vLLM replica {i + 1}/{s.replicas}",
                                  " ".join(f"{k}={v}" for k, v in shown.items()) + " " + shlex.join(srv._cmd())))
    plan.placement.append(f"trainer        GPUs {_ranges(g.train) or '-'}: accelerate launch, {n_train} "
                          f"process(es)" + (f" ({acc_path})" if acc_path else ""))
    if shared:
        plan.placement.append(f"shared GPUs    {_ranges(shared)}: "
                              + ("vLLM sleeps (level 1) while the trainer runs" if g.sleep_while_training
                                 else "vLLM stays resident while the trainer runs"))
    if cfg.algo.max_staleness >= 1:  # rao_core.async_rl: the two sides of a step hold their GPUs at once
        plan.placement.append(
            f"asynchronous   algo.max_staleness {cfg.algo.max_staleness}: in step k vLLM (GPUs "
            f"{_ranges(g.serve) or '-'}) serves checkpoint k-1, evaluates it and generates iteration k+1 while the "
            f"trainer (GPUs {_ranges(g.train) or '-'}) trains iteration k on trees one version old"
            + (f"; GPUs {_ranges(shared)} hold both at once" if shared else "; no GPU is shared"))
    plan.placement += rollout_placement(cfg)
    camp = rao_home() / "campaigns" / cfg.name  # iteration 1's paths (tasks/stages.py: _train)
    parent = cfg.model.path if cfg.warm_start.mode == "none" else camp / "checkpoints/iter-0"
    cmd = launch_command(camp / "iter-1/samples.jsonl", parent, camp / "checkpoints/iter-1",
                         camp / "checkpoints/iter-1.train-io/trainer.json",
                         camp / "checkpoints/iter-1.train-io/metrics.jsonl", iteration=1, accelerate_config=acc_path,
                         max_staleness=cfg.algo.max_staleness, cpus=cfg.trainer.cpus)
    plan.commands.append(("trainer (iteration 1)", shlex.join(cmd)))

    # memory per GPU and phase
    mem = gpu_mem_gib
    serve = _serve_memory(cfg, plan.shape, mem, a, plan) if g.serve else {}
    train = _train_memory(cfg, plan.shape, acc, n_train, a, plan)
    asleep = {"vllm_asleep": a.vllm_asleep_gib}
    only_serve = sorted(set(g.serve) - set(g.train))
    only_train = sorted(set(g.train) - set(g.serve))
    if only_serve:
        plan.memory.append(GpuUse(only_serve, "rollouts+training", serve, mem))
    if only_train:
        plan.memory.append(GpuUse(only_train, "training", train, mem))
    if shared:
        plan.memory.append(GpuUse(shared, "rollouts", serve, mem))
        during = {**(asleep if g.sleep_while_training else {"vllm_resident": sum(serve.values())}), **train}
        plan.memory.append(GpuUse(shared, "training", during, mem))
    for u in plan.memory:
        if not u.fits:
            top = max(u.parts, key=u.parts.get)
            plan.problems.append(f"GPU {_ranges(u.gpus)} ({u.phase}) needs {u.total:.1f} GiB of {u.capacity:.0f} GiB "
                                 f"(largest part: {top} {u.parts[top]:.1f} GiB)")
    plan.switch = _switch_times(cfg, plan.shape, a)
    return plan


_COLUMNS = ["weights", "lora_slots", "kv_cache", "lora_adapter", "grads+optimizer", "kl_reference", "activations",
            "logits", "overhead"]


def format_plan(plan: Plan) -> str:
    """The plan as text (what ``rao run --plan`` prints)."""
    sh = plan.shape
    out = [f"plan of {plan.config} on {plan.gpus} GPU(s) x {plan.gpu_mem_gib:g} GiB (nothing is started)",
           f"model: {sh.name} ({sh.params / 1e9:.2f} B parameters, {sh.layers} layers, hidden {sh.hidden}, "
           f"vocab {sh.vocab}; {sh.source})", "", "placement"]
    out += [f"  {p}" for p in plan.placement]
    out += ["", "commands"] + [f"  {name}: {c}" for name, c in plan.commands]
    if plan.memory:
        cols = [c for c in _COLUMNS if any(c in u.parts for u in plan.memory)]
        extra = sorted({k for u in plan.memory for k in u.parts} - set(cols))
        head = ["GPU", "phase", *cols, *extra, "total", "of"]
        rows = [[_ranges(u.gpus), u.phase, *(f"{u.parts[c]:.1f}" if c in u.parts else "-" for c in cols),
                 *(f"{u.parts[c]:.1f}" if c in u.parts else "-" for c in extra), f"{u.total:.1f}",
                 f"{u.capacity:.0f}" + ("" if u.fits else " OVER")] for u in plan.memory]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        out += ["", "memory per GPU (GiB, estimated)"]
        out += ["  " + "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                for r in [head, *rows]]
    out += [""] + [f"  {f}" for f in plan.facts]
    out += ["", "checkpoint switch (expected)"] + [f"  {x}" for x in plan.switch]
    a = plan.assumptions
    out += ["", f"assumptions: CUDA context {a.cuda_context_gib} GiB/process, vLLM overhead {a.vllm_overhead_gib} "
                f"GiB, asleep vLLM {a.vllm_asleep_gib} GiB, allocator slack {a.fragmentation:.0%}, disk "
                f"{a.disk_gb_s} GB/s, S3 {a.s3_gb_s} GB/s, vLLM start {a.vllm_start_s:.0f} s; not measured on a "
                "GPU (the trainer's peak: checked once on an H200, this estimate 12-15% above it; "
                "docs/benchmarks/trainer.md)"]
    if plan.problems:
        out += ["", "does not fit / cannot run:"] + [f"  - {p}" for p in plan.problems]
    return "\n".join(out)


def plan_config(config: str, overrides: list[str], *, name: str | None = None, iterations: int | None = None):
    """The campaign config ``rao run --plan`` plans: ``config`` (a relative path also looked up in the
    repository) with the overrides, paths not checked (the plan is for another machine). Raises ConfigError
    (one line) for a config or override mistake."""
    from rao_core.config import load_config

    path = Path(config)
    if not path.is_absolute() and not path.exists():
        path = REPO_ROOT / path
    ov = list(overrides) + ([f"name={name}"] if name else []) + \
        ([f"iterations={iterations}"] if iterations is not None else [])
    return load_config(path, ov, check_paths=False).with_env_overrides()


def run_plan(config: str, overrides: list[str], *, name: str | None = None, iterations: int | None = None,
             gpus: int | None = None, gpu_mem_gib: float | None = None, echo=print) -> Plan:
    """``rao run --plan``: load ``config`` (:func:`plan_config`), plan it for ``gpus`` x ``gpu_mem_gib``
    (default: the GPUs nvidia-smi sees), print it with ``echo``. Raises ConfigError for a config mistake, and
    ValueError (one line) when there is no machine to plan for or the plan does not fit."""
    cfg = plan_config(config, overrides, name=name, iterations=iterations)
    if gpus is None or gpu_mem_gib is None:
        seen = detect_gpus()
        if seen is None:
            if gpus is None and gpu_mem_gib is None:
                raise ValueError("no NVIDIA GPU visible here: give the target machine as --gpus N --gpu-mem-gib M")
            missing = "--gpu-mem-gib M" if gpu_mem_gib is None else "--gpus N"
            raise ValueError(f"no NVIDIA GPU visible here: give the target machine's {missing} too")
        gpus, gpu_mem_gib = gpus or seen[0], gpu_mem_gib or seen[1]
    plan = build_plan(cfg, gpus, gpu_mem_gib, config_name=config)
    echo(format_plan(plan))
    if plan.problems:
        more = f" (and {len(plan.problems) - 1} more, listed above)" if len(plan.problems) > 1 else ""
        raise ValueError(f"plan of {config} on {gpus} x {gpu_mem_gib:g} GiB cannot run: {plan.problems[0]}{more}")
    return plan
