"""DeepDive: generator determinism and answerability, FTS5 search, leak filter, scoring, loader, backends."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil

import httpx
import pytest

from rao_core.envs import get_env
from rao_core.envs.base import Task, ToolError
from rao_core.envs.deepdive import (
    CorpusParams,
    DeepDiveEnv,
    HttpSearchBackend,
    LocalFTSBackend,
    Page,
    build_graph,
    build_pages_db,
    exact_match,
    load_deepdive_parquet,
    normalize_answer,
    render_pages,
)
from rao_core.envs.deepdive.env import corpus_db_path
from rao_core.envs.deepdive.kg import LABELS
from rao_core.policies.base import PolicyRequest
from rao_core.policies.deepdive_expert import DeepDiveExpert
from rao_core.tree import EndReason, Node, Turn

HOSTILE = ['"', '""', "NEAR(a b)", "*", "a OR b", "'); DROP TABLE pages; --", "-x", "(", ")", "subject:foo",
           "^x", "a AND", "NOT", "title:*", "\x00", "", "   ", "🙂", '"unterminated', "a + b - c*"]


_ORIG_RAO_HOME = os.environ.get("RAO_HOME")


def tokenizer() -> str:
    """The test tokenizer from the real RAO_HOME (the tests below point RAO_HOME at a temporary folder)."""
    from tests.runtime.fakes import tokenizer_path

    with pytest.MonkeyPatch.context() as mp:
        if _ORIG_RAO_HOME is None:
            mp.delenv("RAO_HOME", raising=False)
        else:
            mp.setenv("RAO_HOME", _ORIG_RAO_HOME)
        return tokenizer_path()


pytestmark = pytest.mark.usefixtures("rao_home")  # generated corpora go to a temporary RAO_HOME


class _Finish(Exception):
    def __init__(self, value):
        self.value = value


async def drive(env, task: Task, policy, max_steps: int = 12) -> tuple[Node, object]:
    """Run ``policy`` on ``task``'s root node with an in-process REPL (exec) wired to ``env.call_tool``.

    A stand-in for the sandboxed runtime, so tool and expert tests need no sandbox. Returns (node, episode).
    """
    ep = env.new_episode(task)
    spec = env.root_goal(task)
    node = Node(node_id="0", goal=spec.goal, goal_args=spec.goal_args, max_steps=max_steps)
    ns: dict = {}

    def stub(tool):
        def call(*args, **kwargs):
            v = env.call_tool(ep, node, tool.name, list(args), dict(kwargs))
            if tool.finishes:
                raise _Finish(v)
            return v
        return call

    for t in env.tools():
        ns[t.name] = stub(t)

    def finish(value):
        raise _Finish(value)

    ns["finish"] = finish
    while len(node.turns) < max_steps:
        gen = await policy.generate(PolicyRequest(node=node, env=env.name, prompt_token_ids=[], max_tokens=1))
        code = re.search(r"```python\n(.*?)```", gen.text, re.S).group(1)
        out = io.StringIO()
        done = False
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(code, "<cell>", "exec"), ns)
            except _Finish as f:
                node.result, node.end_reason, done = f.value, EndReason.FINISHED, True
            except Exception as e:  # noqa: BLE001 - shown to the agent like the REPL does
                print(f"{type(e).__name__}: {e}")
        node.turns.append(Turn(prompt_token_ids=[], completion_token_ids=[], completion_logprobs=[],
                               text=gen.text, code=code, observation=out.getvalue()))
        node.messages += [{"role": "assistant", "content": gen.text}, {"role": "user", "content": out.getvalue()}]
        if done:
            break
    else:
        node.end_reason = EndReason.MAX_STEPS
    return node, ep


def root(**kw) -> Node:
    return Node(node_id="0", goal="q", **kw)


# ------------------------------------------------------------------------------------------- generator
def test_generator_is_deterministic_and_seeded():
    env = DeepDiveEnv()
    a = env.generate_tasks(n=6, seed=3, difficulty="medium")
    b = env.generate_tasks(n=6, seed=3, difficulty="medium")
    c = env.generate_tasks(n=6, seed=4, difficulty="medium")
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert [t.data["question"] for t in a] != [t.data["question"] for t in c]
    p = CorpusParams(seed=3, n_people=20, n_cities=8, n_companies=4, n_universities=4, n_rivers=4, n_mountains=4)
    assert [x.model_dump() for x in render_pages(build_graph(p))] == [x.model_dump() for x in render_pages(build_graph(p))]
    assert len(json.dumps(a[0].model_dump())) < 3000  # task files stay small: corpus by parameters only


def test_hops_follow_difficulty_and_options():
    env = DeepDiveEnv()
    assert {t.data["hops"] for t in env.generate_tasks(n=20, seed=0, difficulty="easy")} <= {1, 2}
    assert {t.data["hops"] for t in env.generate_tasks(n=20, seed=0, difficulty="hard")} <= {5, 6, 7}
    assert {t.data["hops"] for t in env.generate_tasks(n=5, seed=0, difficulty="k4")} == {4}
    assert {t.data["hops"] for t in env.generate_tasks(n=5, seed=0, hops=6)} == {6}
    for t in env.generate_tasks(n=5, seed=0, hops=6):
        assert len(t.data["gold"]["path"]) == 7 and len(set(t.data["gold"]["path"])) == 7  # no revisits
    with pytest.raises(ValueError, match="unknown DeepDive difficulty"):
        env.generate_tasks(n=1, seed=0, difficulty="nightmare")
    with pytest.raises(ValueError, match="deepdive: unknown generator option"):
        env.generate_tasks(n=1, seed=0, bogus=1)
    with pytest.raises(ValueError, match="unknown split"):
        env.generate_tasks(n=1, seed=0, split="dev")


def test_splits_never_share_a_start_entity():
    env = DeepDiveEnv()
    starts = {s: {t.data["gold"]["path"][0] for t in env.generate_tasks(n=30, seed=1, split=s)}
              for s in ("train", "validation", "test")}
    assert not starts["train"] & starts["test"] and not starts["train"] & starts["validation"]
    assert all(int(i.split("-")[1]) % 10 == 0 for i in starts["test"])


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_every_question_answerable_by_following_gold_path_through_tools(difficulty):
    env = get_env("deepdive")
    tasks = env.generate_tasks(n=15, seed=11, difficulty=difficulty)
    for t in tasks:
        ep, node, gold = env.new_episode(t), root(), t.data["gold"]
        hits = env.call_tool(ep, node, "search", [gold["start_query"]], {"num": 10})
        assert gold["path"][0] in [h["id"] for h in hits]  # gold start page in the top 10 of the gold query
        for rel, cur, nxt in zip(gold["relations"], gold["path"][:-1], gold["path"][1:], strict=True):
            text = env.call_tool(ep, node, "open", [cur], {})
            assert f"- {LABELS[rel]}: " in text and f"[{nxt}]" in text.split(f"- {LABELS[rel]}: ")[1].split("\n")[0]
        last = env.call_tool(ep, node, "open", [gold["path"][-1]], {})
        value = re.search(rf"^- {re.escape(LABELS[gold['attribute']])}: (.+)$", last, re.M).group(1)
        assert exact_match(value, t.data["answers"]), (value, t.data["answers"])
        assert normalize_answer(t.data["answer"]) not in normalize_answer(t.data["question"]).split()


def test_search_ranks_start_page_first_for_most_queries():
    env = DeepDiveEnv()
    tasks = env.generate_tasks(n=40, seed=5)
    ep = env.new_episode(tasks[0])
    top1 = sum(env.call_tool(ep, root(), "search", [t.data["gold"]["start_query"]], {})[0]["id"]
               == t.data["gold"]["path"][0] for t in tasks)
    assert top1 >= 36  # bm25 on the alias: almost always first (measured: 40/40 at seed 5)


# --------------------------------------------------------------------------------------- search tools
def test_hostile_queries_are_text_and_never_error():
    env = DeepDiveEnv()
    t = env.generate_tasks(n=1, seed=0)[0]
    ep = env.new_episode(t)
    for q in HOSTILE:
        hits = env.call_tool(ep, root(), "search", [q], {})
        assert isinstance(hits, list)
    # FTS5 syntax around real words still finds them as words
    name = DeepDiveEnv.graph_for(t).entities[t.data["gold"]["path"][0]].name
    hits = env.call_tool(ep, root(), "search", [f'"{name}" NEAR( * -'], {})
    assert hits and hits[0]["title"] == name
    con = LocalFTSBackend(corpus_db_path(CorpusParams(**t.data["corpus"]["params"])))
    assert con._con.execute("SELECT count(*) FROM pages").fetchone()[0] == 520  # nothing dropped


def test_pages_quoting_the_question_are_filtered(tmp_path):
    env = DeepDiveEnv()
    t = env.generate_tasks(n=1, seed=2)[0]
    kg = DeepDiveEnv.graph_for(t)
    leak = Page(id="forum-0001", title="Trivia forum", text=f"Someone asked: {t.data['question'].upper()} "
                f"The answer is {t.data['answer']}. {t.data['gold']['start_query']}")
    db = build_pages_db([*render_pages(kg), leak], tmp_path / "leaky.sqlite")
    t2 = t.model_copy(update={"data": {**t.data, "corpus": {"path": str(db)}}})
    ep = env.new_episode(t2)
    raw = LocalFTSBackend(db).search(t.data["gold"]["start_query"], 20)
    assert "forum-0001" in [h.id for h in raw]  # the backend itself finds the leak ...
    hits = env.call_tool(ep, root(), "search", [t.data["gold"]["start_query"]], {"num": 10})
    assert "forum-0001" not in [h["id"] for h in hits] and len(hits) == 10  # ... the tool hides it
    with pytest.raises(ToolError, match="hidden"):
        env.call_tool(ep, root(), "open", ["forum-0001"], {})


def test_open_pages_and_bad_arguments():
    env = DeepDiveEnv(page_chars=200)
    t = env.generate_tasks(n=1, seed=0)[0]
    ep = env.new_episode(t)
    pid = t.data["gold"]["path"][0]
    first = env.call_tool(ep, root(), "open", [pid], {})
    n = int(re.search(r"page 1 of (\d+)", first).group(1))
    full = env.call_tool(ep, root(), "open", [pid], {"page": 1}).split("\n", 1)[1]
    for k in range(2, n + 1):
        full += env.call_tool(ep, root(), "open", [pid, k], {}).split("\n", 1)[1]
    assert full == LocalFTSBackend(corpus_db_path(CorpusParams(**t.data["corpus"]["params"]))).open(pid).text
    with pytest.raises(ToolError, match="out of range"):
        env.call_tool(ep, root(), "open", [pid], {"page": n + 1})
    with pytest.raises(ToolError, match="no page"):
        env.call_tool(ep, root(), "open", ["nope-1"], {})
    with pytest.raises(ToolError, match="num must be"):
        env.call_tool(ep, root(), "search", ["x"], {"num": 0})
    with pytest.raises(ToolError, match="unexpected argument"):
        env.call_tool(ep, root(), "search", ["x"], {"k": 3})
    assert len(env.call_tool(ep, root(), "search", ["city"], {"num": 500})) == 10  # capped at max_results


def test_corpus_is_cached_under_rao_home_by_hash():
    env = DeepDiveEnv()
    t = env.generate_tasks(n=1, seed=8, n_people=30, n_cities=10)[0]
    path = corpus_db_path(CorpusParams(**t.data["corpus"]["params"]))
    assert not path.exists()
    env.new_episode(t)
    assert path.exists() and path.parent.name == "deepdive" and str(path).startswith(os.environ["RAO_HOME"])
    mtime = path.stat().st_mtime_ns
    DeepDiveEnv().new_episode(t)
    assert path.stat().st_mtime_ns == mtime  # reused, not rebuilt


# --------------------------------------------------------------------------------------------- scoring
def test_normalize_and_exact_match():
    assert normalize_answer("  The  Lantern, of Osk! ") == "lantern of osk"
    assert normalize_answer("48,210") == "48210"
    assert normalize_answer("Zürich") == "zurich"
    assert exact_match("48210", ["48,210"]) and exact_match(1873, ["1873"])
    assert exact_match("republic of varnesia", ["Varnesia", "Republic of Varnesia"])
    assert not exact_match("1874", ["1873"]) and not exact_match("", [""]) and not exact_match(None, ["x"])


def test_verify_root_only_binary():
    env = DeepDiveEnv()
    t = env.generate_tasks(n=1, seed=0)[0]
    ep = env.new_episode(t)
    ok = root(result=t.data["answers"][-1], end_reason=EndReason.FINISHED)
    assert env.verify(ep, ok) == 1.0
    assert env.verify(ep, root(result={"answer": t.data["answer"]}, end_reason=EndReason.FINISHED)) == 1.0
    assert env.verify(ep, root(result="wrong", end_reason=EndReason.FINISHED)) == 0.0
    assert env.verify(ep, root(result=t.data["answer"], end_reason=EndReason.MAX_STEPS)) == 0.0
    assert env.verify(ep, root(result=["list"], end_reason=EndReason.FINISHED)) == 0.0
    child = Node(node_id="1", parent_id="0", goal="sub", result=t.data["answer"], end_reason=EndReason.FINISHED)
    assert env.verify(ep, child) is None


# --------------------------------------------------------------------------------------------- loaders
def test_parquet_loader_on_fixture(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    conv = [[{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}], []]
    pq.write_table(pa.table({"id": ["7", "8"], "question": ["Who founded X?", "When?"], "answer": ["Ada", "1901"],
                             "conversations": conv}), tmp_path / "qa_rl.parquet")
    tasks = load_deepdive_parquet(tmp_path / "qa_rl.parquet", split="train")
    assert [t.task_id for t in tasks] == ["deepdive-7", "deepdive-8"]
    assert tasks[0].data == {"question": "Who founded X?", "answer": "Ada", "answers": ["Ada"], "source_id": "7",
                             "corpus": None}
    assert load_deepdive_parquet(tmp_path / "qa_rl.parquet", keep_conversations=True, limit=1)[0].data[
        "conversations"] == conv[0]
    with pytest.raises(ValueError, match="no local corpus"):
        DeepDiveEnv().new_episode(tasks[0])
    pq.write_table(pa.table({"id": ["1"], "question": ["q"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"missing columns \['answer'\]"):
        load_deepdive_parquet(tmp_path / "bad.parquet")


# --------------------------------------------------------------------------------------------- backends
def test_http_backend_against_local_fake(monkeypatch):
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.url.path, dict(req.url.params), req.headers.get("authorization")))
        if req.url.path == "/search":
            return httpx.Response(200, json={"results": [
                {"id": "p1", "title": "Leak", "snippet": "WHO FOUNDED X? answer Ada", "url": "u1"},
                {"id": "p2", "title": "Ada Lovelace", "snippet": "founder of X", "url": "u2"}]})
        if req.url.params["id"] == "p2":
            return httpx.Response(200, json={"id": "p2", "title": "Ada Lovelace", "text": "Ada founded X."})
        return httpx.Response(404)

    monkeypatch.setenv("FAKE_SEARCH_KEY", "k123")
    backend = HttpSearchBackend("http://search.test/", api_key_env="FAKE_SEARCH_KEY",
                                transport=httpx.MockTransport(handler))
    env = DeepDiveEnv(search_backend=backend)
    task = Task(task_id="t", env="deepdive", data={"question": "Who founded X?", "answers": ["Ada"], "corpus": None})
    ep = env.new_episode(task)
    hits = env.call_tool(ep, root(), "search", ["founder X"], {"num": 5})
    assert [h["id"] for h in hits] == ["p2"]  # p1's snippet quotes the question: filtered
    assert "Ada founded X." in env.call_tool(ep, root(), "open", ["p2"], {})
    with pytest.raises(ToolError, match="no page"):
        env.call_tool(ep, root(), "open", ["p9"], {})
    assert seen[0] == ("/search", {"q": "founder X", "num": "10"}, "Bearer k123")
    monkeypatch.delenv("FAKE_SEARCH_KEY")
    with pytest.raises(ValueError, match="FAKE_SEARCH_KEY"):
        HttpSearchBackend("http://search.test", api_key_env="FAKE_SEARCH_KEY")
    with pytest.raises(TypeError, match="search_backend"):
        DeepDiveEnv(search_backend=object())


# ---------------------------------------------------------------------------------------------- expert
@pytest.mark.parametrize("difficulty,max_steps", [("easy", 12), ("hard", 12), ("hard", 4)])
async def test_expert_solves_generated_tasks(difficulty, max_steps):
    env, pol = DeepDiveEnv(), DeepDiveExpert()
    for t in env.generate_tasks(n=5, seed=21, difficulty=difficulty):
        node, ep = await drive(env, t, pol, max_steps=max_steps)
        assert node.end_reason == EndReason.FINISHED, [x.observation for x in node.turns]
        assert env.verify(ep, node) == 1.0
        expected_turns = t.data["hops"] + 2 if t.data["hops"] + 2 <= max_steps else 1
        assert len(node.turns) == expected_turns
        assert ep.opened[: t.data["hops"] + 1] == t.data["gold"]["path"]  # it walked the gold path


async def test_expert_abstains_without_oracle():
    env = DeepDiveEnv(search_backend=LocalFTSBackend(ensure_corpus_path()))
    task = Task(task_id="r", env="deepdive", data={"question": "Who?", "answers": ["Ada"], "corpus": None})
    node, ep = await drive(env, task, DeepDiveExpert())
    assert node.result == "I don't know" and env.verify(ep, node) == 0.0


def ensure_corpus_path():
    from rao_core.envs.deepdive import ensure_corpus

    return ensure_corpus(CorpusParams(seed=0))


async def test_end_to_end_through_run_tree():
    from rao_core.runtime import RuntimeConfig, run_tree

    env = get_env("deepdive")
    t = env.generate_tasks(n=1, seed=4, difficulty="medium")[0]
    cfg = RuntimeConfig(max_depth=1, context_window=8192, max_new_tokens=512, repl_pool_size=1, tree_timeout_s=120,
                        sandbox="bwrap" if shutil.which("bwrap") else "none")
    tree = await run_tree(env, t, DeepDiveExpert(), cfg, tokenizer=tokenizer())
    assert tree.error is None, tree.error
    assert tree.root.end_reason == EndReason.FINISHED, [x.observation for x in tree.root.turns]
    assert tree.root.verifier == 1.0
    assert len(tree.root.turns) == t.data["hops"] + 2
