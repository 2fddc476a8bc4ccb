"""Namespaced metrics of a batch of execution trees (pure; the pipeline logs them to MLflow).

Names (also listed in ``docs/pipeline/artifacts.md``):
- ``success/root``, ``success/depth_<d>``: mean node success s (scored nodes) overall roots / per depth.
- ``reward/root``, ``reward/depth_<d>``: mean local reward R of Eq. (1) per depth.
- ``tree/depth_mean``, ``tree/depth_max``, ``tree/nodes_mean``, ``tree/delegation_rate`` (fraction of trees
  whose root launched at least one child), ``tree/children_per_node`` (mean over nodes that delegated),
  ``tree/wall_s_mean``, ``tree/crashed`` (trees with ``error``), ``tree/parallel_share`` (fraction of
  children whose run overlapped a sibling's: launched together, e.g. by ``asyncio.gather``).
- ``tokens/completion_total``, ``tokens/prompt_mean_per_node``, ``tokens/completion_mean_per_node``,
  ``tokens/completion_depth_<d>`` (mean generated tokens of a node at depth d).
- ``samples/depth_<d>/{samples,signal_samples,mean_abs_advantage,mean_advantage,mean_advantage_solved,
  assistant_tokens}``: the training samples of each depth level (:func:`sample_depth_metrics`, from
  ``SampleStats``; ``mean_advantage_solved``: the signed mean A_n of the depth's solved nodes, negative when
  the shared baseline of Eq. 3-4 pushes successful nodes down).
- ``end/<reason>``: fraction of nodes that ended for each reason.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from rao_core.tree import ExecutionTree, unscored


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def overlapping_children(tree: ExecutionTree, node_id: str) -> tuple[int, int]:
    """(children of ``node_id`` whose [start, end) overlaps a sibling's, all children of ``node_id``)."""
    kids = tree.children_of(node_id)
    spans = [(k.timings.started_at, k.timings.started_at + k.timings.wall_s) for k in kids]
    over = sum(1 for i, (a, b) in enumerate(spans)
               if any(j != i and a < d and c < b for j, (c, d) in enumerate(spans)))
    return over, len(kids)


def parallel_share(trees: Sequence[ExecutionTree]) -> float:
    """Fraction of all non-root nodes of ``trees`` that ran at the same time as a sibling (0.0 with none)."""
    over = total = 0
    for t in trees:
        for n in t.nodes:
            if not n.children:
                continue
            o, k = overlapping_children(t, n.node_id)
            over, total = over + o, total + k
    return over / total if total else 0.0


def sample_depth_metrics(stats: dict) -> dict[str, float]:
    """Flat per-depth sample metrics ``samples/depth_<d>/<name>`` from a ``SampleStats`` dump (its
    ``*_per_depth`` dicts; keys may be ints or, after JSON, strings)."""
    out: dict[str, float] = {}
    for field, name in (("samples_per_depth", "samples"), ("signal_samples_per_depth", "signal_samples"),
                        ("mean_abs_advantage_per_depth", "mean_abs_advantage"),
                        ("mean_advantage_per_depth", "mean_advantage"),
                        ("mean_advantage_solved_per_depth", "mean_advantage_solved"),
                        ("assistant_tokens_per_depth", "assistant_tokens")):
        for d, v in (stats.get(field) or {}).items():
            out[f"samples/depth_{int(d)}/{name}"] = float(v)
    return out


def tree_metrics(trees: Sequence[ExecutionTree]) -> dict[str, float]:
    """Metrics of ``trees`` (see module docstring). Empty input gives an empty dict."""
    if not trees:
        return {}
    out: dict[str, float] = {}
    succ: dict[int, list[float]] = defaultdict(list)
    rew: dict[int, list[float]] = defaultdict(list)
    ends: Counter[str] = Counter()
    n_nodes = 0
    prompt, completion, kids = [], [], []
    completion_at: dict[int, list[float]] = defaultdict(list)
    for t in trees:
        for n in t.nodes:
            n_nodes += 1
            ends[str(n.end_reason)] += 1
            if not unscored(n.success):
                succ[n.depth].append(float(n.success))  # type: ignore[arg-type]
            if not unscored(n.reward):
                rew[n.depth].append(float(n.reward))  # type: ignore[arg-type]
            prompt.append(n.num_prompt_tokens)
            completion.append(n.num_completion_tokens)
            completion_at[n.depth].append(float(n.num_completion_tokens))
            if n.children:
                kids.append(len(n.children))
    for name, by_depth in (("success", succ), ("reward", rew)):
        out.update({f"{name}/depth_{d}": _mean(xs) for d, xs in sorted(by_depth.items())})
        if 0 in by_depth:
            out[f"{name}/root"] = out[f"{name}/depth_0"]
    out["tree/depth_mean"] = _mean([t.depth for t in trees])
    out["tree/depth_max"] = float(max(t.depth for t in trees))
    out["tree/nodes_mean"] = n_nodes / len(trees)
    out["tree/delegation_rate"] = _mean([1.0 if t.root.children else 0.0 for t in trees])
    out["tree/children_per_node"] = _mean(kids) if kids else 0.0
    out["tree/wall_s_mean"] = _mean([t.wall_s for t in trees])
    out["tree/crashed"] = float(sum(1 for t in trees if t.error))
    out["tree/parallel_share"] = parallel_share(trees)
    out.update({f"tokens/completion_depth_{d}": _mean(xs) for d, xs in sorted(completion_at.items())})
    out["tokens/completion_total"] = float(sum(completion))
    out["tokens/prompt_mean_per_node"] = _mean(prompt)
    out["tokens/completion_mean_per_node"] = _mean(completion)
    for reason, c in ends.items():
        out[f"end/{reason}"] = c / n_nodes
    return {k: v for k, v in out.items() if not unscored(v)}


def depth_histogram(trees: Sequence[ExecutionTree]) -> dict[int, int]:
    """Number of nodes at each depth over ``trees``."""
    c: Counter[int] = Counter(n.depth for t in trees for n in t.nodes)
    return dict(sorted(c.items()))
