"""The DeepDive environment: multi-hop deep research with ``search`` and ``open`` tools.

Tools in the REPL: ``search(query, num=10)`` -> ranked ``[{"id", "title", "snippet"}]`` and
``open(page_id, page=1)`` -> the page text, cut into chunks of ``page_chars`` characters (``page`` selects
the chunk; a header says ``page i of n``). The node answers with the runtime's ``finish(answer)``.

Departures from the reference: ``open(page_id)`` replaces ``click(link_id)``/``open(url)`` (ids are shown
in results and in page links); the root verifier is an exact match against the answer and its aliases
(``scoring.exact_match``), the offline stand-in for the judge; sub-agent nodes are not verified here
(``verify`` returns None, the judging stage decides).

Corpus storage: a generated task stores only the corpus parameters (``data["corpus"] = {"generator",
"params"}``); the environment rebuilds the SQLite FTS5 database deterministically and caches it at
``$RAO_HOME/cache/deepdive/<hash>.sqlite``. ``data["corpus"] = {"path": ...}`` points at a prebuilt
database instead; ``None`` (real DeepDive records) needs a non-local backend.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rao_core.envs.base import (ChildSpec, Environment, Episode, Task, ToolError, check_corpus, check_options,
                                require_answers, require_text, split_digits, tool)
from rao_core.envs.deepdive.backends import HttpSearchBackend, LocalFTSBackend, SearchBackend, build_pages_db
from rao_core.envs.deepdive.kg import (
    GENERATOR_VERSION,
    CorpusParams,
    KnowledgeGraph,
    build_graph,
    random_walk_question,
    render_pages,
)
from rao_core.envs.deepdive.scoring import exact_match
from rao_core.envs.search import normalize_text
from rao_core.envs.search.fts import GeneratedCorpus
from rao_core.tree import Node

#: difficulty name -> inclusive range of hops k. "k<N>" (e.g. "k3") asks for exactly N hops.
DIFFICULTY_HOPS: dict[str, tuple[int, int]] = {"easy": (1, 2), "medium": (3, 4), "hard": (5, 7)}


class DeepDiveConfig(BaseModel):
    """Configuration of the DeepDive environment (tools and search backend)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "http"] = Field("local", description="'local': SQLite FTS5 over the task's "
                                              "corpus; 'http': HttpSearchBackend at http_base_url.")
    http_base_url: str | None = Field(None, description="Base URL of the search API proxy (backend='http').")
    http_api_key_env: str | None = Field(None, description="Name of the environment variable holding the "
                                         "search API key (never the key itself).")
    page_chars: int = Field(1500, ge=200, description="Characters per chunk returned by open().")
    max_results: int = Field(10, ge=1, le=50, description="Upper bound on search(num=...).")
    title_weight: float = Field(4.0, gt=0, description="bm25 weight of the title column (body = 1).")
    snippet_tokens: int = Field(24, ge=4, le=64, description="Tokens per search snippet.")


class DeepDiveEpisode(Episode):
    """One rollout's state: the search backend of the task, the question (for the leak filter), a log."""

    backend: Any
    question: str
    searches: list[str] = Field(default_factory=list)
    opened: list[str] = Field(default_factory=list)


CORPUS = GeneratedCorpus("deepdive", GENERATOR_VERSION, CorpusParams,
                         lambda params, path: build_pages_db(render_pages(build_graph(params)), path))
corpus_db_path, ensure_corpus = CORPUS.path, CORPUS.ensure


def hops_for(difficulty: str | None, rng: random.Random) -> int:
    """Hop count k for ``difficulty`` ('easy' 1-2, 'medium' 3-4, 'hard' 5-7, 'k<N>'); ValueError if unknown."""
    d = difficulty or "medium"
    if d.startswith("k") and d[1:].isdigit() and int(d[1:]) >= 1:
        return int(d[1:])
    if d not in DIFFICULTY_HOPS:
        raise ValueError(f"unknown DeepDive difficulty {difficulty!r}; expected one of "
                         f"{sorted(DIFFICULTY_HOPS)} or 'k<N>' (e.g. 'k5')")
    lo, hi = DIFFICULTY_HOPS[d]
    return rng.randint(lo, hi)


class DeepDiveEnv(Environment):
    """DeepDive (docs/environments.md, "DeepDive"). ``DeepDiveEnv(**DeepDiveConfig fields, search_backend=...)``.

    ``search_backend`` (optional) is any object implementing ``SearchBackend``; it overrides the
    configured backend for every task (e.g. a custom engine).
    """

    name = "deepdive"
    #: Cap of the ``useful`` delegation bonus (rao_core.rewards; docs/algorithm/authors-code.md):
    #: the authors' DeepDive reward processor gives no bonus (ApGa/platoon 01fcd20 plugins/deepdive train_areal.py).
    delegation_cap = 0.0
    difficulties = (*DIFFICULTY_HOPS, "k<N>")

    @classmethod
    def check_difficulty(cls, difficulty: str) -> None:
        """A name of ``DIFFICULTY_HOPS`` or ``k<N>`` (exactly N >= 1 hops); ValueError otherwise."""
        hops_for(difficulty, random.Random(0))

    def __init__(self, search_backend: SearchBackend | None = None, **options: Any):
        self.config = DeepDiveConfig(**options)
        if search_backend is not None and not isinstance(search_backend, SearchBackend):
            raise TypeError("search_backend must implement search(query, num) and open(page_id)")
        self._custom = search_backend
        self._backends: dict[str, SearchBackend] = {}

    # ----------------------------------------------------------------- tasks
    def generate_tasks(self, *, n: int, seed: int, difficulty: str | None = None, split: str = "train",
                       **options: Any) -> list[Task]:
        """``n`` k-hop questions over the corpus of ``CorpusParams(seed=corpus_seed or seed, ...)``.

        Options: ``hops`` (int, overrides difficulty), ``corpus_seed`` (int, default ``seed``) and any
        ``CorpusParams`` field (``n_people``...). Start entities are partitioned by split (test: ids whose
        index ends in 0, validation: 1, train: the rest), so splits never share a start entity.
        Raises ValueError for an unknown option, split or difficulty.
        """
        digits = split_digits(split)
        check_options(self.name, options, ("hops", "corpus_seed", *CorpusParams.model_fields))
        opts = dict(options)
        hops_opt = opts.pop("hops", None)
        corpus_seed = opts.pop("corpus_seed", seed)
        opts.pop("seed", None)
        params = CorpusParams(seed=int(corpus_seed), **opts)
        kg = build_graph(params)
        starts = [e for e in kg.entities if int(e.split("-")[1]) % 10 in digits]
        rng = random.Random(f"deepdive-questions:{seed}:{split}:{difficulty}:{hops_opt}")
        hops_for(f"k{int(hops_opt)}" if hops_opt is not None else difficulty, random.Random(0))  # validates first
        tasks = []
        for i in range(n):
            k = int(hops_opt) if hops_opt is not None else hops_for(difficulty, rng)
            q = random_walk_question(kg, rng, k, starts)
            tasks.append(Task(
                task_id=f"deepdive-{split}-s{seed}-{difficulty or 'medium'}-{i:05d}", env="deepdive",
                split=split, difficulty=difficulty or ("k%d" % k if hops_opt is not None else "medium"),
                data={"question": q.question, "answer": q.answer, "answers": q.answers, "hops": k,
                      "corpus": {"generator": GENERATOR_VERSION, "params": params.model_dump()},
                      "gold": {"start_query": q.start_query, "path": q.path, "relations": q.relations,
                               "attribute": q.attribute}},
            ))
        return tasks

    @staticmethod
    def graph_for(task: Task) -> KnowledgeGraph:
        """Rebuild the knowledge graph of a generated task (for tests and analysis)."""
        corpus = task.data.get("corpus") or {}
        if "params" not in corpus:
            raise ValueError(f"task {task.task_id} has no generated corpus")
        return build_graph(CorpusParams(**corpus["params"]))

    # -------------------------------------------------------------- episodes
    def _backend(self, task: Task) -> SearchBackend:
        if self._custom is not None:
            return self._custom
        if self.config.backend == "http":
            if not self.config.http_base_url:
                raise ValueError("DeepDive backend 'http' needs http_base_url")
            key = "http:" + self.config.http_base_url
            if key not in self._backends:
                self._backends[key] = HttpSearchBackend(self.config.http_base_url, self.config.http_api_key_env)
            return self._backends[key]
        corpus = task.data.get("corpus")
        if not corpus:
            raise ValueError(f"task {task.task_id} has no local corpus (a real DeepDive record?); use "
                             "backend='http' or a custom search_backend")
        path = CORPUS.of_task(task.task_id, corpus)
        key = str(path)
        if key not in self._backends:
            self._backends[key] = LocalFTSBackend(path, self.config.title_weight, self.config.snippet_tokens)
        return self._backends[key]

    def validate_task(self, task: Task) -> None:
        """``data.question``: a non-empty string; ``data.answers`` (list of strings) or ``data.answer``
        (a string); with the local backend and no custom one, ``data.corpus`` as ``check_corpus`` wants.
        Raises TaskError naming the field."""
        d = task.data
        require_text(d, "question")
        require_answers(d, "the gold answer as a string (or data.answers, a list of strings)")
        if self._custom is None and self.config.backend == "local":
            check_corpus(d, CorpusParams, GENERATOR_VERSION)

    def new_episode(self, task: Task) -> DeepDiveEpisode:
        """Open (building if needed) the task's search backend; ValueError on a malformed task (``validate_task``)."""
        backend = self._backend(task)  # first: it names a record without a corpus (a real DeepDive record)
        self.validate_task(task)
        return DeepDiveEpisode(task=task, backend=backend, question=task.data["question"])

    def root_goal(self, task: Task) -> ChildSpec:
        """The question; ``goal_args["oracle"]`` holds the gold path (no answer) for scripted policies."""
        args: dict[str, Any] = {"question": task.data["question"]}
        if "gold" in task.data:
            args["oracle"] = task.data["gold"]
        return ChildSpec(goal=task.data["question"], goal_args=args)

    def extra_system_prompt(self) -> str:
        """Tool-use guidance."""
        return ("Answer the question by searching the web with search() and reading pages with open(). "
                "Pages link to related pages as `Name [page-id]`. Finish with a short answer string, "
                "e.g. finish('1873').")

    @tool
    def search(self, episode: DeepDiveEpisode, query: str, num: int = 10) -> list[dict]:
        """Full-text web search. Returns up to `num` results, best first, each {'id': page id, 'title': str,
        'snippet': str}. Pages quoting the question are hidden."""
        if not isinstance(query, str):
            raise ToolError(f"search: query must be a string, got {type(query).__name__}")
        if isinstance(num, bool) or not isinstance(num, int) or num < 1:
            raise ToolError(f"search: num must be a positive int, got {num!r}")
        num = min(num, self.config.max_results)
        episode.searches.append(query)
        try:
            hits = episode.backend.search(query, num + 5)
        except Exception as e:  # backend failure (HTTP error...) is shown to the agent
            raise ToolError(f"search failed: {e}") from e
        q = normalize_text(episode.question)
        out = []
        for h in hits:  # the leak filter: no result whose text contains the question
            text = h.text if h.text is not None else f"{h.title} {h.snippet}"
            if q and q in normalize_text(text):
                continue
            out.append({"id": h.id, "title": h.title, "snippet": " ".join(h.snippet.split())})
            if len(out) == num:
                break
        return out

    @tool
    def open(self, episode: DeepDiveEpisode, page_id: str, page: int = 1) -> str:
        """The text of page `page_id` (an id from search results or a link `Name [page-id]` in a page), in
        chunks of $page_chars characters; `page` selects the chunk and a header says how many there are."""
        if not isinstance(page_id, str):
            raise ToolError(f"open: page_id must be a string, got {type(page_id).__name__}")
        if isinstance(page, bool) or not isinstance(page, int) or page < 1:
            raise ToolError(f"open: page must be an int >= 1, got {page!r}")
        page_id = page_id.strip()
        try:
            p = episode.backend.open(page_id)
        except Exception as e:
            raise ToolError(f"open failed: {e}") from e
        if p is None:
            raise ToolError(f"no page with id {page_id!r}")
        if normalize_text(episode.question) in normalize_text(p.text):
            raise ToolError(f"page {page_id!r} is hidden (it quotes the question)")
        size = self.config.page_chars
        n = max(1, -(-len(p.text) // size))
        if page > n:
            raise ToolError(f"page {page_id!r} has {n} chunk(s); page={page} is out of range")
        episode.opened.append(page_id)
        chunk = p.text[(page - 1) * size: page * size]
        more = f" (call open({page_id!r}, page={page + 1}) for more)" if page < n else ""
        return f"[{page_id}] {p.title} -- page {page} of {n}{more}\n{chunk}"

    def verify(self, episode: Episode, node: Node) -> float | None:
        """Root: 1.0 when the node finished with an answer matching the answer or an alias, else 0.0.

        Sub-agent nodes: None (the judging stage decides). A dict result uses its ``"answer"`` key.
        """
        if node.parent_id is not None:
            return None
        if not node.finished:
            return 0.0
        result = node.result
        if isinstance(result, dict):
            result = result.get("answer")
        if not isinstance(result, str | int | float) or isinstance(result, bool):
            return 0.0
        data = episode.task.data
        answers = data.get("answers") or [data.get("answer")]
        return 1.0 if exact_match(result, answers) else 0.0

