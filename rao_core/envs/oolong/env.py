"""Oolong environment: a long transcript in the REPL variable ``context``, exact root verification.

- Root node: ``context`` holds the task's full context window text (``repl_variables``); its goal is the
  question plus how to answer. A child gets the ``context`` string its parent passed to
  ``launch_subagent(goal, context='')`` (the base signature), so a parent can hand each sub-agent a slice.
- Tools: ``count_tokens(text)`` (approximate, ``approx_tokens``); ``finish`` is the runtime's.
- Verifier: the root is scored exactly with ``score_answer`` (Oolong-Real and generated tasks) or
  ``score_synth_answer`` (Oolong-synth records) on ``str(node.result)``; 0.0 when the root did not
  finish. Sub-agent nodes return None (their sub-questions have no gold answer: judge or root proxy).
"""

from __future__ import annotations

from typing import Any

from rao_core.envs.base import (ChildSpec, Environment, Episode, Task, TaskError, ToolError, check_options, require_text,
                                show_value, tool)
from rao_core.envs.oolong.scoring import SYNTH_ANSWER_TYPES, score_answer, score_synth_answer
from rao_core.envs.oolong.synth import QUESTION_TYPES, approx_tokens, generate_oolong_tasks
from rao_core.tree import EndReason, Node


class OolongEnv(Environment):
    """Oolong (``oolong``): long-context aggregation questions over D&D transcripts."""

    name = "oolong"
    #: Cap of the ``useful`` delegation bonus (rao_core.rewards; docs/algorithm/authors-code.md):
    #: the authors' Oolong reward processor (ApGa/platoon 01fcd20 plugins/oolong train_areal.py).
    delegation_cap = 0.4
    difficulties = (*QUESTION_TYPES, "mixed")
    exact_subtask_verifier = False

    @tool
    def count_tokens(self, text: str) -> int:
        """Approximate number of tokens in `text` (words and punctuation marks); use it to cut `context` into
        pieces that fit a sub-agent's window."""
        if not isinstance(text, str):
            raise ToolError(f"count_tokens(text): text must be a string, got {type(text).__name__}")
        return approx_tokens(text)

    def extra_system_prompt(self) -> str:
        """How the long input is exposed."""
        return ("The input document is in the Python variable `context` (a string, possibly far longer than "
                "your context window): never print it whole. Inspect slices, use code to search and count, or "
                "give pieces to sub-agents with launch_subagent(goal, context=piece). End with "
                "finish(answer) where the answer is written inside \\boxed{}.")

    def validate_task(self, task: Task) -> None:
        """``data.context``: a string; ``data.question``: a non-empty string; ``data.answer``: present (a
        string, or for Oolong-synth records a list); Oolong-synth records need a known ``answer_type``.
        Raises TaskError naming the field."""
        d = task.data
        if not isinstance(d.get("context"), str):
            raise TaskError("data.context", "missing" if "context" not in d else f"got {show_value(d['context'])}",
                            "the document as a string")
        require_text(d, "question")
        synth = d.get("source") == "oolong-synth"
        if not isinstance(d.get("answer"), str) and not (synth and isinstance(d.get("answer"), list)):
            raise TaskError("data.answer", "missing" if "answer" not in d else f"got {show_value(d['answer'])}",
                            "the gold answer as a string" + (" or list" if synth else ""))
        if synth and d.get("answer_type") not in SYNTH_ANSWER_TYPES:
            raise TaskError("data.answer_type", f"got {show_value(d.get('answer_type'))}",
                            f"one of {sorted(SYNTH_ANSWER_TYPES)}")

    def new_episode(self, task: Task) -> Episode:
        """No orchestrator-side state beyond the task (checked by ``validate_task``: TaskError, a ValueError)."""
        self.validate_task(task)
        return Episode(task=task)

    def root_goal(self, task: Task) -> ChildSpec:
        """The question, with the size of ``context`` and the answer format."""
        ctx = task.data["context"]
        goal = (f"{task.data['question']}\n\nThe transcript is in the variable `context` ({len(ctx)} characters, "
                f"about {approx_tokens(ctx)} tokens). Answer with finish(...) and put the final answer inside "
                "\\boxed{}.")
        return ChildSpec(goal=goal, goal_args={"question": task.data["question"]})

    def repl_variables(self, episode: Episode, node: Node) -> dict[str, Any]:
        """``context``: the full text at the root, the parent's ``context`` argument in a sub-agent."""
        if node.parent_id is None:
            return {"context": episode.task.data["context"]}
        return {"context": str(node.goal_args.get("context", ""))}

    def verify(self, episode: Episode, node: Node) -> float | None:
        """Root: exact Oolong score of ``str(node.result)`` (0.0 if not finished). Sub-agents: None."""
        if node.parent_id is not None:
            return None
        if node.end_reason != EndReason.FINISHED:
            return 0.0
        data = episode.task.data
        response = "" if node.result is None else str(node.result)
        if data.get("source") == "oolong-synth":
            return score_synth_answer(response, data["answer"], data["answer_type"])
        return score_answer(response, data["answer"])

    def generate_tasks(self, *, n: int, seed: int, difficulty: str | None = None, split: str = "train",
                       **options: Any) -> list[Task]:
        """Synthetic transcripts; options ``target_tokens`` (16000), ``max_episodes`` (6)."""
        check_options(self.name, options, ("target_tokens", "max_episodes"))
        return generate_oolong_tasks(n=n, seed=seed, difficulty=difficulty, split=split, **options)
