"""Seeded task sampling: the one rule that turns (seed, purpose, difficulty) into generated RL tasks.

Every generated task set of the project comes from :func:`sample_tasks`: the campaign's RL training pool
(stream ``"rl-pool"``), the warm start's demonstration tasks (``"demos"``) and the evaluation tasks of the
campaign, the nightly regression and the library (``"eval"``). Difficulty ``d`` of stream ``s`` is
generated with ``env.generate_tasks(seed=task_seed(seed, s, d), difficulty=d, split=...)``, where

    task_seed(seed, stream, difficulty) = int(sha256(f"{stream}|{seed}|{difficulty}")[:8 hex digits]) mod 2^31

so a difficulty's tasks do not depend on which other difficulties are listed or in what order, and two
purposes that draw from the same split (the demonstrations and the RL pool both use ``train``) get
different tasks from the same master seed. Project choice (the paper does not describe how its task
sets are drawn); it replaced three arithmetic rules (``seed*1000+500+i``, ``seed+i``, ``seed+1000*i``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from rao_core.envs.base import Environment, Task

__all__ = ["rollout_seed", "sample_tasks", "split_evenly", "task_seed"]


def task_seed(seed: int, stream: str, difficulty: str) -> int:
    """Generator seed (an int in [0, 2^31)) of ``difficulty`` in ``stream`` under master ``seed``."""
    digest = hashlib.sha256(f"{stream}|{seed}|{difficulty}".encode()).hexdigest()
    return int(digest[:8], 16) % (2 ** 31)


def rollout_seed(seed: int, iteration: int, task_id: str, rollout_index: int) -> int:
    """Sampling seed (an int in [0, 2^31)) of rollout ``rollout_index`` (g in 0..G-1) of task ``task_id`` in RL
    iteration ``iteration`` under master ``seed``: ``int(sha256(f"rollout|{seed}|{iteration}|{task_id}|{g}")[:8
    hex digits]) mod 2^31``, the rule of :func:`task_seed`. It depends on nothing else (not on the other tasks,
    the order the trees run in, or which shard or worker grows the tree: issue 28), and is stored as
    ``ExecutionTree.seed``; each policy request of the tree derives its own from it
    (``rao_core.runtime.agent.request_seed``)."""
    digest = hashlib.sha256(f"rollout|{seed}|{iteration}|{task_id}|{rollout_index}".encode()).hexdigest()
    return int(digest[:8], 16) % (2 ** 31)


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
        stream: purpose of the set (``"rl-pool"``, ``"demos"``, ``"eval"``; module docstring).
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
