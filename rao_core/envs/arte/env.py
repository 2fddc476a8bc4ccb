"""The ART-E environment: answer a question about one email inbox with search and read tools.

Tools in the REPL: ``search_emails(keywords, from_addr=None, to_addr=None, sent_after=None,
sent_before=None, max_results=10)``, ``read_email(message_id)`` and the finishing tool
``return_final_answer(answer, sources)`` (its value ``{"answer", "sources"}`` becomes the node's result).
The inbox address is injected by the environment from the task, never taken from the model, so a
question can only see its own inbox.

Scoring (``verify``, root only; sub-agents get None): config ``reward="binary"`` (default) gives 1/0 for
an exactly matching answer; ``reward="ladder"`` gives the reference's graded ladder mapped to [0, 1]
(``reward.ladder_reward``; the raw value is stored in ``node.env_info["arte_reward"]`` by
``on_node_end``). Real (loaded) questions have free-form answers: ``verify`` returns None for them and
``reward(episode, node, answer_correct=judge_verdict)`` computes the ladder once a judge has decided.

Departures from the reference: tool-use counters for the partial credits are counted over the whole
execution tree (a sub-agent finding the email counts for the root); turns are the root's turns; "format
error" means finishing without an answer string (the reference's unparseable tool calls cannot happen
in a REPL, where they are Python errors the agent sees).
"""

from __future__ import annotations

import math
import random
import sqlite3
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rao_core.envs.arte.db import build_email_db, open_email_db, read_email, search_emails
from rao_core.envs.arte.reward import (
    ArteReward,
    ArteRewardConfig,
    ArteRubric,
    binary_reward,
    is_abstention,
    ladder_reward,
)
from rao_core.envs.arte.synth import GENERATOR_VERSION, InboxParams, generate_corpus
from rao_core.envs.base import (ChildSpec, Environment, Episode, Task, TaskError, ToolError, check_corpus, check_options,
                                require_answers, require_text, show_value, split_digits, tool)
from rao_core.envs.deepdive.scoring import exact_match
from rao_core.envs.search.fts import GeneratedCorpus
from rao_core.tree import Node

DIFFICULTIES = ("easy", "medium", "hard")


class ArteConfig(BaseModel):
    """Configuration of the ART-E environment."""

    model_config = ConfigDict(extra="forbid")

    reward: Literal["binary", "ladder"] = Field("binary", description="Root success: 'binary' 1/0 on a "
                                                "correct answer, or 'ladder' (graded, mapped to [0, 1]).")
    ladder: ArteRewardConfig = Field(default_factory=ArteRewardConfig, description="Ladder weights.")
    max_turns: int | None = Field(None, ge=1, description="Turn budget of the ladder's efficiency bonus "
                                  "(default: the node's max_steps, else 10).")
    max_results: int = Field(10, ge=1, le=10, description="Cap on search_emails(max_results=...).")
    snippet_tokens: int = Field(16, ge=4, le=64, description="Tokens per search snippet.")


class ArteEpisode(Episode):
    """One rollout's state: the open database, the injected inbox and the tool-use log of the tree."""

    con: Any
    inbox: str
    gold_ids: list[str]
    found_ids: set[str] = Field(default_factory=set)
    read_ids: list[str] = Field(default_factory=list)
    invalid_reads: int = 0


CORPUS = GeneratedCorpus("arte", GENERATOR_VERSION, InboxParams,
                         lambda params, path: build_email_db(generate_corpus(params).emails, path))
corpus_db_path, ensure_corpus = CORPUS.path, CORPUS.ensure


def _split_answer(result: Any) -> tuple[str | None, list[str]]:
    """(answer, sources) from a node result: ``{"answer", "sources"}`` or a plain string."""
    if isinstance(result, dict):
        ans, src = result.get("answer"), result.get("sources") or []
    else:
        ans, src = result, []
    if isinstance(ans, int | float) and not isinstance(ans, bool):
        ans = str(ans)
    if not isinstance(ans, str) or not ans.strip():
        return None, []
    return ans, [s for s in src if isinstance(s, str)] if isinstance(src, list) else []


class ArteEnv(Environment):
    """ART-E (docs/environments.md, "ART-E"). ``ArteEnv(**ArteConfig fields)``."""

    name = "arte"
    #: Cap of the ``useful`` delegation bonus (rao_core.rewards; docs/algorithm/authors-code.md):
    #: the authors' ART-E reward processor (ApGa/platoon 01fcd20 plugins/email-search/platoon/email_search/train_scripts/areal/train_areal.py).
    delegation_cap = 0.4
    difficulties = DIFFICULTIES

    def __init__(self, **options: Any):
        self.config = ArteConfig(**options)
        self._cons: dict[str, sqlite3.Connection] = {}

    # ----------------------------------------------------------------- tasks
    def generate_tasks(self, *, n: int, seed: int, difficulty: str | None = None, split: str = "train",
                       **options: Any) -> list[Task]:
        """``n`` questions about planted facts of the synthetic corpus ``InboxParams(seed=corpus_seed or seed)``.

        Options: ``corpus_seed`` and any ``InboxParams`` field. When ``n_inboxes`` is not given it grows so
        that the split holds at least ``n`` facts. Facts are split by their index in the inbox (test: index
        ending in 0, validation: 1, train: the rest); ``difficulty`` ('easy' | 'medium' | 'hard') picks the
        question phrasing. Raises ValueError for bad options or when the split has fewer than ``n`` facts.
        """
        digits = split_digits(split)
        diff = difficulty or "medium"
        if diff not in DIFFICULTIES:
            raise ValueError(f"unknown ART-E difficulty {difficulty!r}; expected one of {DIFFICULTIES}")
        check_options(self.name, options, ("corpus_seed", *InboxParams.model_fields))
        opts = dict(options)
        corpus_seed = int(opts.pop("corpus_seed", seed))
        opts.pop("seed", None)
        if "n_inboxes" not in opts:
            fpi = int(opts.get("facts_per_inbox", InboxParams.model_fields["facts_per_inbox"].default))
            per = sum(1 for i in range(fpi) if i % 10 in digits)
            opts["n_inboxes"] = max(InboxParams.model_fields["n_inboxes"].default, math.ceil(n / max(per, 1)))
        params = InboxParams(seed=corpus_seed, **opts)
        corpus = generate_corpus(params)
        pool = [f for f in corpus.facts if int(f.fact_id.split("-f")[1]) % 10 in digits]
        if len(pool) < n:
            raise ValueError(f"the {split} split of this corpus has {len(pool)} facts, fewer than n={n}; "
                             "raise n_inboxes or facts_per_inbox")
        rng = random.Random(f"arte-questions:{seed}:{split}:{diff}")
        chosen = rng.sample(pool, n)
        return [Task(
            task_id=f"arte-{split}-s{seed}-{diff}-{f.fact_id}", env="arte", split=split, difficulty=diff,
            data={"question": f.question[diff], "answer": f.answer, "answers": f.answers,
                  "message_ids": f.message_ids, "inbox": f.inbox, "query_date": f.query_date,
                  "how_realistic": f.how_realistic, "exact": True,
                  "oracle": {"keywords": f.keywords, "pattern": f.pattern},
                  "corpus": {"generator": GENERATOR_VERSION, "params": params.model_dump()}},
        ) for f in chosen]

    # -------------------------------------------------------------- episodes
    def _connection(self, task: Task) -> sqlite3.Connection:
        path = CORPUS.of_task(task.task_id, task.data.get("corpus") or {})
        key = str(path)
        if key not in self._cons:
            self._cons[key] = open_email_db(path)
        return self._cons[key]

    def validate_task(self, task: Task) -> None:
        """``data.question`` and ``data.inbox``: non-empty strings; ``data.message_ids``: a non-empty list
        of strings; ``data.answer`` (string) or ``data.answers`` (list of strings); ``data.corpus`` as
        ``check_corpus`` wants. Raises TaskError naming the field."""
        d = task.data
        require_text(d, "question")
        require_text(d, "inbox")
        ids = d.get("message_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(m, str) for m in ids):
            raise TaskError("data.message_ids", f"got {show_value(ids)}", "a non-empty list of message id strings")
        require_answers(d, "the gold answer as a string")
        check_corpus(d, InboxParams, GENERATOR_VERSION)

    def new_episode(self, task: Task) -> ArteEpisode:
        """Open the task's email database; ValueError naming the field on a malformed task (``validate_task``)."""
        self.validate_task(task)
        return ArteEpisode(task=task, con=self._connection(task), inbox=str(task.data["inbox"]).lower(),
                           gold_ids=list(task.data["message_ids"]))

    def root_goal(self, task: Task) -> ChildSpec:
        """The question with the inbox owner and today's date; ``goal_args["oracle"]`` for scripted policies."""
        d = task.data
        goal = (f"You are an email assistant for {d['inbox']}. Today's date is {d.get('query_date', 'unknown')}.\n"
                f"Question: {d['question']}\n"
                "Find the answer in the inbox, then call return_final_answer(answer, sources) with the message "
                "ids you used. If you cannot find it, answer \"I don't know\".")
        args: dict[str, Any] = {"question": d["question"], "inbox": d["inbox"], "query_date": d.get("query_date")}
        if "oracle" in d:
            args["oracle"] = {**d["oracle"], "message_ids": d["message_ids"]}
        return ChildSpec(goal=goal, goal_args=args)

    def extra_system_prompt(self) -> str:
        """Tool-use guidance."""
        return ("Search with a few specific keywords (all must match); read the most promising emails; "
                "keep answers short and exact.")

    @tool
    def search_emails(self, episode: ArteEpisode, keywords: str | list[str], from_addr: str = None,
                      to_addr: str = None, sent_after: str = None, sent_before: str = None,
                      max_results: int = 10) -> list[dict]:
        """Search the user's inbox. Every word of `keywords` must appear (subject or body). Optional filters:
        sender, recipient, dates 'YYYY-MM-DD' (after: inclusive, before: exclusive). Newest first, at most 10;
        each {'message_id', 'subject', 'from', 'date', 'snippet'}."""
        kw = keywords
        if not (isinstance(kw, str) or (isinstance(kw, list | tuple) and all(isinstance(k, str) for k in kw))):
            raise ToolError(f"search_emails: keywords must be a string or a list of strings, got {kw!r}")
        filters = {"from_addr": from_addr, "to_addr": to_addr, "sent_after": sent_after, "sent_before": sent_before}
        for label, v in filters.items():
            if v is not None and not isinstance(v, str):
                raise ToolError(f"search_emails: {label} must be a string or None, got {v!r}")
        if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
            raise ToolError(f"search_emails: max_results must be a positive int, got {max_results!r}")
        try:
            hits = search_emails(episode.con, episode.inbox, list(kw) if not isinstance(kw, str) else kw,
                                 *filters.values(), min(max_results, self.config.max_results),
                                 self.config.snippet_tokens)
        except ValueError as e:  # bad date
            raise ToolError(f"search_emails: {e}") from e
        episode.found_ids.update(h.message_id for h in hits)
        return [{"message_id": h.message_id, "subject": h.subject, "from": h.from_address, "date": h.date,
                 "snippet": h.snippet} for h in hits]

    @tool
    def read_email(self, episode: ArteEpisode, message_id: str) -> dict:
        """The full email: {'message_id', 'date', 'subject', 'from', 'to', 'cc', 'bcc', 'body'}."""
        if not isinstance(message_id, str):
            raise ToolError(f"read_email: message_id must be a string, got {message_id!r}")
        email = read_email(episode.con, episode.inbox, message_id.strip())
        if email is None:
            episode.invalid_reads += 1
            raise ToolError(f"read_email: no email with message_id {message_id!r} in this inbox")
        episode.read_ids.append(email["message_id"])
        return email

    @tool(finishes=True)
    def return_final_answer(self, answer: str, sources: list[str]):  # shown without a return type
        """Give the final answer and the message ids it comes from; this ends your work. Answer "I don't know"
        if the inbox does not contain the answer."""
        if isinstance(answer, int | float) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str):
            raise ToolError(f"return_final_answer: answer must be a string, got {type(answer).__name__}")
        src = [sources] if isinstance(sources, str) else [] if sources is None else sources
        if not isinstance(src, list | tuple) or not all(isinstance(s, str) for s in src):
            raise ToolError("return_final_answer: sources must be a list of message id strings")
        return {"answer": answer, "sources": list(src)}

    # --------------------------------------------------------------- scoring
    def rubric(self, episode: ArteEpisode, node: Node, answer_correct: bool | None = None) -> ArteRubric | None:
        """The ladder's rubric for ``node``; ``answer_correct`` overrides the exact check (judge verdict).

        Returns None when correctness is unknown (a real question and no verdict given).
        """
        ans, sources = _split_answer(node.result) if node.finished else (None, [])
        attempted = ans is not None and not is_abstention(ans)
        if answer_correct is None and attempted:
            if not episode.task.data.get("exact", False):
                return None
            answer_correct = exact_match(ans, episode.task.data.get("answers") or [episode.task.data["answer"]])
        gold = set(episode.gold_ids)
        return ArteRubric(
            answer_correct=bool(answer_correct) and attempted, attempted_answer=attempted,
            abstained=ans is not None and is_abstention(ans), ran_out_of_turns=not node.finished,
            format_error=node.finished and ans is None,
            ever_found_right_email=bool(gold & episode.found_ids),
            ever_read_right_email=bool(gold & set(episode.read_ids)),
            ever_tried_to_read_invalid_email=episode.invalid_reads > 0,
            sources_correct=bool(gold & set(sources)), num_sources=len(sources), num_turns=len(node.turns),
            max_turns=self.config.max_turns or node.max_steps or 10)

    def reward(self, episode: ArteEpisode, node: Node, answer_correct: bool | None = None) -> ArteReward | None:
        """The configured reward (binary or ladder) with its named parts, or None if correctness is unknown."""
        r = self.rubric(episode, node, answer_correct)
        if r is None:
            return None
        return binary_reward(r) if self.config.reward == "binary" else ladder_reward(r, self.config.ladder)

    def on_node_end(self, episode: Episode, node: Node) -> None:
        """Root: store the reward breakdown (raw value, success, parts) in ``node.env_info["arte_reward"]``."""
        if node.parent_id is None and isinstance(episode, ArteEpisode):
            r = self.reward(episode, node)
            if r is not None:
                node.env_info["arte_reward"] = r.model_dump()

    def verify(self, episode: Episode, node: Node) -> float | None:
        """Root success in [0, 1] (binary or mapped ladder); None for sub-agents and real questions."""
        if node.parent_id is not None or not isinstance(episode, ArteEpisode):
            return None
        r = self.reward(episode, node)
        return None if r is None else r.success
