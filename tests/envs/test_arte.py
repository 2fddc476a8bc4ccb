"""ART-E: schema and triggers, inbox isolation, keyword escaping, recipients, generator, rewards, loaders."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from rao_core.envs import get_env
from rao_core.envs.arte import (
    ArteEnv,
    ArteRewardConfig,
    ArteRubric,
    EmailRecord,
    InboxParams,
    binary_reward,
    build_email_db,
    build_enron_db,
    generate_corpus,
    ladder_reward,
    load_arte_questions,
    load_enron_emails,
    open_email_db,
    search_emails,
)
from rao_core.envs.arte.db import SCHEMA, insert_emails
from rao_core.envs.arte.env import corpus_db_path
from rao_core.envs.base import Task, ToolError
from rao_core.envs.deepdive.scoring import exact_match
from rao_core.policies.arte_expert import ArteExpert
from rao_core.tree import EndReason, Node, Turn
from tests.envs.test_deepdive import HOSTILE, drive, tokenizer

FIX = Path(__file__).parent / "fixtures"
LAY, KITCHEN = "kenneth.lay@enron.com", "louise.kitchen@enron.com"


pytestmark = pytest.mark.usefixtures("rao_home")  # generated corpora go to a temporary RAO_HOME


@pytest.fixture(scope="module")
def enron_db(tmp_path_factory) -> Path:
    return build_enron_db(FIX / "arte_emails.jsonl", tmp_path_factory.mktemp("enron") / "enron.sqlite")


def real_task(db: Path, i: int = 0) -> Task:
    return load_arte_questions(FIX / "arte_questions.jsonl", db)[i]


def root(**kw) -> Node:
    return Node(node_id="0", goal="q", **kw)


# ------------------------------------------------------------------------------------ schema and tools
def test_fts_index_kept_in_sync_by_triggers(tmp_path):
    con = sqlite3.connect(tmp_path / "w.sqlite")
    con.executescript(SCHEMA)
    insert_emails(con, [EmailRecord(message_id="<a>", subject="Hello", **{"from": "x@a.com"}, to=["y@a.com"],
                                    date="2001-01-01", body="pineapple budget")])
    q = lambda w: con.execute("SELECT rowid FROM emails_fts WHERE emails_fts MATCH ?", (w,)).fetchall()  # noqa: E731
    assert q("pineapple") == [(1,)]
    con.execute("UPDATE emails SET body = 'mango plan' WHERE id = 1")
    assert q("pineapple") == [] and q("mango") == [(1,)]
    con.execute("DELETE FROM emails WHERE id = 1")
    assert q("mango") == []
    triggers = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert triggers == {"emails_ai", "emails_ad", "emails_au"}


def test_read_email_returns_correct_recipients(enron_db):
    env = ArteEnv()
    ep = env.new_episode(real_task(enron_db))  # Ken Lay's inbox
    e = env.call_tool(ep, root(), "read_email", ["<1.100.JavaMail.evans@thyme>"], {})
    assert e["from"] == "jeff.skilling@enron.com"  # addresses lower-cased
    assert e["to"] == [LAY]
    assert e["cc"] == ["sally.beck@enron.com", "mark.taylor@enron.com"]
    assert e["bcc"] == [KITCHEN]
    assert e["date"] == "2001-08-01 09:15:00" and e["subject"] == "Gas storage Q3"
    e4 = env.call_tool(ep, root(), "read_email", ["<4.103.JavaMail.evans@thyme>"], {})
    assert e4["to"] == [LAY, KITCHEN] and e4["cc"] == [] and e4["date"] == "2000-12-24 08:00:00"


def test_inbox_isolation(enron_db):
    env = ArteEnv()
    lay = env.new_episode(real_task(enron_db, 0))
    kitchen = env.new_episode(real_task(enron_db, 1))
    # "Board dinner" is only in Kitchen's inbox (Sally -> Louise)
    assert [h["message_id"] for h in env.call_tool(kitchen, root(), "search_emails", ["board dinner"], {})] == [
        "<3.102.JavaMail.evans@thyme>"]
    assert env.call_tool(lay, root(), "search_emails", ["board dinner"], {}) == []
    with pytest.raises(ToolError, match="not|no email"):
        env.call_tool(lay, root(), "read_email", ["<3.102.JavaMail.evans@thyme>"], {})
    assert lay.invalid_reads == 1
    # Kitchen sees the Q3 email only through bcc; Lay's reply is not in her inbox
    assert [h["message_id"] for h in env.call_tool(kitchen, root(), "search_emails", ["storage"], {})] == [
        "<1.100.JavaMail.evans@thyme>", "<3.102.JavaMail.evans@thyme>", "<4.103.JavaMail.evans@thyme>"]
    # the model cannot pick another inbox: there is no such argument
    with pytest.raises(ToolError, match="unexpected argument 'inbox'"):
        env.call_tool(lay, root(), "search_emails", ["storage"], {"inbox": KITCHEN})


def test_search_all_keywords_newest_first_and_filters(enron_db):
    env = ArteEnv()
    ep = env.new_episode(real_task(enron_db))
    ids = lambda *a, **k: [h["message_id"][1:2] for h in env.call_tool(ep, root(), "search_emails", list(a), k)]  # noqa: E731
    assert ids("Bammel") == ["2", "1", "4"]  # newest first
    assert ids(["Bammel", "storage"]) == ["2", "1", "4"]  # subject words count ("Re: Gas storage Q3")
    assert ids(["Bammel", "contract"]) == ["4"]  # all words required
    assert ids("Bammel storage injected") == ["1"]
    assert ids("Bammel withdrawals injected") == []
    assert ids("Bammel", from_addr="Mark.Taylor@enron.com") == ["4"]
    assert ids("Bammel", to_addr=LAY) == ["1", "4"]
    assert ids("Bammel", sent_after="2001-08-01", sent_before="2001-08-02") == ["1"]  # after incl., before excl.
    assert ids("Bammel", max_results=1) == ["2"]
    hit = env.call_tool(ep, root(), "search_emails", ["injected"], {})[0]
    assert set(hit) == {"message_id", "subject", "from", "date", "snippet"} and "**injected**" in hit["snippet"]
    with pytest.raises(ToolError, match="unparseable date"):
        env.call_tool(ep, root(), "search_emails", ["Bammel"], {"sent_after": "last week"})
    with pytest.raises(ToolError, match="keywords must be"):
        env.call_tool(ep, root(), "search_emails", [42], {})


def test_hostile_keywords_are_plain_text(enron_db):
    env = ArteEnv()
    ep = env.new_episode(real_task(enron_db))
    for kw in HOSTILE + [["NEAR(", ")"], ["'; DELETE FROM emails; --"], ['"', "OR", "*"]]:
        assert isinstance(env.call_tool(ep, root(), "search_emails", [kw], {}), list)
    # syntax around real words is ignored: the words still have to match
    got = env.call_tool(ep, root(), "search_emails", ['"NEAR" (renewal) -draft*'], {})
    assert [h["message_id"] for h in got] == ["<4.103.JavaMail.evans@thyme>"]
    assert env.call_tool(ep, root(), "search_emails", ["renewal OR dinner"], {}) == []  # OR is a word here
    assert sqlite3.connect(enron_db).execute("SELECT count(*) FROM emails").fetchone() == (4,)


# -------------------------------------------------------------------------------------------- generator
def test_generator_deterministic_and_answerable():
    env = get_env("arte")
    a = env.generate_tasks(n=20, seed=5, difficulty="hard")
    assert [t.model_dump() for t in a] == [t.model_dump() for t in env.generate_tasks(n=20, seed=5, difficulty="hard")]
    assert [t.data["question"] for t in a] != [t.data["question"] for t in env.generate_tasks(n=20, seed=6)]
    assert len(json.dumps(a[0].model_dump())) < 2000
    corpus = generate_corpus(InboxParams(**a[0].data["corpus"]["params"]))
    assert generate_corpus(InboxParams(**a[0].data["corpus"]["params"])) == corpus
    by_id = {e.message_id: e for e in corpus.emails}
    ep = env.new_episode(a[0])
    for f in corpus.facts:  # every planted fact: the gold query finds it, its body holds the answer
        hits = search_emails(ep.con, f.inbox, f.keywords)
        assert f.message_ids[0] in [h.message_id for h in hits], f
        src = by_id[f.message_ids[0]]
        assert f.inbox in [src.from_address, *src.to, *src.cc, *src.bcc]
        assert exact_match(re.search(f.pattern, src.body).group(1), f.answers)
        assert src.date[:10] <= f.query_date


def test_generator_splits_sizes_and_options():
    env = ArteEnv()
    ids = {s: {t.task_id.split("-")[-2] + t.task_id.split("-")[-1] for t in env.generate_tasks(n=15, seed=1, split=s)}
           for s in ("train", "validation", "test")}
    assert not ids["train"] & ids["test"] and not ids["validation"] & ids["test"]
    many = env.generate_tasks(n=60, seed=1, split="test")  # grows the number of inboxes automatically
    assert len({t.task_id for t in many}) == 60 and many[0].data["corpus"]["params"]["n_inboxes"] == 20
    with pytest.raises(ValueError, match="fewer than n=50"):
        env.generate_tasks(n=50, seed=1, split="test", n_inboxes=2)
    with pytest.raises(ValueError, match="unknown ART-E difficulty"):
        env.generate_tasks(n=1, seed=1, difficulty="extreme")
    with pytest.raises(ValueError, match="arte: unknown generator option"):
        env.generate_tasks(n=1, seed=1, inboxes=3)


# ---------------------------------------------------------------------------------------------- rewards
def rub(**kw) -> ArteRubric:
    base = dict(answer_correct=False, attempted_answer=False, abstained=False, ran_out_of_turns=False,
                format_error=False, ever_found_right_email=False, ever_read_right_email=False,
                ever_tried_to_read_invalid_email=False, sources_correct=False, num_sources=0, num_turns=3,
                max_turns=10)
    base.update(kw)
    return ArteRubric(**base)


def test_ladder_hand_computed():
    # bounds: lowest rung -2, highest 1 + 0.3 + 0.1 + 0.1 = 1.5, so success = (r + 2) / 3.5
    assert ArteRewardConfig().bounds() == pytest.approx((-2.0, 1.5))
    # correct, right source, 1 source, 3/10 turns: 1 + 0.3 + 0.1/1 + 0.1 * (1 - 0.3) = 1.47
    r = ladder_reward(rub(answer_correct=True, attempted_answer=True, sources_correct=True, num_sources=1))
    assert r.rung == "correct" and r.value == pytest.approx(1.47) and r.success == pytest.approx(3.47 / 3.5)
    # correct, no sources, 5/10 turns: 1 + 0 + 0 + 0.1 * 0.5 = 1.05 (partial credits do not apply)
    r = ladder_reward(rub(answer_correct=True, attempted_answer=True, num_turns=5, ever_found_right_email=True))
    assert r.value == pytest.approx(1.05)
    # correct, 2 sources (one gold), 10/10 turns: 1 + 0.3 + 0.1/2 + 0 = 1.35
    r = ladder_reward(rub(answer_correct=True, attempted_answer=True, sources_correct=True, num_sources=2,
                          num_turns=10))
    assert r.value == pytest.approx(1.35) and r.parts["few_sources"] == pytest.approx(0.05)
    # wrong answer, found + read, no invalid read, wrong sources: -1 + 0.1 + 0.1 + 0.1 = -0.7
    r = ladder_reward(rub(attempted_answer=True, ever_found_right_email=True, ever_read_right_email=True))
    assert r.rung == "wrong" and r.value == pytest.approx(-0.7)
    # "I don't know", found only, one invalid read: 0 + 0.1 + 0 + 0 + 0 = 0.1
    r = ladder_reward(rub(abstained=True, ever_found_right_email=True, ever_tried_to_read_invalid_email=True))
    assert r.rung == "abstain" and r.value == pytest.approx(0.1)
    # ran out of turns, nothing found, no invalid read: 0 + 0.1 = 0.1
    assert ladder_reward(rub(ran_out_of_turns=True)).value == pytest.approx(0.1)
    # format error (no answer string), nothing else: -2 + 0.1 = -1.9 -> success 0.1 / 3.5
    r = ladder_reward(rub(format_error=True))
    assert r.rung == "format" and r.value == pytest.approx(-1.9) and r.success == pytest.approx(0.1 / 3.5)
    # rungs never overlap: best wrong (-1 + 0.4) < worst abstain (0) and best abstain (0.4) < worst correct (1)
    assert ladder_reward(rub(attempted_answer=True, ever_found_right_email=True, ever_read_right_email=True,
                             sources_correct=True)).value == pytest.approx(-0.6)


def test_binary_reward():
    assert binary_reward(rub(answer_correct=True, attempted_answer=True)).value == 1.0
    assert binary_reward(rub(attempted_answer=True, sources_correct=True, ever_read_right_email=True)).value == 0.0
    assert binary_reward(rub(abstained=True)).value == 0.0


def test_env_rewards_from_tool_use():
    t = ArteEnv().generate_tasks(n=1, seed=2)[0]
    gold = t.data["message_ids"][0]

    def episode(env):
        ep = env.new_episode(t)
        env.call_tool(ep, root(), "search_emails", [t.data["oracle"]["keywords"]], {})
        env.call_tool(ep, root(), "read_email", [gold], {})
        return ep

    turns = [Turn(prompt_token_ids=[], completion_token_ids=[], completion_logprobs=[], text="")] * 2
    done = lambda res: root(result=res, end_reason=EndReason.FINISHED, turns=turns, max_steps=10)  # noqa: E731
    env_l, env_b = ArteEnv(reward="ladder"), ArteEnv()
    ans = env_l.call_tool(episode(env_l), root(), "return_final_answer", [t.data["answers"][-1], [gold]], {})
    assert ans == {"answer": t.data["answers"][-1], "sources": [gold]}
    # correct + source + 1 source + 2/10 turns: 1 + 0.3 + 0.1 + 0.08 = 1.48 -> (1.48 + 2) / 3.5
    assert env_l.verify(episode(env_l), done(ans)) == pytest.approx(3.48 / 3.5)
    assert env_b.verify(episode(env_b), done(ans)) == 1.0
    # wrong answer after finding and reading: -1 + 0.1 + 0.1 + 0.1 + 0 = -0.7
    node = done({"answer": "Room 1", "sources": []})
    ep = episode(env_l)
    env_l.on_node_end(ep, node)
    assert node.env_info["arte_reward"]["value"] == pytest.approx(-0.7)
    assert env_b.verify(episode(env_b), node) == 0.0
    # "I don't know" via plain finish: 0 + 0.3 partial; out of turns the same
    assert env_l.verify(episode(env_l), done("I don't know")) == pytest.approx(2.3 / 3.5)
    assert env_l.verify(episode(env_l), root(end_reason=EndReason.MAX_STEPS)) == pytest.approx(2.3 / 3.5)
    # sub-agents are not verified here
    assert env_l.verify(episode(env_l), Node(node_id="1", parent_id="0", goal="g", result=ans,
                                             end_reason=EndReason.FINISHED)) is None
    with pytest.raises(ToolError, match="sources must be"):
        env_l.call_tool(episode(env_l), root(), "return_final_answer", ["x", [1, 2]], {})
    assert [s.name for s in env_l.tools() if s.finishes] == ["return_final_answer"]


# ---------------------------------------------------------------------------------------------- loaders
def test_loaders_on_fixtures(tmp_path, enron_db):
    import pyarrow as pa
    import pyarrow.parquet as pq

    emails = load_enron_emails(FIX / "arte_emails.jsonl")
    assert [e.message_id for e in emails][:2] == ["<1.100.JavaMail.evans@thyme>", "<2.101.JavaMail.evans@thyme>"]
    rows = [json.loads(x) for x in (FIX / "arte_emails.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "emails.parquet")
    assert load_enron_emails(tmp_path / "emails.parquet") == emails
    db = build_email_db(emails, tmp_path / "e.sqlite")
    assert open_email_db(db).execute("SELECT count(*) FROM recipients").fetchone() == (8,)  # recipients rows: 4 (to+2 cc+bcc) + 1 + 1 + 2 (two to)
    qs = [json.loads(x) for x in (FIX / "arte_questions.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(qs), tmp_path / "questions.parquet")
    tasks = load_arte_questions(tmp_path / "questions.parquet", enron_db, split="test")
    assert tasks[1].data["inbox"] == KITCHEN and tasks[1].data["message_ids"] == ["<3.102.JavaMail.evans@thyme>"]
    assert tasks[0].task_id == "arte-11" and tasks[0].data["query_date"] == "2001-09-01"
    assert tasks[0].data["how_realistic"] == 0.9 and tasks[0].data["exact"] is False
    # real questions: correctness needs the judge
    env = ArteEnv(reward="ladder")
    ep = env.new_episode(tasks[0])
    node = root(result={"answer": "42 Bcf", "sources": []}, end_reason=EndReason.FINISHED)
    assert env.verify(ep, node) is None
    assert env.reward(ep, node, answer_correct=True).rung == "correct"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": 1, "question": "q"}) + "\n")
    with pytest.raises(ValueError, match="lacks columns"):
        load_arte_questions(bad, enron_db)
    bad.write_text(json.dumps({"message_id": "x", "from": "a@b", "date": "someday"}) + "\n")
    with pytest.raises(ValueError, match="row 0"):
        load_enron_emails(bad)


def test_corpus_cached_by_hash():
    t = ArteEnv().generate_tasks(n=1, seed=9, n_inboxes=2)[0]
    path = corpus_db_path(InboxParams(**t.data["corpus"]["params"]))
    assert not path.exists()
    ArteEnv().new_episode(t)
    assert path.exists() and path.parent.name == "arte"


# ----------------------------------------------------------------------------------------------- expert
@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
async def test_expert_solves_generated_tasks(difficulty):
    env, pol = ArteEnv(reward="ladder"), ArteExpert()
    for t in env.generate_tasks(n=6, seed=13, difficulty=difficulty):
        node, ep = await drive(env, t, pol, max_steps=10)
        assert node.end_reason == EndReason.FINISHED, [x.observation for x in node.turns]
        assert node.result["sources"] == t.data["message_ids"] and len(node.turns) == 3
        # 1 + 0.3 + 0.1 + 0.1 * (1 - 3/10) = 1.47
        assert env.reward(ep, node).value == pytest.approx(1.47)


async def test_expert_abstains_on_real_questions(enron_db):
    env = ArteEnv()
    node, ep = await drive(env, real_task(enron_db), ArteExpert())
    assert node.result == {"answer": "I don't know", "sources": []}


async def test_end_to_end_through_run_tree():
    from rao_core.runtime import RuntimeConfig, run_tree

    env = get_env("arte", reward="ladder")
    t = env.generate_tasks(n=1, seed=4)[0]
    cfg = RuntimeConfig(max_depth=1, context_window=8192, max_new_tokens=512, repl_pool_size=1, tree_timeout_s=120,
                        sandbox="bwrap" if shutil.which("bwrap") else "none")
    tree = await run_tree(env, t, ArteExpert(), cfg, tokenizer=tokenizer())
    assert tree.error is None, tree.error
    assert tree.root.end_reason == EndReason.FINISHED, [x.observation for x in tree.root.turns]
    assert tree.root.result["sources"] == t.data["message_ids"]
    assert tree.root.verifier == pytest.approx(3.47 / 3.5)
