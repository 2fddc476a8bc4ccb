"""Box-Sum (``example``): the smallest complete environment, the walk-through of ``docs/environments.md``.

A row of numbered boxes each holds a number; a node's goal is the total of boxes ``first..last``. Tool:
``open_box(index)``. A sub-agent sums a sub-range (``launch_subagent(first, last)``), so a parent can split
the row and add its children's totals. Verifier (exact, every node): 1.0 iff the node finished with the
total of its range. ``BoxSumExpert`` is the scripted expert; ``judge.md`` beside this file the judge prompt.
"""

from __future__ import annotations

import random
from typing import Any

from rao_core.envs.base import ChildSpec, Environment, Episode, Task, TaskError, ToolError, show_value, tool
from rao_core.policies.base import Generation, Policy, PolicyRequest
from rao_core.tree import Node

SIZES = {"easy": 4, "medium": 16, "hard": 64}  # boxes per task


class BoxSumEnv(Environment):
    """Sum the numbers in a row of boxes, opening them one by one or through sub-agents."""

    name = "example"
    exact_subtask_verifier = True
    difficulties = tuple(SIZES)

    def generate_tasks(self, *, n: int, seed: int, difficulty: str | None = None, split: str = "train",
                       **options: Any) -> list[Task]:
        """``n`` rows of ``SIZES[difficulty]`` boxes (default medium) holding numbers 0..99, seeded by
        ``(seed, split)``. Raises ValueError for an unknown difficulty or any option."""
        size = SIZES.get(difficulty or "medium")
        if size is None or options:
            raise ValueError(f"example: unknown difficulty {difficulty!r} or options {sorted(options)}; "
                             f"expected one of {sorted(SIZES)} and no options")
        rng = random.Random(f"example:{seed}:{split}")
        return [Task(task_id=f"example-{split}-s{seed}-{i}", env=self.name, split=split, difficulty=difficulty or
                     "medium", data={"boxes": [rng.randint(0, 99) for _ in range(size)]}) for i in range(n)]

    def validate_task(self, task: Task) -> None:
        """``data.boxes``: a non-empty list of ints."""
        boxes = task.data.get("boxes")
        if not isinstance(boxes, list) or not boxes or not all(type(b) is int for b in boxes):
            raise TaskError("data.boxes", f"got {show_value(boxes)}", "a non-empty list of ints")

    def new_episode(self, task: Task) -> Episode:
        """No state beyond the task: the boxes never change."""
        return Episode(task=task)

    def root_goal(self, task: Task) -> ChildSpec:
        """The whole row."""
        return self._goal(0, len(task.data["boxes"]) - 1)

    @staticmethod
    def _goal(first: int, last: int) -> ChildSpec:
        return ChildSpec(goal=f"Find the total of the numbers in boxes {first} to {last} (inclusive) and call "
                              "finish(total).", goal_args={"first": first, "last": last})

    def launch_subagent(self, episode: Episode, first: int, last: int) -> ChildSpec:
        """Start a sub-agent that returns the total of boxes `first` to `last` (inclusive). Await it; run
        several at once with asyncio.gather."""
        if not all(type(i) is int for i in (first, last)) or not 0 <= first <= last < len(episode.task.data["boxes"]):
            raise ToolError(f"launch_subagent: need 0 <= first <= last < {len(episode.task.data['boxes'])}, "
                            f"got {first!r}, {last!r}")
        return self._goal(first, last)

    @tool
    def open_box(self, episode: Episode, index: int) -> int:
        """The number in box `index`."""
        boxes = episode.task.data["boxes"]
        if type(index) is not int or not 0 <= index < len(boxes):
            raise ToolError(f"open_box: index must be an int in 0..{len(boxes) - 1}, got {index!r}")
        return boxes[index]

    def verify(self, episode: Episode, node: Node) -> float | None:
        """1.0 iff the node finished with the total of its boxes."""
        first, last = node.goal_args["first"], node.goal_args["last"]
        return float(node.finished and node.result == sum(episode.task.data["boxes"][first:last + 1]))


class BoxSumExpert(Policy):
    """Scripted expert: splits a range longer than ``chunk`` boxes in two halves run as parallel sub-agents
    and adds their totals; opens the boxes of a shorter range itself. One turn per node."""

    name = "example-expert"

    def __init__(self, chunk: int = 8):
        self.chunk = chunk

    async def generate(self, request: PolicyRequest) -> Generation:
        """The node's only cell."""
        first, last = request.node.goal_args["first"], request.node.goal_args["last"]
        if last - first < self.chunk:
            code = f"total = sum(open_box(i) for i in range({first}, {last + 1}))\nfinish(total)"
        else:
            mid = (first + last) // 2
            code = (f"a, b = await asyncio.gather(launch_subagent({first}, {mid}), launch_subagent({mid + 1}, {last}))"
                    "\nfinish(a + b)")
        return Generation(text=f"```python\n{code}\n```", finish_reason="stop")
