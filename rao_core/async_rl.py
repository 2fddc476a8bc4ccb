"""The schedule of asynchronous RL: which stage runs where in each step of an overlapped campaign.

[departure from the paper, which trains synchronously] With ``algo.max_staleness >= 1`` a campaign of K
iterations runs K + 1 steps (:func:`overlap_schedule`). In step k the policy server holds checkpoint k - 1 and two
sides run at once: the train side judges, validates and trains iteration k; the serving side evaluates, registers
and logs iteration k - 1, then generates iteration k + 1's trees. Trees of iteration k come from version
``max(k - 2, 0)`` (:func:`tree_version`): a lag of 1 from iteration 2 on, whatever ``max_staleness >= 1`` allows
(one generation deep, as verl's one-step off-policy mode; AReaL's ``max_head_offpolicyness`` runs further ahead).
Pure Python: the Prefect flow is ``flows.campaign`` (``rao_overlap_step``). Also here: the iteration's
importance-ratio statistics over all its optimizer steps (:func:`iteration_ratio_stats`).
Docs: docs/algorithm/async-rl.md.
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["OverlapStep", "iteration_ratio_stats", "overlap_schedule", "tree_version"]


class OverlapStep(BaseModel):
    """One step of :func:`overlap_schedule` (None: that part does not run in this step)."""

    step: int  # 1..K+1
    serve: int  # the checkpoint version the policy server holds throughout the step
    generate_first: int | None = None  # iteration whose trees are generated before the sides start (step 1)
    train: int | None = None  # train side: the iteration judged, validated and trained (from version train - 1)
    evaluate: int | None = None  # serving side: the iteration evaluated, registered and logged (its checkpoint)
    generate_next: int | None = None  # serving side, after the evaluation: the iteration whose trees are grown


def tree_version(iteration: int, max_staleness: int) -> int:
    """The checkpoint version that generates iteration ``iteration``'s trees: ``iteration - 1`` in the
    synchronous loop (``max_staleness`` 0), ``max(iteration - 2, 0)`` in the overlapped one (:func:`overlap_schedule`).

    Raises ValueError for ``iteration < 1`` or ``max_staleness < 0``."""
    if iteration < 1 or max_staleness < 0:
        raise ValueError(f"iteration {iteration} (>= 1) and max_staleness {max_staleness} (>= 0)")
    return iteration - 1 if max_staleness == 0 else max(iteration - 2, 0)


def overlap_schedule(iterations: int) -> list[OverlapStep]:
    """The K + 1 steps of an overlapped campaign of ``iterations`` = K >= 1 RL iterations (module docstring).

    Step 1 first generates iteration 1's trees (with version 0) before the two sides start; step K + 1 has only
    the serving side (iteration K's evaluation). The server switches checkpoint only at a step's start, when both
    sides of the previous step are done, so never under a running tree. Each stage appears in exactly one step
    (tested), so a resumed campaign that replays the steps redoes nothing that has its marker.

    Raises ValueError for K < 1."""
    if iterations < 1:
        raise ValueError(f"an overlapped campaign needs at least one iteration, not {iterations}")
    K = iterations
    return [OverlapStep(step=k, serve=k - 1, generate_first=1 if k == 1 else None,
                        train=k if k <= K else None, evaluate=k - 1 if k >= 2 else None,
                        generate_next=k + 1 if k + 1 <= K else None)
            for k in range(1, K + 2)]


def iteration_ratio_stats(steps: list[dict[str, float]]) -> dict[str, float]:
    """Per-token means over ALL optimizer steps of one iteration of the trainer's per-step ratio statistics
    (each step's ``train/*`` value is a mean over that step's assistant tokens, ``train/tokens``): returns
    ``train/iter_ratio_mean`` and ``train/iter_clip_frac`` (weights: the steps' tokens), and where the
    off-policy correction ran (docs/algorithm/async-rl.md) ``train/iter_stale_token_frac`` and, over
    the stale tokens (weights: tokens x stale_token_frac), ``train/iter_behaviour_weight_mean`` and
    ``train/iter_behaviour_weight_capped_frac``. The last step alone (what a campaign logs as ``train/*``)
    describes one micro-batch group after the earlier updates. Empty for no steps or no tokens."""
    tok = [float(s.get("train/tokens", 0.0)) for s in steps]
    total = sum(tok)
    if not total:
        return {}

    def mean(key: str, weights: list[float]) -> float | None:
        pairs = [(s[key], w) for s, w in zip(steps, weights) if key in s and w > 0]
        denom = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / denom if denom else None

    out = {"train/iter_ratio_mean": mean("train/ratio_mean", tok), "train/iter_clip_frac": mean("train/clip_frac", tok)}
    if any("train/stale_token_frac" in s for s in steps):
        stale = [t * float(s.get("train/stale_token_frac", 0.0)) for s, t in zip(steps, tok)]
        out["train/iter_stale_token_frac"] = sum(stale) / total
        out["train/iter_behaviour_weight_mean"] = mean("train/behaviour_weight_mean", stale)
        out["train/iter_behaviour_weight_capped_frac"] = mean("train/behaviour_weight_capped_frac", stale)
    return {k: v for k, v in out.items() if v is not None}
