"""Token-level policy-gradient loss of the RAO update (docs/algorithm.md, "Loss"; the paper's section 6).

Every assistant token t of node trajectory n carries the weight ``c_n = w_d * A_n`` (Eq. 5 times Eq. 4). The
per-token objective is chosen by name from :data:`rao_core.train.objectives.LOSSES`; :func:`policy_loss` masks it
to the node's own assistant tokens, adds the optional k3 KL-to-reference penalty and aggregates. Departures from
the paper and project choices:

- aggregation ``token_mean`` (default) or ``sequence_mean``: the paper fixes no normaliser;
- off-policy correction: with ``prox_logprobs``, AReaL's decoupled PPO (arXiv:2505.24298, Eq. 5) for stale samples;
- log-probs without the full logits (:func:`chunked_token_logprobs`), for :data:`PLAIN_LM_HEAD_MODEL_TYPES`.

Docs: docs/algorithm.md#loss-arxiv260506639-section-6, docs/algorithm.md#loss-aggregation,
docs/algorithm/async-rl.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rao_core.train.objectives import LOSSES

Aggregation = Literal["token_mean", "sequence_mean"]

__all__ = ["Aggregation", "LossStats", "PLAIN_LM_HEAD_MODEL_TYPES", "chunked_token_logprobs",
           "model_hidden_states", "policy_loss", "token_logprobs"]

# transformers model types whose causal-LM logits are exactly ``lm_head(last_hidden_state)`` (no soft-capping,
# no logit scaling; checked in transformers 5.24's modeling files), so the chunked path equals the full one.
PLAIN_LM_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3"})


@dataclass(frozen=True)
class LossStats:
    """Detached statistics of one micro-batch; every field is a sum or a count (aggregate by adding).

    Per-sample fields have shape [B].
    """

    loss_sum: torch.Tensor  # [] sum over tokens of the per-token loss (incl. KL term)
    pg_loss_sum: torch.Tensor  # [] sum of the policy-gradient part only
    ref_kl_sum: torch.Tensor  # [] sum of k3 to the reference (0 without reference)
    tokens: torch.Tensor  # [] number of assistant tokens
    clipped_tokens: torch.Tensor  # [] tokens whose ratio was clipped (ppo: the clipped branch was taken)
    ratio_sum: torch.Tensor  # [] sum of rho over tokens
    kl_mismatch_per_sample: torch.Tensor  # [B] sum over the sample's tokens of k3(behaviour || theta)
    tokens_per_sample: torch.Tensor  # [B]
    ref_kl_per_sample: torch.Tensor  # [B] sum over the sample's tokens of k3 to the reference (0 without one)
    stale_tokens: torch.Tensor  # [] assistant tokens with a proximal log-prob unequal to the behaviour one (off-policy)
    behaviour_weight_sum: torch.Tensor  # [] sum over those tokens of u = pi_prox / pi_behaviour (before the cap)
    capped_tokens: torch.Tensor  # [] those tokens dropped by the cap (u > behaviour_weight_cap)
    # [] sum over tokens of (rho - 1) - log rho, rho the loss's ratio (to pi_prox where given, else to pi_behaviour):
    # stable-baselines3's approx_kl_div, the value TrainerConfig.target_kl reads (equal to kl_mismatch on-policy)
    approx_kl_sum: torch.Tensor


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each token given its prefix: position t holds log p(input_ids[t] | input_ids[:t]).

    Args:
        logits: [B, L, V] model outputs (position t predicts token t + 1).
        input_ids: [B, L].
        temperature: logits are divided by it (match the sampler's temperature when the behaviour
            log-probs were taken after temperature scaling).

    Returns:
        [B, L] float32; position 0 (no prefix) is 0.
    """
    logits = logits[:, :-1].float()  # [B, L-1, V]
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:]  # [B, L-1]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)  # [B, L-1]
    lp = picked - torch.logsumexp(logits, dim=-1)  # [B, L-1]
    return torch.nn.functional.pad(lp, (1, 0), value=0.0)  # [B, L]


def model_hidden_states(model: Any, lm_head: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    """Run ``model(**inputs)`` (through any DDP/FSDP wrapper) to the last hidden states, skipping the LM head.

    A forward pre-hook on ``lm_head`` records its input and hands it an empty slice of positions, so the
    model returns [B, 0, V] logits. That empty output is folded into the result (``+ logits.sum()``, exactly
    0) so that backward hooks a wrapper put on the model's outputs still fire.

    Args:
        model: a causal LM (or a wrapper/PEFT model around one) whose forward calls ``lm_head`` once on
            the [B, L, H] last hidden states.
        lm_head: the model's output-embedding module (``get_output_embeddings()`` of the unwrapped model).
        inputs: ``input_ids`` [B, L] and ``attention_mask`` [B, L], passed on to ``model``.

    Returns:
        [B, L, H] hidden states in the model's compute dtype (with gradient when grad is enabled).

    Raises:
        RuntimeError: the LM head was not called exactly once on a [B, L, H] input.
    """
    seen: list[torch.Tensor] = []

    def _skip_head(_mod: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not args:  # called with keywords only: leave it alone (the check below then fails)
            return None
        seen.append(args[0])
        return (args[0][..., :0, :], *args[1:])

    handle = lm_head.register_forward_pre_hook(_skip_head)
    try:
        logits = model(**inputs).logits  # [B, 0, V]
    finally:
        handle.remove()
    shape = tuple(inputs["input_ids"].shape)
    if len(seen) != 1 or tuple(seen[0].shape[:-1]) != shape:
        raise RuntimeError(f"expected one LM-head call on [B, L, H] with [B, L] = {shape}, got "
                           f"{[tuple(h.shape) for h in seen]}")
    return seen[0] + logits.sum().to(seen[0].dtype)


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor],
                    temperature: float) -> torch.Tensor:
    """log softmax(lm_head(hidden) / T) at ``targets``: hidden [B, c, H], targets [B, c] -> [B, c] float32.

    The same operations as :func:`token_logprobs` on a slice of positions.
    """
    logits = lm_head(hidden).float()  # [B, c, V]
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)  # [B, c]
    return picked - torch.logsumexp(logits, dim=-1)  # [B, c]


def chunked_token_logprobs(hidden: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor],
                           input_ids: torch.Tensor, temperature: float = 1.0, chunk_tokens: int = 1024,
                           mask: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`token_logprobs` from the last hidden states, the LM head applied to a chunk of positions at a time.

    Positions are cut into chunks of ``max(1, chunk_tokens // B)`` positions, so a chunk holds at most
    ``max(chunk_tokens, B)`` tokens and its logits are [B, c, V] float32. With gradient enabled each chunk
    runs under ``torch.utils.checkpoint`` (non-reentrant): backward recomputes the chunk's logits instead of
    keeping them, so only one chunk's logits (and their gradient) exist at a time.

    Args:
        hidden: [B, L, H] last hidden states (:func:`model_hidden_states`); position t predicts token t + 1.
        lm_head: the LM head module, [..., H] -> [..., V]; call it under the same autocast as the model.
        input_ids: [B, L].
        temperature: logits are divided by it (as in :func:`token_logprobs`).
        chunk_tokens: tokens (rows x positions) per chunk, >= 1.
        mask: [B, L], optional: only tokens where it is > 0 get a log-prob (the LM head runs on those
            positions alone, e.g. a node's own assistant tokens: the only ones the loss reads); the others
            are 0. Same values at the masked tokens as without it.

    Returns:
        [B, L] float32; position 0 (no prefix) is 0.

    Raises:
        ValueError: ``chunk_tokens < 1`` or ``hidden``/``input_ids`` of different [B, L].
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if tuple(hidden.shape[:2]) != tuple(input_ids.shape):
        raise ValueError(f"hidden {tuple(hidden.shape)} does not match input_ids {tuple(input_ids.shape)}")
    B, L = input_ids.shape
    h, targets = hidden[:, :-1], input_ids[:, 1:]  # [B, L-1, H], [B, L-1]: position t predicts token t + 1
    if mask is None:
        lp = _paired_logprobs(h, targets, lm_head, temperature, chunk_tokens)  # [B, L-1]
    else:
        if tuple(mask.shape) != (B, L):
            raise ValueError(f"mask {tuple(mask.shape)} does not match input_ids {(B, L)}")
        sel = mask[:, 1:] > 0  # [B, L-1]
        picked = _paired_logprobs(h[sel].unsqueeze(0), targets[sel].unsqueeze(0), lm_head, temperature,
                                  chunk_tokens)[0]  # [N]
        lp = torch.zeros((B, L - 1), dtype=torch.float32, device=hidden.device).masked_scatter(sel, picked)
    return torch.nn.functional.pad(lp, (1, 0), value=0.0)  # [B, L]


def _paired_logprobs(h: torch.Tensor, targets: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor],
                     temperature: float, chunk_tokens: int) -> torch.Tensor:
    """log softmax(lm_head(h[b, t]) / T)[targets[b, t]] for h [B, P, H], targets [B, P] -> [B, P] float32,
    ``max(1, chunk_tokens // B)`` positions at a time (each chunk checkpointed when grad is enabled)."""
    from torch.utils.checkpoint import checkpoint

    B, P = targets.shape
    step = max(1, chunk_tokens // max(B, 1))
    parts = []
    for s in range(0, P, step):
        hc, tc = h[:, s:s + step], targets[:, s:s + step]
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_logprobs, hc, tc, lm_head, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(hc, tc, lm_head, temperature))
    return torch.cat(parts, dim=1) if parts else h.new_zeros((B, 0), dtype=torch.float32)


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coef: torch.Tensor,
    *,
    loss_type: str = "ppo",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    normalizer: float | torch.Tensor | None = None,
    aggregation: Aggregation = "token_mean",
    prox_logprobs: torch.Tensor | None = None,
    behaviour_weight_cap: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Token-level RAO policy loss (docs/algorithm.md, "Loss": the formulas and sources).

    The KL-to-reference penalty adds ``kl_coef * k3_t`` with the k3 estimator ``k3 = exp(ref_t - logp_t) -
    (ref_t - logp_t) - 1`` (Schulman, "Approximating KL divergence", 2020), as in GRPO (Shao et al. 2024,
    arXiv:2402.03300). The reported ``kl_mismatch`` is the k3 estimate of KL(pi_behaviour || pi_theta) with the
    samples drawn from the behaviour policy, ``k3 = rho - 1 - log rho`` (0 when the trainer's log-probs agree with
    the ones the inference server reported). ``approx_kl_sum`` is the same estimator with the loss's own ratio (to
    ``prox_logprobs`` where given): stable-baselines3's ``approx_kl_div``, read by ``TrainerConfig.target_kl``.
    Statistics are sums and counts (:class:`LossStats`) so that the trainer can aggregate over micro-batches,
    processes and depths.

    Off-policy correction [departure from the paper; docs/algorithm/async-rl.md]: with ``prox_logprobs`` the
    clipped ratio is taken to the proximal policy, ``rho_t = exp(logp_t - prox_t)``, and each token's loss is
    multiplied by the behaviour importance weight ``u_t = sg[exp(prox_t - old_t)]``; tokens with ``u_t >
    behaviour_weight_cap`` are dropped from the loss (they stay in the normaliser), as AReaL's
    ``behav_imp_weight_cap``. Where ``prox_t == old_t`` this is the on-policy objective exactly (u = 1).

    Args:
        logprobs: [B, L] log pi_theta of each token (with gradient).
        behaviour_logprobs: [B, L] log pi_old recorded at generation time.
        mask: [B, L] 1 on assistant tokens (only they count), 0 elsewhere (prompt, padding).
        coef: [B] per-sample weight ``w_d * A_n`` (ignored for ``sft``).
        loss_type: a key of :data:`rao_core.train.objectives.LOSSES` (``reinforce`` | ``ppo`` | ``cispo`` |
            ``sft``).
        clip_eps_low, clip_eps_high: ratio bounds [1 - eps_low, 1 + eps_high] (ppo, cispo).
        ref_logprobs: [B, L] reference-policy log-probs, needed when ``kl_coef > 0``.
        kl_coef: weight of the k3 KL-to-reference penalty (0: off).
        normalizer: ``token_mean``: divide the token sum by this (assistant tokens of the whole optimizer
            step); ``sequence_mean``: divide the sum of per-node token means by this (node trajectories
            of the step). Default: the micro-batch's own count.
        aggregation: ``token_mean`` | ``sequence_mean`` (docs/algorithm.md, "Loss aggregation").
        prox_logprobs: [B, L] log pi_prox, the trained-from checkpoint's log-probs (no gradient), or None
            (on-policy: the ratio is to ``behaviour_logprobs``). With it, AReaL's decoupled objective (above):
            ``u_t * loss(rho_t = exp(logp_t - prox_t))``, ``u_t = exp(prox_t - old_t)``.
        behaviour_weight_cap: tokens with ``u_t`` above it are dropped from the loss (None: none dropped);
            only used with ``prox_logprobs``.

    Returns:
        ``(loss, stats)``: scalar loss with gradient; :class:`LossStats` detached.

    Raises:
        ValueError: mismatched shapes, unknown ``loss_type``, ``kl_coef > 0`` without reference, a
            non-finite coefficient or behaviour log-prob on an assistant token, ``prox_logprobs`` of another
            shape or non-finite on an assistant token.
    """
    if logprobs.shape != behaviour_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"shape mismatch: logprobs {tuple(logprobs.shape)}, behaviour_logprobs "
                         f"{tuple(behaviour_logprobs.shape)}, mask {tuple(mask.shape)}")
    if coef.shape != logprobs.shape[:1]:
        raise ValueError(f"coef must be [B] = {tuple(logprobs.shape[:1])}, got {tuple(coef.shape)}")
    if loss_type not in LOSSES:
        raise ValueError(f"unknown loss_type {loss_type!r}; known: {', '.join(LOSSES)}")
    if aggregation not in ("token_mean", "sequence_mean"):
        raise ValueError(f"unknown aggregation {aggregation!r}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    m = mask.to(logprobs.dtype)  # [B, L]
    if not torch.isfinite(coef).all():
        raise ValueError("non-finite advantage * weight reached the loss")
    old = torch.where(m > 0, behaviour_logprobs, torch.zeros_like(behaviour_logprobs))  # [B, L]
    if not torch.isfinite(old).all():
        raise ValueError("non-finite behaviour log-prob on an assistant token")

    c = coef.to(logprobs.dtype).unsqueeze(-1)  # [B, 1]
    log_ratio = (logprobs - old) * m  # [B, L]
    u = stale = capped = None
    loss_log_ratio = log_ratio  # [B, L], log of the ratio the loss clips (to pi_prox when given)
    if prox_logprobs is None:
        ratio = torch.exp(log_ratio)  # [B, L], 1 off the mask
    else:  # decoupled: the ratio to pi_prox, the behaviour weight u = pi_prox / pi_behaviour (policy_loss)
        if prox_logprobs.shape != logprobs.shape:
            raise ValueError(f"prox_logprobs {tuple(prox_logprobs.shape)} must be shaped as logprobs "
                             f"{tuple(logprobs.shape)}")
        prox = torch.where(m > 0, prox_logprobs.detach(), torch.zeros_like(prox_logprobs)).to(logprobs.dtype)
        if not torch.isfinite(prox).all():
            raise ValueError("non-finite proximal log-prob on an assistant token")
        loss_log_ratio = (logprobs - prox) * m  # [B, L], to the proximal policy
        ratio = torch.exp(loss_log_ratio)  # [B, L]
        u = torch.exp((prox - old) * m)  # [B, L], 1 off the mask and where prox == old
        stale = (prox != old) & (m > 0)  # [B, L]
        capped = (u > behaviour_weight_cap) & (m > 0) if behaviour_weight_cap is not None else torch.zeros_like(stale)
    per_tok, clipped = LOSSES[loss_type].fn(logprobs, ratio, c, 1.0 - clip_eps_low, 1.0 + clip_eps_high)  # [B, L]
    if clipped is None:
        clipped = torch.zeros_like(m, dtype=torch.bool)
    if u is not None:
        per_tok = per_tok * torch.where(capped, torch.zeros_like(u), u)  # [B, L]
    pg_tok = per_tok * m  # [B, L]
    total_tok = pg_tok
    ref_kl = torch.zeros_like(m)
    if ref_logprobs is not None:
        d = (ref_logprobs - logprobs) * m  # [B, L]
        ref_kl = (torch.exp(d) - d - 1.0) * m  # [B, L], k3 >= 0
        if kl_coef > 0:
            total_tok = total_tok + kl_coef * ref_kl
    tokens = m.sum()
    if aggregation == "token_mean":
        norm = tokens.clamp(min=1.0) if normalizer is None else normalizer
        loss = total_tok.sum() / norm
    else:  # sequence_mean: mean over each node's own tokens, then sum over nodes / normalizer
        per_seq_tokens = m.sum(-1)  # [B]
        seq_mean = total_tok.sum(-1) / per_seq_tokens.clamp(min=1.0)  # [B]
        norm = (per_seq_tokens > 0).sum().clamp(min=1).to(m.dtype) if normalizer is None else normalizer
        loss = seq_mean.sum() / norm

    with torch.no_grad():
        lr_d = log_ratio.detach()
        k3 = (torch.exp(lr_d) - 1.0 - lr_d) * m  # [B, L], KL(behaviour || theta) estimate per token
        llr = loss_log_ratio.detach()  # [B, L]
        stats = LossStats(
            loss_sum=total_tok.detach().sum(),
            pg_loss_sum=pg_tok.detach().sum(),
            ref_kl_sum=ref_kl.detach().sum(),
            tokens=tokens.detach(),
            clipped_tokens=(clipped & (m > 0)).sum().to(m.dtype),
            ratio_sum=(ratio.detach() * m).sum(),
            kl_mismatch_per_sample=k3.sum(-1),
            tokens_per_sample=m.sum(-1),
            ref_kl_per_sample=ref_kl.detach().sum(-1),
            stale_tokens=stale.sum().to(m.dtype) if stale is not None else m.new_zeros(()),
            behaviour_weight_sum=(u * stale).sum() if u is not None else m.new_zeros(()),
            capped_tokens=capped.sum().to(m.dtype) if capped is not None else m.new_zeros(()),
            approx_kl_sum=((torch.exp(llr) - 1.0 - llr) * m).sum(),
        )
    return loss, stats
