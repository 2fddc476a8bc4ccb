"""Seeded task sampling: the one rule that turns (seed, purpose, difficulty) into generated RL tasks.

Every generated task set of the project comes from :func:`sample_tasks`: the RL training pool (stream
``"rl-pool"``), the warm start's demonstrations (``"demos"``), the development set (``"dev"``) and the evaluation
tasks (``"eval"``). Difficulty ``d`` of stream ``s`` is generated with seed

    task_seed(seed, stream, difficulty) = int(sha256(f"{stream}|{seed}|{difficulty}")[:8 hex digits]) mod 2^31

so a difficulty's tasks do not depend on the other difficulties listed, and two purposes that draw from one split
get different tasks from one master seed. Project choice (the paper does not say how its task sets are drawn).
:func:`check_disjoint` refuses held-out sets that share a task (:func:`task_identity`) with training or each other.
Docs: docs/pipeline/evaluation.md#evaluation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rao_core.envs.base import Environment, Task

__all__ = ["check_disjoint", "eval_tree_seed", "rollout_seed", "sample_tasks", "split_evenly", "task_identity",
           "task_seed"]


def _hash_seed(text: str) -> int:
    """``int(sha256(text)[:8 hex digits]) mod 2^31``: the one rule behind every seed of this module."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % (2 ** 31)


def task_seed(seed: int, stream: str, difficulty: str) -> int:
    """Generator seed (an int in [0, 2^31)) of ``difficulty`` in ``stream`` under master ``seed``."""
    return _hash_seed(f"{stream}|{seed}|{difficulty}")


def rollout_seed(seed: int, iteration: int, task_id: str, rollout_index: int) -> int:
    """Sampling seed (an int in [0, 2^31)) of rollout ``rollout_index`` (g in 0..G-1) of task ``task_id`` in RL
    iteration ``iteration`` under master ``seed``: ``int(sha256(f"rollout|{seed}|{iteration}|{task_id}|{g}")[:8
    hex digits]) mod 2^31``, the rule of :func:`task_seed`. It depends on nothing else (not on the other tasks,
    the order the trees run in, or which shard or worker grows the tree), and is stored as
    ``ExecutionTree.seed``; each policy request of the tree derives its own from it
    (``rao_core.runtime.agent.request_seed``)."""
    return _hash_seed(f"rollout|{seed}|{iteration}|{task_id}|{rollout_index}")


def eval_tree_seed(seed: int, mode: str, task_id: str) -> int:
    """Sampling seed (an int in [0, 2^31)) of the evaluation tree of task ``task_id`` in ``mode`` under the
    evaluation seed ``seed`` (``eval.seed``): ``int(sha256(f"eval-tree|{seed}|{mode}|{task_id}")[:8 hex
    digits]) mod 2^31``, the rule of :func:`rollout_seed`. Two checkpoints evaluated on the same tasks ask for
    the same seeds, so where the server honours them (vLLM on GPUs; ``serving.request_seeds``) the nightly's
    paired comparison differs only by the checkpoints; stored as ``ExecutionTree.seed``."""
    return _hash_seed(f"eval-tree|{seed}|{mode}|{task_id}")


def split_evenly(total: int, k: int) -> list[int]:
    """``total`` split over ``k`` parts, the first parts getting the remainder (5, 2 -> [3, 2]).

    Raises ValueError for ``k < 1`` or ``total < 0``.
    """
    if k < 1 or total < 0:
        raise ValueError(f"cannot split {total} over {k} parts")
    return [total // k + (1 if i < total % k else 0) for i in range(k)]


def sample_tasks(env: Environment, *, seed: int, stream: str, difficulties: Sequence[str],
                 n: int | Sequence[int], split: str, **options: Any) -> list[Task]:
    """Generate the seeded tasks of ``stream``: ``n`` per difficulty (or ``n[i]`` for difficulty i).

    Args:
        env: the environment whose ``generate_tasks`` is called.
        seed: master seed; difficulty ``d`` uses :func:`task_seed` ``(seed, stream, d)``.
        stream: purpose of the set (``"rl-pool"``, ``"demos"``, ``"dev"``, ``"eval"``; module docstring).
        difficulties: environment difficulty names, generated in this order.
        n: tasks per difficulty, or one count per difficulty (a count of 0 generates nothing).
        split: task split (``train`` / ``validation`` / ``test``; environments keep their targets apart).
        options: extra ``generate_tasks`` options (e.g. ``graph_seed``, ``target_tokens``).

    Returns:
        The tasks, difficulty by difficulty; a task whose generator left ``difficulty`` empty gets ``d``.

    Raises:
        ValueError: a count list whose length differs from ``difficulties``, a negative count, or a bad
            generator option; NotImplementedError: the environment has no generator.
    """
    counts = [n] * len(difficulties) if isinstance(n, int) else list(n)
    if len(counts) != len(difficulties):
        raise ValueError(f"{len(counts)} task counts for {len(difficulties)} difficulties {list(difficulties)}")
    out: list[Task] = []
    for d, k in zip(difficulties, counts):
        if k < 0:
            raise ValueError(f"negative task count {k} for difficulty {d!r}")
        if k == 0:
            continue
        tasks = env.generate_tasks(n=k, seed=task_seed(seed, stream, d), difficulty=d, split=split, **options)
        for t in tasks:
            if not t.difficulty:
                t.difficulty = d
        out += tasks
    return out


def task_identity(task: Task) -> str:
    """What makes two tasks the same problem, whatever their ids, splits and difficulty names: TextCraft's
    target multiset (``data.targets``), written ``"targets a x1, b x3"`` (items sorted); for a task without
    targets, a digest of its whole ``data`` (``"data sha256:<16 hex digits>"``)."""
    targets = task.data.get("targets")
    if isinstance(targets, dict) and targets:
        return "targets " + ", ".join(f"{item} x{count}" for item, count in sorted(targets.items()))
    digest = hashlib.sha256(json.dumps(task.data, sort_keys=True, default=str).encode()).hexdigest()
    return f"data sha256:{digest[:16]}"


def check_disjoint(held_out: Mapping[str, Sequence[Task]], training: Mapping[str, Sequence[Task]]) -> dict[str, int]:
    """Refuse task sets that share a problem (:func:`task_identity`): every held-out set (e.g. ``evaluation``,
    ``development``) against every training set (``training``, ``demonstrations``) and the held-out sets
    against each other; training sets may share tasks. Keys are the sets' names as a message should say them.

    Returns the number of tasks of each set. Raises ValueError naming, for each pair that overlaps, the number
    of shared problems and up to three of them with one task id from each side, e.g. ``"evaluation and
    training share 2 task(s): targets a x1, b x2 (tcs-validation-... / tcs-train-...); ..."``.
    """
    def ids(tasks: Sequence[Task]) -> dict[str, str]:
        out: dict[str, str] = {}
        for t in tasks:
            out.setdefault(task_identity(t), t.task_id)
        return out

    keyed = {name: ids(ts) for name, ts in {**held_out, **training}.items()}
    names = list(held_out)
    pairs = [(a, b) for a in names for b in training] + [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    problems = []
    for a, b in pairs:
        common = [k for k in keyed[a] if k in keyed[b]]
        if common:
            shown = "; ".join(f"{k} ({keyed[a][k]} / {keyed[b][k]})" for k in common[:3])
            more = f"; and {len(common) - 3} more" if len(common) > 3 else ""
            problems.append(f"{a} and {b} share {len(common)} task(s): {shown}{more}")
    if problems:
        raise ValueError("held-out tasks are not disjoint from the others: " + " | ".join(problems))
    return {name: len(ts) for name, ts in {**held_out, **training}.items()}
