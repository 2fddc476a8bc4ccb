"""The reading of a sweep of config variants run as units (``research.designs.UnitDesign.variants``): its
preregistered decision rule applied to the unit records, written before any unit ran.

Per variant, paired per problem on the sweep's evaluation set (the endpoint's difficulty and mode): solved (the
root's outcome >= 1) at the variant's last checkpoint vs at the shared warm start (the warm-start unit's iteration-0
point; the unit's own where its rebuilt warm start differed). ``gain`` = successes(last) - successes(warm start);
the collapse check is an exact one-sided McNemar test for a decrease (``rao_core.guard.sign_test_p`` of the
problems lost against those gained), p < :data:`COLLAPSE_ALPHA`: the variant is out. The choice is the largest gain
among the rest; variants within :data:`TIE_PROBLEMS` problems of it tie, and a tie goes to fewer minibatches
(``trainer.steps_per_batch``), then to the learning rate closest, on a log scale, to :data:`AUTHORS_SCALED_LR`. The
chosen variant *learns* when its gain is > 0 with the exact one-sided McNemar p for an increase <
:data:`LEARN_ALPHA` (a screening level). Docs: docs/experiments/update-sweep.md "The decision rule".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from research.units import WARM_PREFIX, UnitPlan, read_record

#: A variant whose one-sided exact McNemar p for a decrease is below this is out (the collapse check).
COLLAPSE_ALPHA = 0.05
#: The chosen variant learns when its one-sided exact McNemar p for an increase is below this (screening).
LEARN_ALPHA = 0.10
#: Variants whose gains are within this many problems of the largest tie.
TIE_PROBLEMS = 3
#: The authors' full fine-tuning rate (3e-6 for a 4B model) scaled to 135M parameters by 1/sqrt(parameters)
#: (tinker-cookbook ``hyperparam_utils.get_full_finetune_lr_multiplier``): 3e-6 x sqrt(4.0e9 / 1.35e8).
AUTHORS_SCALED_LR = 1.6e-5


def _point(points: list[dict[str, Any]], iteration: int | None, difficulty: str, mode: str) -> dict[str, Any] | None:
    """The non-control point of ``difficulty`` and ``mode`` at ``iteration`` (None: the last iteration there is)."""
    own = [p for p in points if not p.get("control") and p.get("difficulty") == difficulty and p.get("mode") == mode]
    if iteration is None:
        own = [p for p in own if p["iteration"] == max((q["iteration"] for q in own), default=None)]
    else:
        own = [p for p in own if p["iteration"] == iteration]
    return own[0] if own else None


def variant_rows(plan: UnitPlan, root: Path | None = None) -> list[dict[str, Any]]:
    """One row per variant unit of ``plan`` with a finished record, in the design's order: ``variant``, ``unit``,
    ``lr``, ``minibatches``, ``n`` (problems scored at both points), ``warm`` and ``last`` (successes),
    ``iteration`` (the last one), ``gain``, ``gained`` / ``lost`` (the discordant problems), ``p_decrease`` and
    ``p_increase`` (exact one-sided McNemar), ``out`` (``p_decrease`` < :data:`COLLAPSE_ALPHA`) and
    ``warm_start_from`` (``warm-start unit`` or ``this unit``). Raises ValueError for a design without variants, a
    record that is not JSON, or a finished unit whose points or warm-start point are missing."""
    from rao_core.guard import sign_test_p

    if not plan.design.variants:
        raise ValueError(f"{plan.experiment} has no variants: it is not a sweep")
    rows = []
    for u in plan.units:
        if u.is_warm_start or not (rec := read_record(plan.experiment, u.name, root)) or not rec.get("complete"):
            continue
        cfg = plan.configs[u.name]
        ep = cfg.eval.endpoint
        diff, mode = (ep.difficulty, ep.mode) if ep else (cfg.eval.difficulties[0], cfg.eval.modes[0])
        last = _point(rec.get("points", []), None, diff, mode)
        warm, source = _point(rec.get("points", []), 0, diff, mode), "this unit"
        if warm is None:
            ref = read_record(plan.experiment, f"{WARM_PREFIX}{u.warm}", root) or {}
            warm, source = _point(ref.get("points", []), 0, diff, mode), "warm-start unit"
        if last is None or warm is None or last["iteration"] == 0:
            raise ValueError(f"{plan.experiment} unit {u.name}: its record lacks the last or the warm-start point "
                             f"({diff}, {mode})")
        pairs = [(float(warm["per_task"][k] >= 1), float(v >= 1)) for k, v in last["per_task"].items()
                 if v is not None and warm["per_task"].get(k) is not None]
        gained = sum(1 for w, x in pairs if x > w)
        lost = sum(1 for w, x in pairs if x < w)
        p_down = sign_test_p(lost, gained)
        rows.append({"variant": u.variant, "unit": u.name, "lr": cfg.trainer.lr,
                     "minibatches": cfg.trainer.steps_per_batch, "n": len(pairs),
                     "warm": int(sum(w for w, _ in pairs)), "last": int(sum(x for _, x in pairs)),
                     "iteration": last["iteration"], "gain": gained - lost, "gained": gained, "lost": lost,
                     "p_decrease": p_down, "p_increase": sign_test_p(gained, lost), "out": p_down < COLLAPSE_ALPHA,
                     "warm_start_from": source})
    return rows


def choose(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule's choice among :func:`variant_rows`' ``rows``: ``out`` (the variants the collapse check put out),
    ``tied`` (the rest within :data:`TIE_PROBLEMS` of the largest gain, in the rule's order: fewer minibatches,
    then lr closest to :data:`AUTHORS_SCALED_LR` on a log scale), ``chosen`` (the first of them; None when every
    variant is out or there is no row) and ``learns`` (the chosen gain > 0 and its ``p_increase`` <
    :data:`LEARN_ALPHA`)."""
    rest = [r for r in rows if not r["out"]]
    out = {"out": [r["variant"] for r in rows if r["out"]], "tied": [], "chosen": None, "learns": False}
    if not rest:
        return out
    best = max(r["gain"] for r in rest)
    tied = sorted((r for r in rest if r["gain"] >= best - TIE_PROBLEMS),
                  key=lambda r: (r["minibatches"], abs(math.log(r["lr"] / AUTHORS_SCALED_LR))))
    chosen = tied[0]
    out.update(tied=[r["variant"] for r in tied], chosen=chosen["variant"],
               learns=chosen["gain"] > 0 and chosen["p_increase"] < LEARN_ALPHA)
    return out


def sweep_reading(plan: UnitPlan, root: Path | None = None) -> dict[str, Any]:
    """The sweep's reading: ``rows`` (:func:`variant_rows`), ``complete`` (every variant unit has its record) and,
    only then, the rule's decision (:func:`choose`: ``out``, ``tied``, ``chosen``, ``learns``); before that the
    decision keys are None. Raises ValueError as :func:`variant_rows` does."""
    rows = variant_rows(plan, root)
    complete = len(rows) == sum(not u.is_warm_start for u in plan.units)
    decision = choose(rows) if complete else {"out": None, "tied": None, "chosen": None, "learns": None}
    return {"experiment": plan.experiment, "rows": rows, "complete": complete, **decision}
