"""Training-data validation with great-expectations, run before every training step.

Two tables are checked (documented in ``docs/pipeline.md``, "Data validation"):

``nodes`` (one row per node of every scored tree, from :func:`node_table`):
  - ``node_id`` unique (ids are ``<tree_id>/<node_id>``), ``parent_exists`` true for every row,
    ``depth`` in ``[0, max_depth]``, ``reward`` in ``[0, 1 + lambda]`` (rows with a reward),
    ``success`` in ``[0, 1]`` (rows with a success), ``num_tokens`` at most the context window.
``samples`` (one row per training sample, from :func:`sample_table`):
  - ``advantage`` and ``weight`` never null/NaN, ``num_assistant_tokens`` >= 1,
    ``num_tokens`` at most the context window, ``group_size`` >= 2 (scored trees in the sample's group),
    at least one row.

Every expectation's result goes into a JSON report (success flag, per-expectation observed values) that
the pipeline stores on S3 and attaches to MLflow and Prefect. great-expectations is imported lazily
(its import costs ~10 s).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from rao_core.samples import SampleBatch
from rao_core.tree import ExecutionTree, unscored


def node_table(trees: Sequence[ExecutionTree]):
    """Flatten trees to a pandas DataFrame, one row per node (columns listed in the module docstring)."""
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
    } for s in batch.samples], columns=["tree_id", "node_id", "group_id", "depth", "advantage", "weight",
                                        "reward", "num_tokens", "num_assistant_tokens", "group_size"])


def _suites(max_depth: int, lam: float, context_window: int):
    import great_expectations as gx

    E = gx.expectations
    nodes = [
        E.ExpectColumnValuesToBeUnique(column="node_id"),
        E.ExpectColumnValuesToBeInSet(column="parent_exists", value_set=[True]),
        E.ExpectColumnValuesToBeBetween(column="depth", min_value=0, max_value=max_depth),
        E.ExpectColumnValuesToBeBetween(column="reward", min_value=0.0, max_value=1.0 + lam),
        E.ExpectColumnValuesToBeBetween(column="success", min_value=0.0, max_value=1.0),
        E.ExpectColumnValuesToBeBetween(column="num_tokens", min_value=0, max_value=context_window),
    ]
    samples = [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        E.ExpectColumnValuesToNotBeNull(column="advantage"),
        E.ExpectColumnValuesToNotBeNull(column="weight"),
        E.ExpectColumnValuesToBeBetween(column="num_assistant_tokens", min_value=1),
        E.ExpectColumnValuesToBeBetween(column="num_tokens", min_value=1, max_value=context_window),
        E.ExpectColumnValuesToBeBetween(column="group_size", min_value=2),
    ]
    return {"nodes": nodes, "samples": samples}


def validate_training_data(trees: Sequence[ExecutionTree], batch: SampleBatch, *, max_depth: int, lam: float,
                           context_window: int) -> dict[str, Any]:
    """Run the suites; returns ``{"success": bool, "tables": {name: {...}}, "failures": [str, ...]}``.

    NaN rewards/successes (failed judgements) are allowed in the node table (great-expectations treats
    NaN as missing and skips it for range checks); NaN advantages in samples are not.
    """
    import great_expectations as gx
    import pandas as pd

    context = gx.get_context(mode="ephemeral")
    source = context.data_sources.add_pandas("rao")
    frames = {"nodes": node_table(trees), "samples": sample_table(batch)}
    # NaN is not null for pandas' isnull? It is; but make the advantage check explicit anyway.
    frames["samples"]["advantage"] = frames["samples"]["advantage"].map(
        lambda x: None if unscored(x) else x)
    report: dict[str, Any] = {"success": True, "tables": {}, "failures": []}
    for name, expectations in _suites(max_depth, lam, context_window).items():
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
