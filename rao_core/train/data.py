"""Input checks, minibatches and micro-batching of training samples.

A minibatch is the share of the batch one optimizer step trains (:func:`minibatch_partition`): whole groups (the
samples of one task's G rollout trees, the group of Eq. 3), each sample in exactly one minibatch per epoch.
A micro-batch is one forward/backward of a step (gradient accumulation): micro-batches pad to the longest row
(right padding); samples are sorted by length (longest first) and cut greedily so that ``rows x longest row <=
micro_batch_tokens`` (or ``micro_batch_size`` rows), which keeps padding small. Sequence packing is not
implemented (it needs per-segment attention masks).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rao_core.samples import Sample
from rao_core.train.objectives import LOSSES

__all__ = ["MicroBatch", "validate_samples", "make_micro_batches", "minibatch_partition", "collate"]


def minibatch_partition(group_ids: Sequence[str], minibatches: int, *, seed: int = 0, iteration: int = 0,
                        epoch: int = 0, shuffle: bool = True) -> list[list[int]]:
    """The samples of one epoch cut into minibatches (one optimizer step each), every group whole.

    The distinct groups (in order of first appearance; shuffled by a generator seeded by ``(seed, iteration,
    epoch)`` when ``shuffle``) are cut into ``min(minibatches, groups)`` consecutive runs whose group counts are as
    equal as the count allows: the authors' ``tasks_per_minibatch = batch_size // num_minibatches`` whole tasks
    (platoon 0.4.0 and ApGa/platoon ``platoon/train/tinker/rl.py``; verl counts its ``ppo_mini_batch_size`` in
    prompts too), shuffled per epoch as stable-baselines3's PPO does.

    Args:
        group_ids: [N] the group of each sample (``Sample.group_id``).
        minibatches: the most minibatches, >= 1.
        seed, iteration, epoch: the shuffle's seed (a new order every iteration and epoch).
        shuffle: shuffle the groups before cutting (else their order of first appearance).

    Returns:
        Lists of sample indices (each list in increasing order); every index in ``range(N)`` is in exactly one,
        every group's samples in one list. ``[]`` when ``group_ids`` is empty; ``[list(range(N))]`` when
        ``minibatches`` is 1.

    Raises:
        ValueError: ``minibatches < 1``.
    """
    if minibatches < 1:
        raise ValueError(f"minibatches must be >= 1, got {minibatches}")
    groups = list(dict.fromkeys(group_ids))
    if not groups:
        return []
    if shuffle:
        random.Random(f"rao-minibatch|{seed}|{iteration}|{epoch}").shuffle(groups)
    n = min(minibatches, len(groups))
    where = {g: k for k in range(n) for g in groups[len(groups) * k // n:len(groups) * (k + 1) // n]}
    out: list[list[int]] = [[] for _ in range(n)]
    for i, g in enumerate(group_ids):
        out[where[g]].append(i)
    return out


def validate_samples(samples: Sequence[Sample], vocab_size: int, loss_type: str,
                     max_length: int | None = None) -> None:
    """Reject bad training input before any step is taken.

    Raises:
        ValueError: listing (up to 5) offending samples by ``tree_id/node_id`` for: no samples; lengths of
            token ids, mask and behaviour log-probs differ; a mask value not 0/1; no assistant token; an
            assistant token at position 0 (nothing predicts it); a token id outside [0, vocab_size); a
            non-finite advantage or weight (policy losses) or behaviour log-prob on an assistant token;
            a sequence longer than ``max_length``.
    """
    if not samples:
        raise ValueError("no training samples")
    problems: list[str] = []
    for s in samples:
        where = f"{s.tree_id}/{s.node_id}"
        T = len(s.token_ids)
        if not (T == len(s.assistant_mask) == len(s.behaviour_logprobs)):
            problems.append(f"{where}: mismatched lengths: token_ids {T}, assistant_mask {len(s.assistant_mask)}, "
                            f"behaviour_logprobs {len(s.behaviour_logprobs)}")
            continue
        if any(m not in (0, 1) for m in s.assistant_mask):
            problems.append(f"{where}: assistant_mask values must be 0 or 1")
        elif sum(s.assistant_mask) == 0:
            problems.append(f"{where}: no assistant tokens")
        elif s.assistant_mask[0] == 1:
            problems.append(f"{where}: assistant token at position 0 has no prefix to condition on")
        bad_ids = [t for t in s.token_ids if not 0 <= t < vocab_size]
        if bad_ids:
            problems.append(f"{where}: token ids out of vocabulary [0, {vocab_size}): {bad_ids[:3]}")
        if LOSSES[loss_type].uses_advantage:
            if not (math.isfinite(s.advantage) and math.isfinite(s.weight)):
                problems.append(f"{where}: non-finite advantage {s.advantage} or weight {s.weight}")
            if any(m and not math.isfinite(lp) for m, lp in zip(s.assistant_mask, s.behaviour_logprobs)):
                problems.append(f"{where}: non-finite behaviour log-prob on an assistant token")
        if max_length is not None and T > max_length:
            problems.append(f"{where}: {T} tokens > the model's max_position_embeddings {max_length}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError(f"{len(problems)} bad training sample(s): " + "; ".join(problems[:5]) + more)


@dataclass
class MicroBatch:
    """Indices of the samples of one micro-batch (into the sample list) and its padded size."""

    indices: list[int]
    max_len: int

    @property
    def padded_tokens(self) -> int:
        return len(self.indices) * self.max_len


def make_micro_batches(lengths: Sequence[int], *, micro_batch_tokens: int | None = None,
                       micro_batch_size: int | None = None) -> list[MicroBatch]:
    """Group samples of the given lengths into micro-batches, longest first (deterministic).

    ``micro_batch_size`` (rows) takes precedence over ``micro_batch_tokens`` (padded tokens).
    """
    if micro_batch_size is None and micro_batch_tokens is None:
        raise ValueError("give micro_batch_tokens or micro_batch_size")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[MicroBatch] = []
    cur: list[int] = []
    for i in order:
        if cur:
            longest = lengths[cur[0]]
            full = (len(cur) >= micro_batch_size) if micro_batch_size is not None \
                else (len(cur) + 1) * longest > micro_batch_tokens  # type: ignore[operator]
            if full:
                out.append(MicroBatch(cur, longest))
                cur = []
        cur.append(i)
    if cur:
        out.append(MicroBatch(cur, lengths[cur[0]]))
    return out


def collate(samples: Sequence[Sample], pad_id: int, device: torch.device | str = "cpu",
            zero_out: bool = False) -> dict[str, torch.Tensor]:
    """Right-pad samples into tensors.

    Returns ``input_ids`` [B, L] long, ``attention_mask`` [B, L] long, ``loss_mask`` [B, L] float (1 on
    assistant tokens; all 0 when ``zero_out``, used for the filler micro-batches that keep processes in
    step), ``behaviour_logprobs`` [B, L] float, ``coef`` [B] float (``weight * advantage``), ``depth`` [B] long;
    and ``proximal_logprobs`` [B, L] float only when a sample carries them (a stale sample, asynchronous RL): the
    other samples' rows are their behaviour log-probs (behaviour weight 1, the on-policy ratio).
    """
    B, L = len(samples), max(len(s.token_ids) for s in samples)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    lmask = torch.zeros((B, L), dtype=torch.float32)
    old = torch.zeros((B, L), dtype=torch.float32)
    for b, s in enumerate(samples):
        T = len(s.token_ids)
        ids[b, :T] = torch.tensor(s.token_ids, dtype=torch.long)
        attn[b, :T] = 1
        if not zero_out:
            lmask[b, :T] = torch.tensor(s.assistant_mask, dtype=torch.float32)
        old[b, :T] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
    coef = torch.tensor([s.weight * s.advantage for s in samples], dtype=torch.float32)
    depth = torch.tensor([s.depth for s in samples], dtype=torch.long)
    out = dict(input_ids=ids, attention_mask=attn, loss_mask=lmask, behaviour_logprobs=old, coef=coef, depth=depth)
    if any(s.proximal_logprobs is not None for s in samples):
        prox = old.clone()
        for b, s in enumerate(samples):
            if s.proximal_logprobs is not None:
                prox[b, :len(s.proximal_logprobs)] = torch.tensor(s.proximal_logprobs, dtype=torch.float32)
        out["proximal_logprobs"] = prox
    return {k: v.to(device) for k, v in out.items()}
