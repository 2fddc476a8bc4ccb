"""Training-data validation with great-expectations, run before every training step.

Two tables are checked: ``nodes`` (:func:`node_table`, one row per node of every scored tree: unique ids, parents
present, depth, reward, success and token counts within the run's bounds) and ``samples`` (:func:`sample_table`,
one row per training sample: advantages and weights finite and within the bounds of Eqs. 1, 3-5, log-probs <= 0,
lengths that match, groups of >= 2 scored trees). Every expectation's result goes into a JSON report that the
pipeline stores on S3 and attaches to MLflow and Prefect. great-expectations is imported lazily (its import
costs ~10 s). Docs: docs/pipeline/artifacts.md#data-validation-great-expectations (the expectations and why).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

from rao_core.samples import SampleBatch
from rao_core.tree import ExecutionTree, unscored


def node_table(trees: Sequence[ExecutionTree]):
    """Flatten trees to a pandas DataFrame, one row per node (the columns the expectations read:
    docs/pipeline/artifacts.md, "Data validation")."""
    import pandas as pd

    rows = []
    for t in trees:
        ids = {n.node_id for n in t.nodes}
        for n in t.nodes:
            rows.append({
                "tree_id": t.tree_id, "group_id": t.group_id, "task_id": t.task_id,
                "node_id": f"{t.tree_id}/{n.node_id}",
                "parent_exists": n.parent_id is None or n.parent_id in ids,
                "depth": n.depth, "end_reason": str(n.end_reason),
                "success": float("nan") if n.success is None else float(n.success),
                "success_source": n.success_source or "none",
                "reward": float("nan") if n.reward is None else float(n.reward),
                "num_tokens": len(n.token_ids), "num_assistant_tokens": sum(n.assistant_mask),
                "num_children": len(n.children), "num_turns": len(n.turns),
            })
    return pd.DataFrame(rows)


def sample_table(batch: SampleBatch):
    """One row per training sample: ids, depth, advantage, weight, token counts, group size."""
    import pandas as pd

    trees_per_group: dict[str, set[str]] = {}
    for s in batch.samples:
        trees_per_group.setdefault(s.group_id, set()).add(s.tree_id)
    return pd.DataFrame([{
        "tree_id": s.tree_id, "node_id": f"{s.tree_id}/{s.node_id}", "group_id": s.group_id, "depth": s.depth,
        "advantage": s.advantage, "weight": s.weight, "reward": s.reward,
        "num_tokens": len(s.token_ids), "num_assistant_tokens": sum(s.assistant_mask),
        "group_size": len(trees_per_group[s.group_id]),
        "behaviour_logprob_max": _max_logprob(s.behaviour_logprobs),
        "lengths_match": len(s.token_ids) == len(s.assistant_mask) == len(s.behaviour_logprobs),
    } for s in batch.samples], columns=["tree_id", "node_id", "group_id", "depth", "advantage", "weight",
                                        "reward", "num_tokens", "num_assistant_tokens", "group_size",
                                        "behaviour_logprob_max", "lengths_match"])


def _max_logprob(lps: Sequence[float]) -> float | None:
    """The largest log-prob of a sample (0.0 when it has none), None when one is NaN or +inf (fails
    not-null: great-expectations would skip them in a range check)."""
    if any(unscored(x) or x == math.inf for x in lps):
        return None
    return max(lps, default=0.0)


#: Slack on the reward and advantage bounds for floating-point rounding: a leave-one-out baseline of seven
#: rewards of 1.4 is 1.4000000000000001 (the first ablation run failed its validation on exactly that).
ROUNDING = 1e-9


def advantage_bound(estimator: str, lam: float) -> float | None:
    """Largest |A_n| an estimator can give: ``1 + lambda`` when sigma = 1 (R(n), b_g in [0, 1 + lambda]), plus
    :data:`ROUNDING`; None for ``grpo``, whose division by the group's std has no bound (only finiteness is
    checked)."""
    return None if estimator == "grpo" else 1.0 + lam + ROUNDING


def emptied_by_filters(batch: SampleBatch) -> bool:
    """True when ``batch`` has no sample and the authors' filters removed at least one: every group's nodes
    had one reward (``dropped_nodes_of_uniform_groups``) or only error turns (``dropped_error_only_nodes``)."""
    st = batch.stats
    return not batch.samples and st.dropped_nodes_of_uniform_groups + st.dropped_error_only_nodes > 0


def _suites(max_depth: int, lam: float, context_window: int, num_samples: int, adv_bound: float | None,
            min_samples: int = 1):
    import sys

    import great_expectations as gx

    big = adv_bound if adv_bound is not None else sys.float_info.max  # non-finite values are nulled

    E = gx.expectations
    nodes = [
        E.ExpectColumnValuesToBeUnique(column="node_id"),
        E.ExpectColumnValuesToBeInSet(column="parent_exists", value_set=[True]),
        E.ExpectColumnValuesToBeBetween(column="depth", min_value=0, max_value=max_depth),
        E.ExpectColumnValuesToBeBetween(column="reward", min_value=0.0, max_value=1.0 + lam + ROUNDING),
        E.ExpectColumnValuesToBeBetween(column="success", min_value=0.0, max_value=1.0),
        E.ExpectColumnValuesToBeBetween(column="num_tokens", min_value=0, max_value=context_window),
    ]
    samples = [
        E.ExpectTableRowCountToBeBetween(min_value=min_samples),
        E.ExpectColumnValuesToNotBeNull(column="advantage"),
        E.ExpectColumnValuesToNotBeNull(column="weight"),
        E.ExpectColumnValuesToBeBetween(column="num_assistant_tokens", min_value=1),
        E.ExpectColumnValuesToBeBetween(column="num_tokens", min_value=1, max_value=context_window),
        E.ExpectColumnValuesToBeBetween(column="group_size", min_value=2),
        E.ExpectColumnValuesToBeBetween(column="advantage", min_value=-big, max_value=big),
        E.ExpectColumnValuesToBeBetween(column="weight", min_value=0.0, max_value=max(num_samples, 1)),
        E.ExpectColumnValuesToNotBeNull(column="behaviour_logprob_max"),
        E.ExpectColumnValuesToBeBetween(column="behaviour_logprob_max", max_value=0.0),
        E.ExpectColumnValuesToBeInSet(column="lengths_match", value_set=[True]),
    ]
    return {"nodes": nodes, "samples": samples}


def validate_training_data(trees: Sequence[ExecutionTree], batch: SampleBatch, *, max_depth: int, lam: float,
                           context_window: int, estimator: str = "leave_one_out") -> dict[str, Any]:
    """Run the suites; returns ``{"success": bool, "tables": {name: {...}}, "failures": [str, ...]}``.

    ``estimator``: the advantage estimator the batch was built with (``algo.advantage``), which bounds
    the advantages (:func:`advantage_bound`).

    An empty batch passes only when :func:`emptied_by_filters` (the report's ``emptied_by_filters``).

    NaN rewards/successes (failed judgements) are allowed in the node table (great-expectations treats
    NaN as missing and skips it for range checks); NaN advantages in samples are not.
    """
    import logging

    import great_expectations as gx
    import pandas as pd

    from great_expectations.data_context.types.base import ProgressBarsConfig

    # its "Created temporary directory ... for ephemeral docs site" INFO line reached every campaign's log
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)

    context = gx.get_context(mode="ephemeral")
    # no tqdm "Calculating Metrics" bars in the stage's log (the context's `progress_bars` setting)
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = context.data_sources.add_pandas("rao")
    frames = {"nodes": node_table(trees), "samples": sample_table(batch)}
    # great-expectations skips NaN and also +-inf in range checks: a non-finite advantage or weight becomes
    # null, which the not-null expectations name.
    for col in ("advantage", "weight"):
        frames["samples"][col] = frames["samples"][col].map(lambda x: x if math.isfinite(x) else None)
    empty_ok = emptied_by_filters(batch)
    report: dict[str, Any] = {"success": True, "tables": {}, "failures": [], "emptied_by_filters": empty_ok}
    suites = _suites(max_depth, lam, context_window, len(batch.samples), advantage_bound(estimator, lam),
                     min_samples=0 if empty_ok else 1)
    for name, expectations in suites.items():
        df = frames[name]
        asset = source.add_dataframe_asset(name)
        batch_def = asset.add_batch_definition_whole_dataframe(f"{name}-all")
        suite = context.suites.add(gx.ExpectationSuite(name=f"rao-{name}"))
        for e in expectations:
            suite.add_expectation(e)
        res = batch_def.get_batch(batch_parameters={"dataframe": df}).validate(suite)
        table = {"rows": int(len(df)), "success": bool(res.success), "expectations": []}
        for r in res.results:
            cfg = r.expectation_config
            kwargs = {k: v for k, v in cfg.kwargs.items() if k != "batch_id"}
            entry = {"expectation": cfg.type, "kwargs": kwargs, "success": bool(r.success),
                     "observed": _jsonable(r.result)}
            table["expectations"].append(entry)
            if not r.success:
                report["failures"].append(f"{name}: {cfg.type} {kwargs} -> "
                                          f"{r.result.get('unexpected_count', r.result.get('observed_value'))} "
                                          f"unexpected")
        report["tables"][name] = table
        report["success"] &= table["success"]
    report["group_sizes"] = dict(Counter(frames["samples"]["group_size"].tolist())) if len(frames["samples"]) else {}
    report["group_sizes"] = {str(k): int(v) for k, v in report["group_sizes"].items()}
    _ = pd  # imported for side effect of pandas availability check
    return report


def _jsonable(x: Any) -> Any:
    import json

    try:
        json.dumps(x)
        return x
    except TypeError:
        if isinstance(x, dict):
            return {str(k): _jsonable(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [_jsonable(v) for v in x]
        return str(x)


def report_markdown(report: dict[str, Any]) -> str:
    """A short Markdown rendering of a validation report (for Prefect artifacts)."""
    lines = [f"**Training-data validation: {'PASSED' if report['success'] else 'FAILED'}**", "",
             "| table | expectation | arguments | ok |", "|---|---|---|---|"]
    for name, t in report["tables"].items():
        for e in t["expectations"]:
            lines.append(f"| {name} ({t['rows']} rows) | {e['expectation']} | {e['kwargs']} | "
                         f"{'yes' if e['success'] else '**no**'} |")
    return "\n".join(lines)
