"""Configuration of the training stage (one pydantic model, every field documented)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rao_core.train.objectives import LOSSES

__all__ = ["LoraSettings", "TrainerConfig", "cpu_has_bf16"]


def cpu_has_bf16() -> bool:
    """True when this CPU has native bf16 arithmetic (``avx512_bf16`` or ``amx_bf16`` in /proc/cpuinfo)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class LoraSettings(BaseModel):
    """LoRA adapter settings (Hu et al. 2021, arXiv:2106.09685), passed to ``peft.LoraConfig``."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="Adapter rank. vLLM must be started with --max-lora-rank >= r.")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Module names that get adapters (Llama/Qwen naming; all linear layers by default).",
    )


class TrainerConfig(BaseModel):
    """Settings of one training stage (policy update or SFT warm start) of ``rao_core.train.train``.

    Defaults and their source:
    - ``loss_type='ppo'`` with ``clip_eps_low = clip_eps_high = 0.2``: PPO-clip, Schulman et al. 2017.
      Raise ``clip_eps_high`` (e.g. 0.28, DAPO) for "clip-higher"; CISPO (MiniMax-M1) usually uses a large
      upper bound and no effective lower one.
    - ``lr=1e-6``, AdamW (betas 0.9/0.999, no weight decay), ``max_grad_norm=1.0``: common settings for
      RL fine-tuning of 1-8B instruct models (e.g. TRL's GRPO examples); small models tolerate more.
    - ``steps_per_batch=1`` (minibatches per batch), ``epochs=1``, ``grad_accum=None``, ``target_kl=None``: one
      optimizer step over the whole batch, its micro-batches accumulated, no KL stop (the authors'
      ``num_minibatches: 1`` in platoon 0.4.0 ``train/tinker/config_defs.py``, one ``optim_step_async`` per
      minibatch in ``platoon/train/tinker/rl.py``; ``ppo_n_minibatches: 1`` in ApGa/platoon 97e7601's AReaL config;
      TRL's ``num_iterations=1``); on-policy, so the importance ratio only measures the trainer/inference mismatch.
      More steps per batch (``steps_per_batch`` minibatches of whole groups, ``epochs``, ``grad_accum``,
      ``max_steps``) are an explicit choice, printed by the train stage and recorded in the checkpoint manifest
      (``update_budget``); ``target_kl`` bounds them (stable-baselines3's PPO ``target_kl``).
    - ``warmup_steps=2``: linear warm-up over the first two optimizer steps of a FRESH optimizer state, so the
      first RL step after SFT (whose AdamW moments are new: each weight moves by about ``lr``) runs at lr / 2.
    - token-mean aggregation over the optimizer step (``rao_core.train.loss``).
    """

    model_config = ConfigDict(extra="forbid")

    loss_type: str = Field(
        "ppo", description="Per-token objective, a key of rao_core.train.objectives.LOSSES: reinforce | ppo "
        "(clipped ratio) | cispo (clipped IS weight) | sft (cross-entropy)."
    )
    clip_eps_low: float = Field(0.2, ge=0, le=1, description="Lower ratio bound is 1 - clip_eps_low (ppo, cispo).")
    clip_eps_high: float = Field(0.2, ge=0, description="Upper ratio bound is 1 + clip_eps_high (ppo, cispo).")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (constant, after warmup_steps linear warm-up).")
    warmup_steps: int = Field(
        2, ge=0, description="Linear learning-rate warm-up, optimizer steps counted from a fresh optimizer state "
        "(across iterations when the state is continued: optimizer_state 'continue'): step k of the state runs at "
        "lr * min(1, k / warmup_steps). A state that is not continued (the first RL step after SFT, a reset) "
        "warms up again. 0: none.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    epochs: int = Field(1, ge=1, description="Passes over the samples.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps (None: all epochs).")
    micro_batch_tokens: int | None = Field(
        4096, ge=1,
        description="Padded tokens per micro-batch (rows x longest row); samples are sorted by length and "
        "bucketed greedily. A single sample longer than this forms its own micro-batch. Ignored when "
        "micro_batch_size is set.",
    )
    micro_batch_size: int | None = Field(
        None, ge=1, description="Rows per micro-batch (length-sorted) instead of a token budget; takes precedence."
    )
    steps_per_batch: int = Field(
        1, ge=1, description="The update budget: minibatches per pass over the batch, one optimizer step each "
        "(the minibatches of the authors' num_minibatches, verl, stable-baselines3). A minibatch is whole groups "
        "(the samples of one task's G rollout trees are never split), as equal in groups as the count allows, "
        "shuffled per (seed, iteration, epoch) (rao_core.train.data.minibatch_partition); each sample is in "
        "exactly one minibatch per epoch; a minibatch's micro-batches are accumulated into its step. Fewer steps "
        "when the batch has fewer groups, and a minibatch whose every sample has coefficient w_d * A_n = 0 takes "
        "no step (as the authors'). Each step's normaliser counts its own groups' samples, those skipped by "
        "skip_zero_advantage included. 1: one step over the whole batch (the authors' setting). Not with "
        "grad_accum.")
    target_kl: float | None = Field(
        None, gt=0, description="Approximate-KL stop on the minibatch loop (stable-baselines3 PPO's target_kl): "
        "each step logs train/approx_kl, the mean over its assistant tokens of (rho - 1) - log rho, rho the loss's "
        "importance ratio (to the behaviour log-probs; to the proximal ones for a stale sample), measured in the "
        "step's own forward, so before its update; when it exceeds target_kl the step is taken and every "
        "remaining step of the call (later minibatches and epochs) is skipped, recorded as train/kl_stop = 1 and "
        "in the manifest's kl_stop. stable-baselines3 compares with 1.5 x target_kl and skips the exceeding "
        "minibatch too; here it is taken, so a first step's KL (the trainer/inference mismatch alone) never stops "
        "the update before it starts. None: no stop (the authors' setting).")
    grad_accum: int | None = Field(
        None, ge=1, description="Micro-batches (per process) per optimizer step, so the step count follows the "
        "batch's size (SFT; groups are not kept whole); None: steps_per_batch minibatches per epoch. Not with "
        "steps_per_batch > 1."
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the global gradient norm (None: no clipping).")
    lora: LoraSettings | None = Field(None, description="Train a LoRA adapter instead of all weights (None: full).")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL penalty to the reference policy "
                           "(kl_reference), added to every trained token's loss; logged per depth as "
                           "train/kl_ref_depth_<d> (0: off).")
    kl_reference: str | None = Field(
        None, description="The KL penalty's reference policy: a checkpoint folder, or 'warm_start' (a campaign's "
        "iteration-0 checkpoint, resolved by the train stage); None: the checkpoint being trained from. With LoRA "
        "the reference is always the adapter's base model (adapter off).")
    temperature: float = Field(
        1.0, gt=0, description="Logits are divided by this before log-probs. It must be the temperature the "
        "rollouts were sampled at, with the server returning processed log-probs (serving.logprobs_mode): in a "
        "campaign it is set from runtime.temperature, and a different explicit value is rejected."
    )
    dtype: Literal["auto", "bfloat16", "float32", "bfloat16_if_native"] = Field(
        "auto", description="Compute precision: auto = bf16 on a bf16-capable GPU, else fp32; "
        "bfloat16 = bf16 on such a GPU or on a CPU with native bf16 (avx512_bf16/amx_bf16; an error elsewhere); "
        "bfloat16_if_native = bf16 where either holds, else fp32 (configs that must run anywhere). How bf16 is "
        "computed (autocast or a bf16 weight copy): bf16_weights. Master weights stay fp32; "
        "checkpoints are saved in the input checkpoint's dtype.",
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward (saves memory).")
    bf16_weights: Literal["auto", "on", "off"] = Field(
        "auto", description="How bf16 compute is done when `dtype` resolves to bf16: 'on' = a bf16 copy of the "
        "weights runs forward and backward, its gradients are added into fp32 gradients of the fp32 master weights "
        "after each micro-batch, AdamW updates the fp32 master weights, which are copied back into the bf16 copy "
        "(no weight cast per forward; the residual stream and norms run in bf16); 'off' = bf16 autocast over the "
        "fp32 weights (every matmul casts its weight on each call); 'auto' = 'on' on a CPU with one process (not "
        "LoRA), else 'off'. The same update to bf16 rounding (tests/algo/test_fast_step.py).")
    row_execution: Literal["auto", "padded", "per_length"] = Field(
        "auto", description="How a micro-batch's rows run: 'padded' = one forward over the right-padded rows "
        "(an attention mask); 'per_length' = one forward per group of rows of equal length (no padding token is "
        "computed, and attention takes the causal kernel without a mask); 'auto' = 'per_length' on a CPU with "
        "one process, else 'padded'. The micro-batches, and so the optimizer steps, are the same either way.")
    logprob_chunk_tokens: int | None = Field(
        1024, ge=1, description="Compute the sampled tokens' log-probs from the last hidden states, the LM head "
        "and log-softmax applied to this many tokens (rows x positions) at a time under activation "
        "checkpointing, so the full [B, L, V] fp32 logits never exist (rao_core.train.loss."
        "chunked_token_logprobs; same values). None: the full-logits path. Models whose logits are not "
        "exactly lm_head(hidden) (see PLAIN_LM_HEAD_MODEL_TYPES) always use the full-logits path.")
    skip_zero_advantage: bool = Field(
        True, description="Do not run forward/backward on samples whose coefficient w_d * A_n is 0 (their "
        "policy-gradient term is exactly 0 for every loss type). Applies when the loss uses advantages (not "
        "'sft') and kl_coef == 0. With one optimizer step per epoch (grad_accum None) the token-mean normaliser "
        "still counts the skipped samples' tokens, so the update is identical; with grad_accum set, steps are "
        "formed from the kept samples only.")
    shuffle: bool = Field(True, description="Shuffle micro-batch order each epoch, seeded by (seed, iteration, "
                          "epoch) so that an epoch cut short by max_steps trains other micro-batches next time.")
    seed: int = Field(0, description="Seed of shuffling, LoRA init and dropout (combined with the iteration).")
    loss_aggregation: Literal["token_mean", "sequence_mean"] = Field(
        "token_mean", description="token_mean (the paper's token-level loss): sum over assistant tokens / tokens "
        "of the step, so a depth level's gradient share grows with its token count; sequence_mean: each node's "
        "token mean first, times w_d * A_n, averaged over the step's nodes, so Eq. (5) equalises the depth "
        "levels' gradient mass (docs/algorithm.md).")
    optimizer_state: Literal["continue", "reset"] = Field(
        "continue", description="continue: restore the AdamW moments and the scheduler's step from the parent "
        "checkpoint's `optimizer/` folder when it was written by a run of the same loss_type (else start "
        "fresh); reset: always start a fresh optimizer. The new state is always saved beside the checkpoint.")
    resume_every_s: float | None = Field(
        300.0, ge=0, description="Save a resume point (weights, optimizer, scheduler, RNG, the steps' metrics) to "
        "`<out>.resume/` after an optimizer step when this many seconds passed since the last one; a train() of "
        "the same samples, parent and config finds it and continues after its last step (a warm start killed "
        "by the OOM killer loses at most this much). Removed once the checkpoint is saved. None: never; one "
        "process only (not under FSDP/DDP).")
    behaviour_weight_cap: float | None = Field(
        5.0, gt=1, description="Asynchronous RL (algo.max_staleness >= 1): a token of a sample generated by an "
        "older checkpoint is dropped from the decoupled loss when its behaviour importance weight pi_prox / "
        "pi_behaviour exceeds this (AReaL's behav_imp_weight_cap; 5 in the authors' configs). None: none dropped. "
        "Unused on-policy (docs/algorithm/async-rl.md).")

    process: Literal["subprocess", "inline"] = Field(
        "subprocess", description="How the campaign's train stage and the warm start (run_warm_start) run: "
        "'subprocess' = `accelerate launch -m rao_cli.main train` in a child process (rao_core.train.launch), so "
        "that its memory goes back to the OS before vLLM serves the next checkpoint; 'inline' = train() in the "
        "calling process (tests). rao train and train() themselves ignore it.")
    cpus: list[int] = Field(default_factory=list, description="The cores the training child may run on "
                            "(`taskset -c`; torch threads = their number); the trainer's half of a core split with "
                            "serving.cpus (asynchronous RL on CPU). Empty: every core this process may use. Only "
                            "with process 'subprocess'.")
    accelerate_config: str | None = Field(
        None, description="accelerate config file for the subprocess launch (e.g. configs/accelerate/fsdp.yaml on "
        "GPUs); None: one process, no mixed-precision override, torch threads = the CPUs this process may use.")

    @field_validator("loss_type")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        if v not in LOSSES:
            raise ValueError(f"unknown loss_type {v!r}; known: {', '.join(LOSSES)}")
        return v

    @model_validator(mode="after")
    def _check(self) -> "TrainerConfig":
        if self.micro_batch_tokens is None and self.micro_batch_size is None:
            raise ValueError("set micro_batch_tokens or micro_batch_size")
        if self.loss_type == "sft" and self.kl_coef > 0:
            raise ValueError("kl_coef > 0 is meaningless with loss_type='sft'")
        if self.grad_accum is not None and self.steps_per_batch > 1:
            raise ValueError(f"grad_accum = {self.grad_accum} and steps_per_batch = {self.steps_per_batch}: give the "
                             "update budget one way (steps_per_batch: steps per pass; grad_accum: micro-batches "
                             "per step)")
        if self.kl_reference is not None and self.lora is not None and self.kl_reference != "warm_start":
            raise ValueError("kl_reference with lora: the KL reference of a LoRA run is its base model (adapter "
                             "off); leave kl_reference unset")
        return self

    def update_budget(self) -> str:
        """The update per batch in words, e.g. ``1 optimizer step per batch`` or ``3 optimizer steps per batch x
        2 epochs, at most 4 steps, KL stop at 0.02`` (what the train stage prints and the manifest records)."""
        if self.grad_accum is not None:
            per = f"one optimizer step per {self.grad_accum} micro-batch{'es' if self.grad_accum > 1 else ''}"
        else:
            per = f"{self.steps_per_batch} optimizer step{'s' if self.steps_per_batch > 1 else ''} per batch"
        return (per + (f" x {self.epochs} epochs" if self.epochs > 1 else "")
                + (f", at most {self.max_steps} steps" if self.max_steps is not None else "")
                + (f", KL stop at {self.target_kl:g}" if self.target_kl is not None else ""))

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of this config (first 16 hex digits)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]
