"""The RAO trainer: one policy update (or SFT warm start) from training samples to a new checkpoint.

``train(samples, model_path, out_dir, config)`` loads an HF checkpoint (full weights, or a LoRA adapter to
continue), checks every sample before any step, cuts the batch into minibatches of whole groups (one optimizer step
each; by default one, the authors' one step per batch: platoon 0.4.0 and ApGa/platoon
``platoon/train/tinker/rl.py``, ``num_minibatches: 1``), builds length-sorted padded micro-batches within each,
applies the token-level loss of :mod:`rao_core.train.loss` (weighted by w_d * A_n, Eqs. 4-5 of docs/algorithm.md)
with gradient accumulation and clipping, optionally stops the minibatch loop at an approximate KL
(``target_kl``, stable-baselines3's PPO; off by default, as the authors), and saves the result atomically as a
folder vLLM loads as is, with the AdamW state the next iteration continues (:mod:`rao_core.train.checkpoint`).
Devices and processes go through ``accelerate.Accelerator``: the same code runs on one CPU process and under
``accelerate launch`` (FSDP) on GPUs; under FSDP the (sharded) optimizer state is not saved yet. Project choices:
no sequence packing, a constant learning rate after an optional linear warm-up (a departure: the authors have
none), samples with w_d * A_n = 0 not run (``skip_zero_advantage``; same update), the KL stop taking the step that
exceeds the target (stable-baselines3 skips it). On one CPU process (the CPU path; each the same update, tested in
tests/algo/test_fast_step.py): a micro-batch runs one forward per group of equal-length rows, so no padding token is
computed and attention takes the causal kernel without a mask (``row_execution``); bf16 compute is a bf16 copy of
the fp32 master weights, its gradients added into fp32 ones after each micro-batch (``bf16_weights``; autocast
would cast every weight on every forward); AdamW is the fused one; deterministic algorithms are on, so the same
inputs give the same weights. Docs: docs/algorithm.md#the-trainers-steps, docs/benchmarks/trainer.md.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rao_core.progress import ProgressCallback, StepProgress
from rao_core.samples import Sample, SampleBatch, check_staleness, read_samples, sample_staleness
from rao_core.train.checkpoint import (MANIFEST_NAME, atomic_folder, check_out_folder, data_hash, is_lora_checkpoint,
                                      read_manifest)
from rao_core.train.config import TrainerConfig, cpu_has_bf16
from rao_core.train.data import MicroBatch, collate, make_micro_batches, minibatch_partition, validate_samples
from rao_core.train.loss import (
    PLAIN_LM_HEAD_MODEL_TYPES,
    chunked_token_logprobs,
    model_hidden_states,
    policy_loss,
    token_logprobs,
)
from rao_core.train.objectives import LOSSES

__all__ = ["OPTIMIZER_DIR", "TrainResult", "epoch_order", "policy_load_dtype", "train"]

StepCallback = Callable[[dict[str, float]], None]
OPTIMIZER_DIR = "optimizer"  # sub-folder of a checkpoint holding the optimizer/scheduler state
_OPTIMIZER_FILE = "state.pt"


def epoch_order(n_micro_batches: int, *, seed: int, iteration: int, epoch: int, shuffle: bool = True) -> list[int]:
    """Order in which the micro-batches of one epoch are trained.

    A permutation of ``range(n_micro_batches)``, shuffled with a generator seeded by
    ``(seed, iteration, epoch)`` when ``shuffle`` (identity otherwise): the same call gives the same
    order, and a new iteration gives a new order, so that ``max_steps`` cutting an epoch short does not
    train the same micro-batches at every iteration.
    """
    order = list(range(n_micro_batches))
    if shuffle:
        random.Random(f"rao-shuffle|{seed}|{iteration}|{epoch}").shuffle(order)
    return order


def _load_optimizer_state(model_path: Path, cfg: TrainerConfig, n_params: int) -> tuple[dict[str, Any] | None, str]:
    """The parent checkpoint's optimizer state if it can continue this run, else (None, why not)."""
    f = model_path / OPTIMIZER_DIR / _OPTIMIZER_FILE
    if cfg.optimizer_state == "reset":
        return None, "reset by config"
    if not f.exists():
        return None, "parent checkpoint has no optimizer state"
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged state file must not stop training; say so
        return None, f"unreadable optimizer state {f}: {type(e).__name__}: {e}"
    if state.get("loss_type") != cfg.loss_type or bool(state.get("lora")) != (cfg.lora is not None):
        return None, (f"parent state is from loss_type={state.get('loss_type')} lora={state.get('lora')}, "
                      f"this run is loss_type={cfg.loss_type} lora={cfg.lora is not None}")
    groups = state["optimizer"].get("param_groups", [])
    if sum(len(g["params"]) for g in groups) != n_params:
        return None, "parent state is for a different set of trainable parameters"
    return state, "continued"


@dataclass
class TrainResult:
    """What one call of :func:`train` produced."""

    checkpoint: Path  # the saved checkpoint folder (== out_dir)
    metrics: list[dict[str, float]] = field(default_factory=list)  # one dict per optimizer step
    manifest: dict[str, Any] = field(default_factory=dict)  # contents of rao-checkpoint.json


def _as_samples(samples: SampleBatch | Sequence[Sample] | str | os.PathLike[str]) -> list[Sample]:
    if isinstance(samples, (str, os.PathLike)):
        return read_samples(samples).samples
    if isinstance(samples, SampleBatch):
        return list(samples.samples)
    return list(samples)


def _resolve_base(model_path: Path) -> tuple[Path, Path | None]:
    """(base model folder, adapter folder or None)."""
    if is_lora_checkpoint(model_path):
        cfg = json.loads((model_path / "adapter_config.json").read_text())
        base = Path(cfg.get("base_model_name_or_path") or "")
        if not (base / "config.json").exists():
            raise ValueError(f"{model_path} is a LoRA adapter whose base model {base} has no config.json")
        return base, model_path
    if not (model_path / "config.json").exists():
        raise ValueError(f"{model_path} is not a checkpoint folder (no config.json or adapter_config.json)")
    return model_path, None


def _sync_each_micro_batch(distributed_type: Any) -> bool:
    """accelerate's ``sync_each_batch``: FSDP reduce-scatters each micro-batch's gradients into the shards (its
    ``no_sync`` would hold a full unsharded gradient per process until the step's last micro-batch); one process
    and DDP synchronise only on the last micro-batch of a step."""
    from accelerate.utils import DistributedType

    return distributed_type == DistributedType.FSDP


def _accelerator(cfg: TrainerConfig) -> Any:
    """The ``Accelerator`` of one :func:`train` call: mixed precision from :func:`_compute_dtype`; gradient
    accumulation through ``accelerator.accumulate`` with the step boundaries set by :func:`_optimizer_step`
    (``num_steps`` is set per step: the last step of an epoch may have fewer micro-batches), never tied to a
    dataloader, the learning-rate scheduler stepped by the trainer itself."""
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    plugin = GradientAccumulationPlugin(num_steps=1, adjust_scheduler=False, sync_with_dataloader=False)
    mixed = "no" if _bf16_weights(cfg) else _compute_dtype(cfg)  # a bf16 weight copy needs no autocast
    accelerator = Accelerator(mixed_precision=mixed, gradient_accumulation_plugin=plugin)
    accelerator.gradient_state.plugin_kwargs["sync_each_batch"] = _sync_each_micro_batch(accelerator.distributed_type)
    return accelerator


def policy_load_dtype(cfg: TrainerConfig, mixed_precision: str, distributed_type: str, *,
                      cuda: bool | None = None) -> torch.dtype:
    """The dtype the policy's weights are loaded in: bf16 for a LoRA base (frozen, so no fp32 master copy is needed;
    peft keeps the adapter in fp32) when training runs in bf16 autocast on a GPU, else fp32 (full weights are the
    fp32 master weights; CPU: unchanged). Not under FSDP: FSDP 1 flattens each wrapped block into one tensor of one
    dtype and refuses a bf16 base beside fp32 adapter weights; its mixed precision computes in bf16 anyway.

    Args:
        cfg: the trainer config (``lora`` set or not).
        mixed_precision: accelerate's ``mixed_precision`` (:func:`_compute_dtype`: "bf16" or "no").
        distributed_type: accelerate's ``DistributedType`` (a str enum) or its name in an accelerate config.
        cuda: training runs on CUDA GPUs (None: ``torch.cuda.is_available()``; ``rao run --plan`` passes True).
    """
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if cfg.lora is not None and mixed_precision == "bf16" and cuda and distributed_type != "FSDP":
        return torch.bfloat16
    return torch.float32


def _compute_dtype(cfg: TrainerConfig) -> str:
    """accelerate's ``mixed_precision`` for ``cfg.dtype``: 'auto' is bf16 on a bf16-capable GPU, else fp32;
    'bfloat16' is bf16 autocast on such a GPU or on a CPU with native bf16 (fp32 master weights either way);
    'bfloat16_if_native' is bf16 where that holds, else fp32 (never an error).

    Raises:
        ValueError: 'bfloat16' on a machine with neither.
    """
    if cfg.dtype == "float32":
        return "no"
    gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if cfg.dtype == "auto":
        return "bf16" if gpu_bf16 else "no"
    native = gpu_bf16 or (not torch.cuda.is_available() and cpu_has_bf16())
    if cfg.dtype == "bfloat16_if_native":
        return "bf16" if native else "no"
    if not native:  # 'bfloat16'
        raise ValueError("dtype='bfloat16' needs a bf16-capable GPU or CPU (avx512_bf16/amx_bf16); "
                         "use 'auto' or 'float32'")
    return "bf16"


def _one_cpu_process() -> bool:
    """Training runs as one process on the CPU (no CUDA device, WORLD_SIZE unset or 1: before the accelerator)."""
    return not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) == 1


def _bf16_weights(cfg: TrainerConfig) -> bool:
    """``cfg.bf16_weights`` resolved: a bf16 compute copy of fp32 master weights (:func:`_compute_copy`) when the
    compute dtype is bf16 and the setting is 'on', or 'auto' on one CPU process without LoRA."""
    if cfg.bf16_weights == "off" or cfg.lora is not None or _compute_dtype(cfg) != "bf16":
        return False
    return cfg.bf16_weights == "on" or _one_cpu_process()


def _per_length(cfg: TrainerConfig) -> bool:
    """``cfg.row_execution`` resolved: one forward per group of equal-length rows ('auto': on one CPU process)."""
    return cfg.row_execution == "per_length" or (cfg.row_execution == "auto" and _one_cpu_process())


def _compute_copy(model: Any) -> Any:
    """A bf16 copy of ``model`` that runs forward and backward (same module tree, so ``parameters()`` pairs up
    with the master's, tied weights included); the master keeps the fp32 weights AdamW updates."""
    import copy

    compute = copy.deepcopy(model).to(torch.bfloat16)
    compute.train()
    return compute


def _fold_grads(run: "_Session") -> None:
    """Add the compute copy's bf16 gradients into the master weights' fp32 gradients and drop them (after each
    micro-batch, so a step's micro-batches accumulate in fp32). No-op without a compute copy."""
    if run.compute is run.model:
        return
    for m, c in zip(run.model.parameters(), run.compute.parameters()):
        if c.grad is None:
            continue
        if m.grad is None:
            m.grad = c.grad.to(torch.float32)
        else:
            m.grad.add_(c.grad)
        c.grad = None


def _sync_compute(run: "_Session") -> None:
    """Copy the master weights into the bf16 compute copy (after each optimizer step and a restore)."""
    if run.compute is run.model:
        return
    with torch.no_grad():
        for m, c in zip(run.model.parameters(), run.compute.parameters()):
            c.copy_(m)


@dataclass
class _Warmup:
    """The learning-rate factor of optimizer step ``s`` of this call: linear warm-up over the steps of ALL
    iterations (``steps_before``: restored from the parent checkpoint), then constant."""

    warmup_steps: int
    steps_before: int = 0

    def __call__(self, s: int) -> float:
        return min(1.0, (s + 1 + self.steps_before) / self.warmup_steps) if self.warmup_steps else 1.0


@dataclass
class _Session:
    """What the steps of one :func:`train` call share (built by :func:`_start`)."""

    cfg: TrainerConfig
    accelerator: Any
    model: Any
    ref_model: Any | None  # full-weight KL reference (kl_coef > 0 without LoRA), else None
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    warmup: _Warmup
    lm_chunk: int | None  # tokens per chunk of the LM head, None: the full-logits path
    pad_id: int
    tied: bool  # tie_word_embeddings of the loaded model (checked again at save time)
    compute: Any = None  # the module that runs forward and backward: ``model`` itself, or its bf16 copy
    per_length: bool = False  # one forward per group of equal-length rows of a micro-batch (no padding)
    optim_why: str = ""  # "continued" when the parent checkpoint's optimizer state was restored, else why not
    sharded: bool = False  # FSDP: the optimizer state is sharded, not saved
    base_dtype: torch.dtype = torch.float32  # the loaded weights' dtype (:func:`policy_load_dtype`)
    steps: int = 0  # optimizer steps taken by this call
    off_policy: bool = False  # some kept sample came from an older checkpoint (decoupled loss, asynchronous RL)

    def logprobs(self, m: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, L] float32 log-probs of the batch's tokens under model ``m`` (chunked LM head when possible,
        then only at the trained tokens, ``loss_mask``; 0 elsewhere)."""
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if bool(batch["attention_mask"].all()):  # no padding: the causal kernel without a mask
            inputs["attention_mask"] = None
        with self.accelerator.autocast():
            if self.lm_chunk is not None:
                head = self.accelerator.unwrap_model(m).get_output_embeddings()
                hidden = model_hidden_states(m, head, **inputs)  # [B, L, H]
                return chunked_token_logprobs(hidden, head, batch["input_ids"], self.cfg.temperature, self.lm_chunk,
                                              mask=batch["loss_mask"])  # the LM head only where the loss reads
            logits = m(**inputs).logits  # [B, L, V]
        return token_logprobs(logits, batch["input_ids"], self.cfg.temperature)


def train(
    samples: SampleBatch | Sequence[Sample] | str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    config: TrainerConfig | None = None,
    *,
    iteration: int = 0,
    on_step: StepCallback | None = None,
    on_progress: ProgressCallback | None = None,
    show_progress: bool | None = None,
    on_phase: Callable[[str], None] | None = None,
    max_staleness: int = 0,
    parent_version: int | None = None,
) -> TrainResult:
    """Train the policy on ``samples`` starting from ``model_path``; save the new checkpoint at ``out_dir``.

    Steps (docs/algorithm.md, "Loss" and "What the trainer learns from"): check every sample
    (:func:`rao_core.train.data.validate_samples`); :func:`_start` the accelerator, policy, reference and
    optimizer (continuing the parent's AdamW state); :func:`_skip_zero_coefficient` (samples whose
    w_d * A_n of Eqs. (4)-(5) is 0); :func:`_schedule` (minibatches of whole groups, micro-batches);
    :func:`_train_epochs` of :func:`_optimizer_step` (the token-level loss of ``rao_core.train.loss``) until the
    schedule ends or the ``target_kl`` stop; :func:`_manifest` and :func:`_save`.

    Args:
        samples: a :class:`SampleBatch`, a list of :class:`Sample`, or a ``.jsonl``/``.parquet`` path.
        model_path: HF checkpoint folder (full weights), or a LoRA checkpoint folder written by this
            trainer (then ``config.lora`` must be set and training continues that adapter).
        out_dir: the checkpoint folder to write (replaced atomically if it exists: only an empty folder or a
            checkpoint, :func:`rao_core.train.checkpoint.check_out_folder`).
        config: :class:`TrainerConfig` (defaults if None).
        iteration: RL iteration number, recorded in the manifest.
        on_step: called with each step's metrics dict (main process only).
        on_progress: called with ``(steps done, steps planned)`` after each optimizer step (main process
            only); steps planned = the steps of :func:`_schedule` (``epochs`` x minibatches, at most ``max_steps``),
            lowered to the steps taken when the ``target_kl`` stop ends the call.
        show_progress: False: no terminal bar; None/True: a rich bar "training steps" on the main process
            when stdout is a terminal (:class:`rao_core.progress.StepProgress`).
        on_phase: called with one line as each phase begins (main process only): ``samples checked (N);
            loading the model``, ``model and optimizer ready; first optimizer step running`` (loading takes a
            while on a CPU, and so does one step), ``saving checkpoint``.
        max_staleness: asynchronous RL (``algo.max_staleness``, docs/algorithm/async-rl.md): samples
            may come from checkpoints up to this many versions older than ``model_path``; those that do are
            trained with the decoupled off-policy loss (:func:`_proximal_logprobs`). 0: every sample must come
            from ``model_path`` itself (or carry no version).
        parent_version: the policy version of ``model_path`` (None: ``max(iteration - 1, 0)``, the campaign's
            numbering: checkpoint ``iter-K`` is version K).

    Returns:
        :class:`TrainResult` with the checkpoint path, the per-step metrics and the manifest.

    Raises:
        OutFolderError: ``out_dir`` exists and is not an empty folder or a checkpoint (before anything else).
        ValueError: bad samples (see :func:`rao_core.train.data.validate_samples`), a LoRA adapter as
            ``model_path`` without ``config.lora``, untied embeddings at save time; all before any step
            except the last.
        StaleSamplesError: a sample more than ``max_staleness`` versions older than ``model_path``
            (:func:`rao_core.samples.check_staleness`), or (ValueError) newer than it; before the model loads.
    """
    from transformers import AutoConfig

    cfg = config or TrainerConfig()
    check_out_folder(out_dir, "out_dir")  # nothing but a checkpoint is replaced there
    model_path, out_dir = Path(model_path).resolve(), Path(out_dir).resolve()
    all_rows = _as_samples(samples)
    base_path, adapter_path = _resolve_base(model_path)
    if adapter_path is not None and cfg.lora is None:
        raise ValueError(f"{model_path} is a LoRA adapter: set config.lora to continue training it")
    hf_cfg = AutoConfig.from_pretrained(base_path)
    save_dtype = getattr(hf_cfg, "dtype", None) or torch.float32  # checkpoints keep the parent's dtype
    if isinstance(save_dtype, str):
        save_dtype = getattr(torch, save_dtype)
    validate_samples(all_rows, vocab_size=int(hf_cfg.vocab_size), loss_type=cfg.loss_type,
                     max_length=getattr(hf_cfg, "max_position_embeddings", None))
    parent_version = max(iteration - 1, 0) if parent_version is None else parent_version
    staleness = check_staleness(all_rows, parent_version, max_staleness)  # lag -> samples; refuses older ones
    main = os.environ.get("RANK", "0") == "0"  # before the accelerator exists: accelerate launch sets RANK

    def phase(name: str) -> None:
        if on_phase is not None and main:
            on_phase(name)

    phase(f"samples checked ({len(all_rows)}); loading the model")
    run = _start(cfg, model_path, base_path, adapter_path, getattr(hf_cfg, "model_type", None), iteration)
    rows, _ = _skip_zero_coefficient(all_rows, cfg)
    # by groups and lengths only: the same for the rows _proximal_logprobs returns
    mbs, schedule = _schedule(all_rows, rows, cfg, iteration, run.accelerator.num_processes)
    trained = _trained_rows(mbs, schedule)  # max_steps may leave some out
    lags = [lag if i in trained else 0 for i, lag in enumerate(sample_staleness(rows, parent_version))]
    rows = _proximal_logprobs(run, rows, lags, phase)
    rows_hash = data_hash(all_rows)  # the resume point's key and the manifest's data_hash
    resume = _ResumePoint(out_dir.with_name(out_dir.name + ".resume"),
                          f"{rows_hash}:{cfg.config_hash()}:{model_path}:{iteration}")
    done = resume.load(run)  # the metrics of the steps an interrupted run of the same inputs already took
    phase(f"resumed after optimizer step {len(done)} ({resume.folder})" if done else
          "model and optimizer ready; first optimizer step running")
    metrics = _train_epochs(run, rows, mbs, schedule, on_step, on_progress,
                            show_progress is not False and run.accelerator.is_main_process, resume=resume, done=done)
    if len(metrics) < len(schedule):
        phase(f"approximate KL {metrics[-1]['train/approx_kl']:.4g} > target_kl {cfg.target_kl:g} at optimizer step "
              f"{len(metrics)}: the remaining {len(schedule) - len(metrics)} step(s) skipped")
    phase("saving checkpoint")
    manifest = _manifest(run, model_path, base_path, all_rows, rows, metrics, iteration, rows_hash, len(schedule))
    manifest["policy_version"] = {"parent": parent_version, "max_staleness": max_staleness,
                                  "staleness": {str(k): v for k, v in sorted(staleness.items())}}
    optim_state = None if run.sharded else {
        "optimizer": run.optimizer.state_dict(), "steps": run.warmup.steps_before + run.steps,
        "loss_type": cfg.loss_type, "lora": cfg.lora is not None}
    _save(run.accelerator, run.model, run.tokenizer, out_dir, manifest, tied=run.tied, lora=cfg.lora is not None,
          save_dtype=save_dtype, optim_state=optim_state)
    run.accelerator.wait_for_everyone()
    resume.remove()
    return TrainResult(checkpoint=out_dir, metrics=metrics, manifest=manifest)


def _load_policy(cfg: TrainerConfig, base_path: Path, adapter_path: Path | None,
                 base_dtype: torch.dtype = torch.float32, reference_path: Path | None = None,
                 ) -> tuple[Any, Any | None, bool]:
    """(policy, full-weight KL reference or None, tie_word_embeddings): the weights in ``base_dtype``
    (:func:`policy_load_dtype`: fp32 master weights, or a bf16 LoRA base), LoRA via peft (adapter in fp32).
    The full-weight reference is ``reference_path`` (``cfg.kl_reference`` resolved), else ``base_path``."""
    from transformers import AutoModelForCausalLM

    def load(dtype: torch.dtype = torch.float32) -> Any:
        return AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype, attn_implementation="sdpa")

    model = load(base_dtype)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if cfg.gradient_checkpointing:
        # activation_checkpointing_enable: transformers' newer name (gradient_checkpointing_enable is deprecated
        # there); 5.17 (the GPU machine's) has only the old one
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        model.config.use_cache = False
        if cfg.lora is not None:
            model.enable_input_require_grads()  # frozen embeddings: let checkpointed blocks see a grad input
    ref_model = None
    if cfg.lora is not None:
        from peft import LoraConfig, PeftModel, get_peft_model

        if adapter_path is not None:
            model = PeftModel.from_pretrained(model, adapter_path, is_trainable=True, autocast_adapter_dtype=True)
        else:
            lc = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                            target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
            model = get_peft_model(model, lc, autocast_adapter_dtype=True)  # a bf16 base's adapter in fp32
    elif cfg.kl_coef > 0:  # full weights: a frozen copy is the reference (with LoRA: the base, adapter off)
        ref_model = AutoModelForCausalLM.from_pretrained(reference_path or base_path, dtype=torch.float32,
                                                         attn_implementation="sdpa")
        ref_model.requires_grad_(False).eval()
    return model, ref_model, tied


def _restore_optimizer(run: _Session, model_path: Path, n_params: int) -> None:
    """Continue the parent checkpoint's AdamW moments and step count when they fit this run (docs/algorithm.md,
    "Optimizer state across iterations"); learning rate, betas and weight decay always come from the config."""
    from accelerate.utils import DistributedType

    cfg = run.cfg
    run.sharded = run.accelerator.distributed_type == DistributedType.FSDP
    state, run.optim_why = (None, "FSDP: sharded optimizer state is not carried over yet") if run.sharded else \
        _load_optimizer_state(model_path, cfg, n_params)
    if state is not None:
        run.optimizer.load_state_dict(state["optimizer"])
        run.warmup.steps_before = int(state.get("steps", 0))
        for g in run.optimizer.param_groups:
            g.update(lr=cfg.lr * run.warmup(0), initial_lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay,
                     fused=run.optimizer.defaults.get("fused"))
        run.scheduler.base_lrs = [cfg.lr] * len(run.optimizer.param_groups)
    elif (cfg.optimizer_state == "continue" and run.accelerator.is_main_process
          and (model_path / OPTIMIZER_DIR).exists()):
        import warnings

        warnings.warn(f"optimizer state not continued: {run.optim_why}", stacklevel=4)


def _reference_path(cfg: TrainerConfig) -> Path | None:
    """The KL reference's checkpoint folder (``cfg.kl_reference``), None for the parent; ValueError when it is
    'warm_start' (a campaign's train stage resolves that to a folder) or not a checkpoint folder."""
    if cfg.kl_reference is None or cfg.lora is not None or cfg.kl_coef == 0:
        return None
    if cfg.kl_reference == "warm_start":
        raise ValueError("trainer.kl_reference 'warm_start' is resolved by a campaign's train stage; outside a "
                         "campaign give the warm-start checkpoint's folder")
    ref = Path(cfg.kl_reference)
    if not (ref / "config.json").is_file():
        raise ValueError(f"trainer.kl_reference = {cfg.kl_reference}: no checkpoint folder there (config.json)")
    return ref


def _start(cfg: TrainerConfig, model_path: Path, base_path: Path, adapter_path: Path | None, model_type: str | None,
           iteration: int) -> _Session:
    """The accelerator (seeded by ``seed + iteration``), policy, KL reference, tokenizer and optimizer."""
    from accelerate.utils import set_seed
    from transformers import AutoTokenizer

    accelerator = _accelerator(cfg)
    set_seed(cfg.seed + iteration)
    if _one_cpu_process():  # the same inputs give the same weights (a warm start rebuilt on another machine)
        torch.use_deterministic_algorithms(True, warn_only=True)
    base_dtype = policy_load_dtype(cfg, accelerator.mixed_precision, accelerator.distributed_type)
    model, ref_model, tied = _load_policy(cfg, base_path, adapter_path, base_dtype, _reference_path(cfg))
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError):
        tokenizer = AutoTokenizer.from_pretrained(base_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    params = [p for p in model.parameters() if p.requires_grad]
    # fused AdamW: one kernel over all fp32 parameters on the CPU (the same update as the per-tensor loop)
    fused = True if (_one_cpu_process() and all(p.dtype == torch.float32 for p in params)) else None
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay,
                                  fused=fused)
    warmup = _Warmup(cfg.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    model, optimizer = accelerator.prepare(model, optimizer)
    run = _Session(cfg=cfg, accelerator=accelerator, model=model, ref_model=ref_model, tokenizer=tokenizer,
                   optimizer=optimizer, scheduler=scheduler, warmup=warmup, pad_id=pad_id, tied=tied,
                   base_dtype=base_dtype, per_length=_per_length(cfg),
                   lm_chunk=cfg.logprob_chunk_tokens if model_type in PLAIN_LM_HEAD_MODEL_TYPES else None)
    _restore_optimizer(run, model_path, len(params))
    if ref_model is not None:
        if _bf16_weights(cfg):  # no autocast: the frozen reference computes in bf16 as the policy does
            ref_model = ref_model.to(torch.bfloat16)
        run.ref_model = accelerator.prepare_model(ref_model, evaluation_mode=True)
    model.train()
    run.compute = _compute_copy(model) if _bf16_weights(cfg) else model
    return run


def _skip_zero_coefficient(rows: list[Sample], cfg: TrainerConfig) -> tuple[list[Sample], tuple[int, int]]:
    """(samples to run, (samples, assistant tokens) left out): those whose c_n = w_d * A_n is 0 add nothing to a
    loss that uses advantages (``skip_zero_advantage``, docs/algorithm.md "Loss"); all are kept when all are 0."""
    if not (cfg.skip_zero_advantage and LOSSES[cfg.loss_type].uses_advantage and cfg.kl_coef == 0):
        return rows, (0, 0)
    kept = [s for s in rows if s.advantage * s.weight != 0.0]
    if not kept:  # all zero: keep everything (the update is a no-op either way)
        return rows, (0, 0)
    tokens = sum(s.num_assistant_tokens for s in rows) - sum(s.num_assistant_tokens for s in kept)
    return kept, (len(rows) - len(kept), tokens)


def _proximal_logprobs(run: _Session, rows: list[Sample], lags: list[int],
                       phase: Callable[[str], None]) -> list[Sample]:
    """``rows`` with ``proximal_logprobs`` [T] set on each sample generated by an older checkpoint (``lags[i] >
    0``): log pi_prox of the checkpoint being trained from, before any step, in eval mode and without gradient
    (AReaL's proximal policy, arXiv:2505.24298 Eq. 5; docs/algorithm/async-rl.md). Sets
    ``run.off_policy``. Samples of the trained checkpoint itself are returned unchanged (their ratio stays the
    on-policy one), and so are those no step trains (``train`` passes lag 0 for them: with ``max_steps`` the
    steps may cover a few of the micro-batches, and a forward over all of them cost more than the steps).
    Only the samples whose loss uses the ratio to pi_behaviour need it (every loss here does)."""
    stale = [i for i, lag in enumerate(lags) if lag > 0]
    if not stale:
        return rows
    phase(f"proximal log-probs of {len(stale)} samples from older checkpoints")
    cfg, out = run.cfg, list(rows)
    mbs = make_micro_batches([len(rows[i].token_ids) for i in stale], micro_batch_tokens=cfg.micro_batch_tokens,
                             micro_batch_size=cfg.micro_batch_size)
    run.compute.eval()
    try:
        with torch.no_grad():
            for mb in mbs:  # every process runs every micro-batch: the same forwards everywhere (FSDP)
                batch = collate([rows[stale[k]] for k in mb.indices], run.pad_id, run.accelerator.device)
                lp = run.logprobs(run.compute, batch).float().cpu()  # [B, L]
                for b, k in enumerate(mb.indices):
                    s = rows[stale[k]]
                    out[stale[k]] = s.model_copy(update={"proximal_logprobs": lp[b, :len(s.token_ids)].tolist()})
    finally:
        run.compute.train()
    run.off_policy = True
    return out


def planned_steps(n_micro_batches: int, cfg: TrainerConfig, world: int = 1) -> int:
    """Optimizer steps :func:`train` takes over ``n_micro_batches`` micro-batches on ``world`` processes when the
    count depends on them alone (``grad_accum`` set, or one minibatch per batch): ``epochs`` x ceil(micro-batches,
    padded to a multiple of ``world``, / (``grad_accum`` x ``world``)) (``epochs`` x 1 when ``grad_accum`` is None),
    at most ``max_steps``: the length of :func:`_step_schedule` (the count does not depend on the iteration's
    shuffle). A ``target_kl`` stop may end the call sooner.

    Raises:
        ValueError: ``steps_per_batch`` > 1 (the steps then depend on the samples' groups: :func:`_schedule`).
    """
    if cfg.grad_accum is None and cfg.steps_per_batch > 1:
        raise ValueError("with steps_per_batch > 1 the optimizer steps depend on the samples' groups (_schedule)")
    return len(_step_schedule(n_micro_batches, cfg, iteration=0, world=world))


class _ResumePoint:
    """The resume point of one :func:`train` call (``TrainerConfig.resume_every_s``): ``folder/state.pt`` holds
    the weights, optimizer, scheduler and RNG state after some optimizer step, and the metrics of the steps
    taken, under ``key`` (data hash, config hash, parent path, iteration): a later call with another key
    ignores it. One process only (under FSDP/DDP nothing is saved or loaded)."""

    def __init__(self, folder: Path, key: str) -> None:
        self.folder, self.key, self.saved_at = folder, key, time.monotonic()

    def _usable(self, run: _Session) -> bool:
        return run.cfg.resume_every_s is not None and run.accelerator.num_processes == 1

    def load(self, run: _Session) -> list[dict[str, float]]:
        """Restore ``run`` from a matching resume point; the metrics of its steps ([] when there is none)."""
        path = self.folder / "state.pt"
        if not (self._usable(run) and path.exists()):
            return []
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state.get("key") != self.key:
            return []
        run.accelerator.unwrap_model(run.model).load_state_dict(state["model"])
        _sync_compute(run)
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        random.setstate(state["py_rng"])
        run.steps = int(state["steps"])
        return list(state["metrics"])

    def maybe_save(self, run: _Session, metrics: list[dict[str, float]], last: bool) -> None:
        """Save after this step when ``resume_every_s`` passed since the last save (never after the last step:
        the checkpoint follows). Written to a temporary file, then renamed: a kill mid-write keeps the old one."""
        if last or not self._usable(run) or time.monotonic() - self.saved_at < run.cfg.resume_every_s:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / "state.pt.tmp"
        torch.save({"key": self.key, "steps": run.steps, "metrics": metrics,
                    "model": run.accelerator.unwrap_model(run.model).state_dict(),
                    "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
                    "rng": torch.get_rng_state(), "py_rng": random.getstate()}, tmp)
        os.replace(tmp, self.folder / "state.pt")
        self.saved_at = time.monotonic()

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def _train_epochs(run: _Session, rows: list[Sample], mbs: list[MicroBatch], schedule: list[_Step],
                  on_step: StepCallback | None, on_progress: ProgressCallback | None = None,
                  show_progress: bool = False, resume: _ResumePoint | None = None,
                  done: Sequence[dict[str, float]] = ()) -> list[dict[str, float]]:
    """Every optimizer step of ``schedule`` (:func:`_schedule` of ``rows``, whose micro-batches are ``mbs``), until a
    step's approximate KL exceeds ``target_kl``: that step is taken, the remaining ones are not (stable-baselines3's
    PPO ``target_kl`` on the minibatch loop, ``train/kl_stop`` 1 in the step's metrics).
    Progress (bar, ``on_progress``) is reported on the main process only; a KL stop lowers the bar's total to the
    steps taken. The first ``len(done)`` steps were taken by an interrupted run (``resume``, whose state ``run``
    holds): they are replayed from ``done`` (their metrics reported again, a KL stop among them included), not
    recomputed; ``resume`` saves a new point as the steps go. Returns the metrics of the steps taken."""
    metrics: list[dict[str, float]] = []
    main = run.accelerator.is_main_process
    tokens_of = [s.num_assistant_tokens for s in rows]
    planned = len(schedule)
    with StepProgress("training steps", planned,
                      on_progress=on_progress if main else None, show=show_progress and main) as progress:
        for step in schedule:
            if len(metrics) < len(done):  # taken before the interruption: its state is restored
                m = dict(done[len(metrics)])
            else:
                m = _optimizer_step(run, rows, mbs, tokens_of, step)
            metrics.append(m)
            stop = m.get("train/kl_stop", 0.0) > 0
            if stop:
                progress.set_total(len(metrics))
            if on_step is not None and main:
                on_step(m)
            progress.advance()
            if resume is not None and len(metrics) > len(done):
                resume.maybe_save(run, metrics, last=stop or len(metrics) >= planned)
            if stop:
                break
    return metrics


@dataclass
class _Step:
    """One optimizer step of :func:`_schedule`."""

    epoch: int
    micro_batches: list[int]  # indices into the call's micro-batches; -1: a filler (every process runs as many)
    # (samples, assistant tokens) of the step's share of the batch that skip_zero_advantage does not run: they count
    # in the step's normaliser, so that skipping them leaves the update unchanged
    skipped: tuple[int, int] = (0, 0)


def _micro_batches(rows: list[Sample], cfg: TrainerConfig) -> list[MicroBatch]:
    """The length-sorted micro-batches of ``rows`` (:func:`rao_core.train.data.make_micro_batches`)."""
    return make_micro_batches([len(s.token_ids) for s in rows], micro_batch_tokens=cfg.micro_batch_tokens,
                              micro_batch_size=cfg.micro_batch_size)


def _schedule(all_rows: list[Sample], rows: list[Sample], cfg: TrainerConfig, iteration: int,
              world: int) -> tuple[list[MicroBatch], list[_Step]]:
    """The micro-batches (indices into ``rows``) and, in order, every optimizer step :func:`_train_epochs` takes
    (at most ``max_steps``; a ``target_kl`` stop may end it sooner): the one source of the steps.

    ``rows`` are the samples that run (:func:`_skip_zero_coefficient` of ``all_rows``: a sublist of the same
    objects). With ``grad_accum`` set: the length-sorted micro-batches of ``rows`` in each epoch's
    :func:`epoch_order`, cut into steps of ``grad_accum x world`` micro-batches (:func:`_step_schedule`; groups are
    not kept whole, the skipped samples are in no normaliser). Else, per epoch, the minibatches of
    :func:`rao_core.train.data.minibatch_partition` (``steps_per_batch`` of them, whole groups of ``all_rows``):
    each minibatch's rows are micro-batched by length, ordered by :func:`epoch_order` and padded with fillers to a
    multiple of ``world``, and make one step whose normaliser also counts the minibatch's skipped samples; a
    minibatch with no row to run takes no step (the authors' rule, ``platoon/train/tinker/rl.py``). With one
    minibatch this is exactly one step per epoch over :func:`_micro_batches` of ``rows``, in the same order.
    """
    if cfg.grad_accum:
        mbs = _micro_batches(rows, cfg)
        return mbs, [_Step(epoch, step_mbs) for epoch, step_mbs in _step_schedule(len(mbs), cfg, iteration, world)]
    running = {id(s) for s in rows}
    skipped_of: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # group -> [samples, tokens] not run
    for s in all_rows:
        if id(s) not in running:
            skipped_of[s.group_id][0] += 1
            skipped_of[s.group_id][1] += s.num_assistant_tokens
    mbs: list[MicroBatch] = []
    steps: list[_Step] = []
    for epoch in range(cfg.epochs):
        parts = minibatch_partition([s.group_id for s in all_rows], cfg.steps_per_batch, seed=cfg.seed,
                                    iteration=iteration, epoch=epoch, shuffle=cfg.shuffle)
        for part in parts:
            groups = {all_rows[i].group_id for i in part}
            idx = [i for i, s in enumerate(rows) if s.group_id in groups]  # in the order of rows
            if not idx:
                continue
            local = _micro_batches([rows[i] for i in idx], cfg)
            order = [len(mbs) + j for j in epoch_order(len(local), seed=cfg.seed, iteration=iteration, epoch=epoch,
                                                        shuffle=cfg.shuffle)]
            mbs.extend(MicroBatch([idx[k] for k in mb.indices], mb.max_len) for mb in local)
            skipped = (sum(skipped_of[g][0] for g in groups), sum(skipped_of[g][1] for g in groups))
            steps.append(_Step(epoch, order + [-1] * (-len(order) % world), skipped))
            if cfg.max_steps is not None and len(steps) >= cfg.max_steps:
                return mbs, steps
    return mbs, steps


def _step_schedule(n_micro_batches: int, cfg: TrainerConfig, iteration: int, world: int) -> list[tuple[int, list[int]]]:
    """``(epoch, micro-batch indices)`` of every optimizer step over ``n_micro_batches`` micro-batches when groups
    need not be kept whole (``grad_accum`` set; with ``grad_accum`` None, one step per epoch): each epoch's
    :func:`epoch_order`, padded with fillers (-1) to a multiple of ``world`` (every process runs as many
    micro-batches), cut into steps of ``grad_accum x world`` micro-batches (one step per epoch when None), at most
    ``max_steps`` steps. Used by :func:`_schedule` and :func:`planned_steps`."""
    out: list[tuple[int, list[int]]] = []
    for epoch in range(cfg.epochs):
        order = epoch_order(n_micro_batches, seed=cfg.seed, iteration=iteration, epoch=epoch, shuffle=cfg.shuffle)
        order += [-1] * (-len(order) % world)
        if not order:
            continue
        chunk = cfg.grad_accum * world if cfg.grad_accum else len(order)
        for i in range(0, len(order), chunk):
            out.append((epoch, order[i:i + chunk]))
            if cfg.max_steps is not None and len(out) >= cfg.max_steps:
                return out
    return out


def _trained_rows(mbs: list[MicroBatch], schedule: list[_Step]) -> set[int]:
    """Indices of the rows some optimizer step of ``schedule`` (:func:`_schedule`) trains: ``max_steps`` may leave
    micro-batches of ``mbs`` out."""
    return {i for step in schedule for j in step.micro_batches if j >= 0 for i in mbs[j].indices}


def _row_groups(rows: list[Sample], indices: list[int], per_length: bool) -> list[list[int]]:
    """The forward passes of one micro-batch (``indices`` into ``rows``): all of it in one pass, or with
    ``per_length`` one pass per group of equal-length rows (in the micro-batch's order), so that no pass
    computes a padding token."""
    if not per_length:
        return [list(indices)]
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(len(rows[i].token_ids), []).append(i)
    return list(groups.values())


def _forward_backward(run: _Session, batch: dict[str, torch.Tensor], normalizer: float) -> Any:
    """Loss of one micro-batch (``rao_core.train.loss.policy_loss``) and its backward; returns the LossStats.
    Inside ``accelerator.accumulate``: gradients are synchronised across processes on the step's last micro-batch
    (every micro-batch under FSDP, :func:`_sync_each_micro_batch`)."""
    cfg, acc = run.cfg, run.accelerator
    with acc.accumulate(run.model):
        lp = run.logprobs(run.compute, batch)  # [B, L]
        ref_lp = None
        if cfg.kl_coef > 0:
            with torch.no_grad():
                if run.ref_model is not None:
                    ref_lp = run.logprobs(run.ref_model, batch)
                else:  # LoRA: the reference is the base model, adapter off
                    with acc.unwrap_model(run.model).disable_adapter():
                        ref_lp = run.logprobs(run.compute, batch)
        loss, st = policy_loss(
            lp, batch["behaviour_logprobs"], batch["loss_mask"], batch["coef"],
            loss_type=cfg.loss_type, clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
            ref_logprobs=ref_lp, kl_coef=cfg.kl_coef, normalizer=normalizer, aggregation=cfg.loss_aggregation,
            prox_logprobs=batch.get("proximal_logprobs"), behaviour_weight_cap=cfg.behaviour_weight_cap,
        )
        # accelerate's backward divides by num_steps; the loss is already normalised over the whole step
        acc.backward(loss * acc.gradient_accumulation_steps)
    _fold_grads(run)
    return st


def _optimizer_step(run: _Session, rows: list[Sample], mbs: list[MicroBatch], tokens_of: list[int],
                    step: _Step) -> dict[str, float]:
    """One optimizer step over the micro-batches of ``step`` (indices into ``mbs``; -1 = a filler).

    The normaliser is the step's assistant tokens (``token_mean``) or node trajectories (``sequence_mean``)
    over all processes, plus the step's ``skipped`` (samples, tokens), divided by the process count to undo the
    gradient averaging of DDP/FSDP (docs/algorithm.md, "Loss aggregation"). Each process takes every
    ``world``-th micro-batch. Returns the step's metrics (docs/algorithm/metrics.md), with ``train/kl_stop`` 1 when
    ``target_kl`` is set and the step's approximate KL (measured in its own forward passes) exceeds it.
    """
    cfg, acc = run.cfg, run.accelerator
    step_mbs, skipped = step.micro_batches, step.skipped
    world, rank, dev = acc.num_processes, acc.process_index, acc.device
    t0 = time.perf_counter()
    idx = [i for j in step_mbs if j >= 0 for i in mbs[j].indices]
    step_samples = sum(1 for i in idx if tokens_of[i] > 0) + skipped[0]
    step_tokens = sum(tokens_of[i] for i in idx) + skipped[1]
    normalizer = max(step_samples if cfg.loss_aggregation == "sequence_mean" else step_tokens, 1) / world
    sums = torch.zeros(13, device=dev, dtype=torch.float64)
    # [sum k3(behaviour || theta), tokens, sum k3 to the KL reference] per depth
    kl_depth = torch.zeros(3, max(s.depth for s in rows) + 1, device=dev, dtype=torch.float64)
    local = step_mbs[rank::world]
    # the forward passes of this process: a micro-batch's rows together (padded), or one pass per group of
    # equal-length rows (per_length: no padding); the micro-batches and the step's normaliser are the same
    passes = [(j, part) for j in local for part in _row_groups(rows, mbs[j if j >= 0 else 0].indices, run.per_length)]
    acc.gradient_accumulation_steps, acc.step = len(passes), 0  # accumulate() syncs on the last of these
    for j, part in passes:
        batch = collate([rows[i] for i in part], run.pad_id, dev, zero_out=j < 0)
        st = _forward_backward(run, batch, normalizer)
        if j >= 0:
            sums += torch.stack([
                st.loss_sum, st.pg_loss_sum, st.ref_kl_sum, st.tokens, st.clipped_tokens, st.ratio_sum,
                batch["attention_mask"].sum().to(st.tokens.dtype),
                torch.tensor(float(batch["attention_mask"].numel()), device=dev),  # tokens computed, padding too
                torch.tensor(float(len(part)), device=dev),
                st.stale_tokens, st.behaviour_weight_sum, st.capped_tokens, st.approx_kl_sum,
            ]).to(torch.float64)
            kl_depth[0].index_add_(0, batch["depth"], st.kl_mismatch_per_sample.to(torch.float64))
            kl_depth[1].index_add_(0, batch["depth"], st.tokens_per_sample.to(torch.float64))
            kl_depth[2].index_add_(0, batch["depth"], st.ref_kl_per_sample.to(torch.float64))
    grad_norm = acc.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm or math.inf)
    lr = float(run.optimizer.param_groups[0]["lr"])  # this step's rate (the scheduler moves on after it)
    run.optimizer.step()
    _sync_compute(run)
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.steps += 1
    sums = acc.reduce(sums, reduction="sum")
    kl_depth = acc.reduce(kl_depth, reduction="sum")
    dt = time.perf_counter() - t0
    tok = max(float(sums[3]), 1.0)
    m = {
        "train/step": float(run.steps), "train/epoch": float(step.epoch),
        "train/loss": float(sums[0]) / tok, "train/pg_loss": float(sums[1]) / tok,
        "train/kl_ref": float(sums[2]) / tok, "train/clip_frac": float(sums[4]) / tok,
        "train/ratio_mean": float(sums[5]) / tok, "train/grad_norm": float(grad_norm),
        "train/adv_abs_mean": sum(abs(rows[i].advantage) for i in idx) / len(idx),
        "train/coef_abs_mean": sum(abs(rows[i].advantage * rows[i].weight) for i in idx) / len(idx),
        "train/tokens": float(sums[3]), "train/seq_tokens": float(sums[6]),
        "train/padded_tokens": float(sums[7]), "train/samples": float(sums[8]),
        "train/kl_mismatch": float(kl_depth[0].sum()) / max(float(kl_depth[1].sum()), 1.0),
        "train/approx_kl": float(sums[12]) / tok,
        "train/lr": lr, "train/step_s": dt,
        "train/optimizer_steps_total": float(run.warmup.steps_before + run.steps),
        "train/tokens_per_s": float(sums[6]) / dt if dt > 0 else 0.0,
    }
    if cfg.target_kl is not None:  # the KL stop: the remaining steps of the call are skipped (_train_epochs)
        m["train/kl_stop"] = float(m["train/approx_kl"] > cfg.target_kl)
    if run.off_policy:  # asynchronous RL: how off-policy the step's tokens were (docs/algorithm/metrics.md)
        stale_tok = float(sums[9])
        m["train/stale_token_frac"] = stale_tok / tok
        m["train/behaviour_weight_mean"] = float(sums[10]) / stale_tok if stale_tok else 1.0
        m["train/behaviour_weight_capped_frac"] = float(sums[11]) / stale_tok if stale_tok else 0.0
    for d in range(kl_depth.shape[1]):
        if kl_depth[1, d] > 0:
            m[f"train/kl_mismatch_depth_{d}"] = float(kl_depth[0, d] / kl_depth[1, d])
            if cfg.kl_coef > 0:  # the KL penalty's value per depth (k3 to the reference, per token)
                m[f"train/kl_ref_depth_{d}"] = float(kl_depth[2, d] / kl_depth[1, d])
    return m


def _manifest(run: _Session, model_path: Path, base_path: Path, all_rows: list[Sample], rows: list[Sample],
              metrics: list[dict[str, float]], iteration: int, rows_hash: str, planned: int) -> dict[str, Any]:
    """The checkpoint's ``rao-checkpoint.json``: lineage, data and config hashes (``rows_hash``:
    ``data_hash(all_rows)``), what ran and how (``planned``: the optimizer steps of the schedule; ``kl_stop`` says
    whether ``target_kl`` ended the call sooner)."""
    cfg, parent = run.cfg, read_manifest(model_path) or {}
    return {
        "kind": "lora" if cfg.lora is not None else "full", "parent_checkpoint": str(model_path),
        "parent_iteration": parent.get("iteration"), "parent_data_hash": parent.get("data_hash"),
        "base_model": str(base_path), "iteration": iteration, "data_hash": rows_hash,
        "config_hash": cfg.config_hash(), "config": json.loads(cfg.model_dump_json()),
        "num_samples": len(all_rows), "num_trained_samples": len(rows), "num_steps": run.steps,
        "update_budget": cfg.update_budget(),
        "kl_stop": {"target_kl": cfg.target_kl, "stopped": len(metrics) < planned, "steps_planned": planned,
                    "approx_kl": metrics[-1].get("train/approx_kl") if metrics else None},
        "num_assistant_tokens": sum(s.num_assistant_tokens for s in all_rows), "created_at": time.time(),
        "final_metrics": metrics[-1] if metrics else {},
        "base_dtype": str(run.base_dtype).removeprefix("torch."),
        "logprob_path": f"chunked ({run.lm_chunk} tokens)" if run.lm_chunk is not None else "full logits",
        "optimizer_state": {"continued": run.optim_why == "continued", "why": run.optim_why,
                            "steps_total": run.warmup.steps_before + run.steps},
        "versions": _versions(),
        # what a bit-identical rebuild also needs: the kernels a CPU picks and the threads that split reductions
        "compute": {"torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "bf16_weights": run.compute is not run.model, "per_length": run.per_length},
    }


def _versions() -> dict[str, str]:
    import accelerate
    import transformers

    import rao_core

    return {"rao": rao_core.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__}


def _write_optimizer_state(folder: Path, optim_state: dict[str, Any] | None) -> None:
    if optim_state is not None:
        (folder / OPTIMIZER_DIR).mkdir()
        torch.save(optim_state, folder / OPTIMIZER_DIR / _OPTIMIZER_FILE)


def _save(accelerator, model, tokenizer, out_dir: Path, manifest: dict[str, Any], *, tied: bool, lora: bool,
          save_dtype: torch.dtype, optim_state: dict[str, Any] | None = None) -> None:
    """Gather the weights (collective under FSDP) and write the checkpoint folder on the main process
    (with the optimizer state in its ``optimizer/`` sub-folder when given)."""
    state = accelerator.get_state_dict(model)
    unwrapped = accelerator.unwrap_model(model)
    if not accelerator.is_main_process:
        return
    if lora:
        with atomic_folder(out_dir) as tmp:
            unwrapped.save_pretrained(tmp, state_dict=state, safe_serialization=True)
            acfg_path = tmp / "adapter_config.json"
            acfg = json.loads(acfg_path.read_text())
            acfg["base_model_name_or_path"] = manifest["base_model"]
            acfg_path.write_text(json.dumps(acfg, indent=2))
            tokenizer.save_pretrained(tmp)
            (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))
            _write_optimizer_state(tmp, optim_state)
        return
    if bool(getattr(unwrapped.config, "tie_word_embeddings", False)) != tied:
        raise ValueError("tie_word_embeddings changed during training; vLLM would load a different model")
    if tied and accelerator.num_processes == 1:
        out = unwrapped.get_output_embeddings()
        if out is not None and out.weight.data_ptr() != unwrapped.get_input_embeddings().weight.data_ptr():
            raise ValueError("input and output embeddings were untied during training")
    state = {k: (v.to(save_dtype) if v.is_floating_point() else v) for k, v in state.items()}
    with atomic_folder(out_dir) as tmp:
        unwrapped.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        cfg_path = tmp / "config.json"  # state the dtype of the saved weights (save_pretrained writes fp32's)
        cfg_json = json.loads(cfg_path.read_text())
        cfg_json["dtype"] = str(save_dtype).removeprefix("torch.")
        cfg_path.write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
        tokenizer.save_pretrained(tmp)
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))
        _write_optimizer_state(tmp, optim_state)
