"""The judging stage end to end against a fake OpenAI-compatible server (real HTTP, real openai client)."""

from __future__ import annotations

import json
import math

import pytest

from rao_core.judge import JudgeEndpointError, judge_trees, judge_trees_sync
from tests.judge.conftest import node, tree
from tests.judge.fake_openai import FakeOpenAI

YES = '{"verdict": "yes", "reason": "fine"}'
NO = '{"verdict": "no", "reason": "wrong"}'


def by_goal(body, _idx):
    """Answer yes when the user message's goal mentions 'good', else no."""
    user = body["messages"][1]["content"]
    return 200, YES if "good" in user.split("## Agent's final result")[0] else NO, {}


def never(body, idx):
    raise AssertionError("the judge must not be called")


def oolong_tree(root_v=1.0):
    return tree("oolong", [
        node("r", None, verifier=root_v),
        node("a", "r", depth=1, goal="good subtask"),
        node("b", "r", depth=1, goal="bad subtask"),
        node("c", "a", depth=2, goal="unfinished subtask", finished=False),
    ])


def src(t):
    return {n.node_id: (n.success_source, n.success) for n in t.nodes}


async def test_textcraft_nodes_use_the_verifier_and_send_nothing(config):
    t = tree("textcraft-synth", [node("r", None, verifier=1.0), node("a", "r", depth=1, verifier=0.0),
                                 node("b", "r", depth=1, verifier=True)])
    with FakeOpenAI(never) as srv:
        out, stats = await judge_trees([t], "textcraft-synth", config.model_copy(update={"base_url": srv.base_url}))
    assert src(out[0]) == {"r": ("verifier", 1.0), "a": ("verifier", 0.0), "b": ("verifier", 1.0)}
    assert stats.requests == 0 and stats.sources == {"verifier": 3, "judge": 0, "rule": 0, "proxy": 0, "none": 0}
    assert all(n.judge is None for n in out[0].nodes)


async def test_free_form_subtasks_go_to_the_judge(config):
    t = oolong_tree()
    with FakeOpenAI(by_goal) as srv:
        out, stats = await judge_trees([t], "oolong", config.model_copy(update={"base_url": srv.base_url}))
    assert src(out[0]) == {"r": ("verifier", 1.0), "a": ("judge", 1.0), "b": ("judge", 0.0), "c": ("rule", 0.0)}
    # c never called finish: scored 0 by the rule, without a request
    assert stats.requests == 2 and len(srv.requests) == 2 and stats.unfinished_rule == 1
    a, c = out[0].node("a").judge, out[0].node("c").judge
    assert a["verdict"] == "yes" and a["reason"] == "fine" and a["raw"] == YES and a["model"] == "judge"
    assert a["prompt_version"].startswith("oolong/v2#") and a["cached"] is False and a["parsed_by"] == "json"
    assert c["rule"] == "unfinished" and c["verdict"] == "no"
    sent = srv.requests[0]["body"]
    assert sent["model"] == "judge" and sent["temperature"] == 0.0 and sent["max_tokens"] == 256
    assert "good subtask" in sent["messages"][1]["content"]
    assert stats.prompt_tokens == 200 and stats.completion_tokens == 40 and stats.cost_usd == 0.0
    assert stats.sources == {"verifier": 1, "judge": 2, "rule": 1, "proxy": 0, "none": 0}


async def test_proxy_when_no_judge(config):
    """The paper's proxy: sub-agent nodes inherit the root's success."""
    cfg = config.model_copy(update={"enabled": False})
    out, stats = await judge_trees([oolong_tree(root_v=0.25)], "oolong", cfg)
    # c did not finish: the unfinished rule comes before the proxy, so it does not inherit the root's 0.25
    assert src(out[0]) == {"r": ("verifier", 0.25), "a": ("proxy", 0.25), "b": ("proxy", 0.25),
                           "c": ("rule", 0.0)}
    assert stats.requests == 0


def _ended(n, reason):
    n.end_reason = reason
    return n


async def test_crashed_child_earns_its_parent_no_bonus(config):
    """A child that crashed (sandbox_error, no tokens) must get s = 0 whatever the source (proxy here,
    verifier too), so its parent gets no delegation bonus from it (Eq. 1)."""
    from rao_core.rewards import assign_rewards
    from rao_core.tree import EndReason

    cfg = config.model_copy(update={"enabled": False})
    t = tree("oolong", [node("r", None, verifier=1.0),
                        _ended(node("a", "r", depth=1, finished=False), EndReason.SANDBOX_ERROR),
                        _ended(node("b", "r", depth=1, verifier=1.0, finished=False), EndReason.POLICY_ERROR)])
    out, stats = await judge_trees([t], "oolong", cfg)
    assert src(out[0]) == {"r": ("verifier", 1.0), "a": ("rule", 0.0), "b": ("rule", 0.0)}
    assert out[0].node("a").judge["rule"] == "unfinished" and stats.unfinished_rule == 2
    assign_rewards(out[0], lam=0.5)
    assert out[0].root.reward == 1.0  # s = 1, children's mean s = 0: no bonus


@pytest.mark.parametrize("reason", ["policy_error", "sandbox_error", "token_prefix_break", "tree_timeout"])
async def test_infrastructure_failures_are_unscored_and_leave_the_baseline(config, reason):
    from rao_core.samples import build_samples
    from rao_core.tree import EndReason

    cfg = config.model_copy(update={"enabled": False})

    def group():
        return [tree("textcraft-synth", [node("r", None, verifier=1.0)], tree_id="t0"),
                tree("textcraft-synth", [node("r", None, verifier=0.0)], tree_id="t1"),
                tree("textcraft-synth", [_ended(node("r", None, verifier=0.0, finished=False), EndReason(reason)),
                                         node("a", "r", depth=1, verifier=1.0)], tree_id="t2")]

    def with_tokens(trees):
        for t in trees:
            t.group_id = "g"
            for n in t.nodes:
                n.token_ids, n.assistant_mask, n.behaviour_logprobs = [1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5]
        return trees

    out, stats = await judge_trees(with_tokens(group()), None, cfg)
    assert all(math.isnan(n.success) and n.judge["rule"] == "infrastructure" for n in out[2].nodes)
    assert stats.infra_unscored == {reason: 1} and stats.as_metrics()[f"judge/infra_unscored_{reason}"] == 1.0
    batch = build_samples(out, lam=0.5)
    assert {s.tree_id: s.baseline for s in batch.samples} == {"t0": 0.0, "t1": 1.0}  # t2 left out of b
    assert batch.stats.dropped_nan_root_trees == 1
    # the documented switch scores them as policy failures again
    out, stats = await judge_trees(with_tokens(group()), None, cfg.model_copy(update={"infra_failures": "failure"}))
    assert src(out[2])["r"] == ("verifier", 0.0) and stats.infra_unscored == {}
    # t2 counts again: R(root) = 0 + 0.5 * s(a) = 0.5, so b(t1) = (1 + 0.5) / 2
    assert {s.tree_id: s.baseline for s in build_samples(out, lam=0.5).samples}["t1"] == 0.75


async def test_step_limit_root_stays_a_policy_failure(config):
    t = tree("textcraft-synth", [node("r", None, verifier=0.0, finished=False)])  # ended by max_steps
    out, stats = await judge_trees([t], None, config.model_copy(update={"enabled": False}))
    assert src(out[0]) == {"r": ("verifier", 0.0)} and stats.infra_unscored == {}


async def test_judge_envs_selects_environments(config):
    with FakeOpenAI(by_goal) as srv:
        cfg = config.model_copy(update={"base_url": srv.base_url, "judge_envs": ["deepdive"]})
        out, _ = await judge_trees([oolong_tree()], "oolong", cfg)
        assert {s for s, _ in src(out[0]).values()} == {"verifier", "proxy", "rule"} and not srv.requests
        out, _ = await judge_trees([oolong_tree()], None, cfg.model_copy(update={"judge_envs": ["oolong"]}))
    assert src(out[0])["a"] == ("judge", 1.0)  # env taken from the tree when env_name is None


async def test_root_without_verifier_is_none_and_children_proxy_nan(config):
    cfg = config.model_copy(update={"enabled": False})
    t = tree("arte", [node("r", None), node("a", "r", depth=1)])
    out, stats = await judge_trees([t], "arte", cfg)
    assert all(s == "none" and math.isnan(v) for s, v in src(out[0]).values())
    assert stats.sources["none"] == 2


async def test_unparseable_answer_is_retried_then_nan(config):
    answers = ["I am not sure what you mean.", "Let me think about the inventory."]
    with FakeOpenAI(lambda b, i: (200, answers[i], {})) as srv:
        out, stats = await judge_trees([tree("oolong", [node("r", None, verifier=1.0), node("a", "r", depth=1)])],
                                       "oolong", config.model_copy(update={"base_url": srv.base_url}))
    a = out[0].node("a")
    assert a.success_source == "judge" and math.isnan(a.success)
    assert a.judge["status"] == "failed" and a.judge["verdict"] is None and a.judge["attempts"] == 2
    assert answers[0] in a.judge["raw"] and answers[1] in a.judge["raw"]
    assert stats.requests == 2 and stats.parse_retries == 1 and stats.failures == 1
    # the retry shows the model its own answer and asks again for the JSON form
    retry = srv.requests[1]["body"]["messages"]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"] and '"verdict"' in retry[3]["content"]


async def test_rate_limit_is_retried_by_the_client(config):
    def flaky(body, i):
        return (429, "slow down", {"retry-after-ms": "1"}) if i < 2 else (200, YES, {})
    with FakeOpenAI(flaky) as srv:
        out, stats = await judge_trees([oolong_tree()], "oolong",
                                       config.model_copy(update={"base_url": srv.base_url, "max_retries": 3}))
    assert out[0].node("a").success == 1.0 and len(srv.requests) == 3 + 1  # a: 2 x 429 + ok; b: ok
    assert stats.failures == 0 and stats.transport_errors == 0


async def test_server_errors_after_retries_give_nan(config):
    with FakeOpenAI(lambda b, i: (503, "down", {"retry-after-ms": "1"})) as srv:
        out, stats = await judge_trees([oolong_tree()], "oolong",
                                       config.model_copy(update={"base_url": srv.base_url, "max_retries": 1}))
    a = out[0].node("a")
    assert math.isnan(a.success) and a.judge["status"] == "failed" and "InternalServerError" in a.judge["error"]
    assert stats.transport_errors == 2 and stats.failures == 2 and len(srv.requests) == 4  # 2 nodes x (1 + 1 retry)


async def test_unknown_model_stops_the_stage(config):
    with FakeOpenAI(lambda b, i: (404, "model not found", {})) as srv:
        with pytest.raises(JudgeEndpointError, match="rejected model 'judge'"):
            await judge_trees([oolong_tree()], "oolong", config.model_copy(update={"base_url": srv.base_url}))


async def test_cache_second_pass_makes_no_request(config):
    with FakeOpenAI(by_goal) as srv:
        cfg = config.model_copy(update={"base_url": srv.base_url})
        first, s1 = await judge_trees([oolong_tree()], "oolong", cfg)
        second, s2 = await judge_trees([oolong_tree()], "oolong", cfg)
        assert len(srv.requests) == 2 and s1.requests == 2 and s2.requests == 0 and s2.cache_hits == 2
        assert src(first[0]) == src(second[0]) and second[0].node("a").judge["cached"] is True
        assert second[0].node("a").judge["raw"] == YES
        # another judge model or prompt version is another key
        await judge_trees([oolong_tree()], "oolong", cfg.model_copy(update={"model": "other"}))
        assert len(srv.requests) == 4


async def test_identical_nodes_in_one_call_share_one_request(config):
    t = tree("oolong", [node("r", None, verifier=1.0)] + [node(f"k{i}", "r", depth=1, goal="good same") for i in range(3)])
    with FakeOpenAI(by_goal) as srv:
        out, stats = await judge_trees([t], "oolong", config.model_copy(
            update={"base_url": srv.base_url, "use_cache": False, "max_concurrency": 4}))
    assert len(srv.requests) == 1 and stats.requests == 1 and stats.cache_hits == 2
    assert [n.success for n in out[0].nodes] == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(("fallback", "expect"), [("proxy", ("proxy", 0.5)), ("nan", ("none", None))])
async def test_budget_stop(config, fallback, expect):
    t = tree("oolong", [node("r", None, verifier=0.5)] + [node(f"k{i}", "r", depth=1, goal=f"good {i}") for i in range(4)])
    with FakeOpenAI(by_goal) as srv:
        out, stats = await judge_trees([t], "oolong", config.model_copy(
            update={"base_url": srv.base_url, "max_requests": 1, "on_budget_exhausted": fallback}))
    assert len(srv.requests) == 1 and stats.budget_exhausted and stats.budget_skipped == 3
    assert src(out[0])["k0"] == ("judge", 1.0)
    for i in (1, 2, 3):
        s, v = src(out[0])[f"k{i}"]
        assert s == expect[0] and (math.isnan(v) if expect[1] is None else v == expect[1])
        assert out[0].node(f"k{i}").judge["status"] == "budget"


async def test_token_and_cost_budget_and_accounting(config):
    """Each fake answer costs 100 prompt + 20 completion tokens: at $1/M and $2/M that is $0.00014."""
    t = tree("oolong", [node("r", None, verifier=1.0)] + [node(f"k{i}", "r", depth=1, goal=f"good {i}") for i in range(4)])
    with FakeOpenAI(by_goal) as srv:
        cfg = config.model_copy(update={"base_url": srv.base_url, "price_prompt_per_1m": 1.0,
                                        "price_completion_per_1m": 2.0, "max_tokens_total": 240})
        _, stats = await judge_trees([t], "oolong", cfg)
        assert stats.requests == 2 and stats.prompt_tokens == 200 and stats.completion_tokens == 40
        assert stats.cost_usd == pytest.approx(2 * 1.4e-4) and stats.budget_skipped == 2
        cfg = cfg.model_copy(update={"max_tokens_total": None, "max_cost_usd": 1.5e-4, "use_cache": False})
        _, stats = await judge_trees([t], "oolong", cfg)
        assert stats.requests == 2 and stats.budget_skipped == 2  # 1.4e-4 < 1.5e-4 allows a second request
    m = stats.as_metrics()
    assert m["judge/requests"] == 2 and m["judge/budget_exhausted"] == 1.0 and m["judge/source_proxy"] == 2


async def test_input_trees_are_not_mutated(config):
    t = oolong_tree()
    before = t.model_dump_json()
    out, _ = await judge_trees([t], "oolong", config.model_copy(update={"enabled": False}))
    assert t.model_dump_json() == before and out[0] is not t and out[0].node("a").success == 1.0


def test_sync_wrapper_and_rejudge_starts_clean(config):
    t = oolong_tree()
    with FakeOpenAI(by_goal) as srv:
        out, _ = judge_trees_sync([t], "oolong", config.model_copy(update={"base_url": srv.base_url}))
    # re-judge the scored tree with the judge off: old judge records are replaced by the proxy
    again, _ = judge_trees_sync(out, "oolong", config.model_copy(update={"enabled": False}))
    assert src(again[0])["b"] == ("proxy", 1.0) and again[0].node("b").judge is None
    json.loads(again[0].model_dump_json())  # NaN-free here; still serialisable


def test_bad_verifier_value_is_named(config):
    t = tree("oolong", [node("r", None, verifier=1.0), node("a", "r", depth=1)])
    t.nodes[1].verifier = 2.0  # set in memory (a file with it would not load)
    with pytest.raises(ValueError, match="node a: .* outside"):
        judge_trees_sync([t], "oolong", config)


async def test_root_proxy_for_every_child_ablation(config):
    """judge.child_source = root_proxy (the paper's ablation): every sub-agent node takes its root's success,
    whatever its own verifier (a: 0.0), the judge (b) or the unfinished rule (c) would have said."""
    t = oolong_tree(root_v=0.75)
    t.node("a").verifier = 0.0
    with FakeOpenAI(never) as srv:
        out, stats = await judge_trees([t], "oolong", config.model_copy(
            update={"base_url": srv.base_url, "child_source": "root_proxy", "use_proxy": False}))
    assert src(out[0]) == {"r": ("verifier", 0.75), "a": ("proxy", 0.75), "b": ("proxy", 0.75), "c": ("proxy", 0.75)}
    assert stats.requests == 0 and stats.unfinished_rule == 0 and stats.sources["proxy"] == 3
    # an unscored root leaves its children unscored too
    out, _ = await judge_trees([oolong_tree(root_v=None)], "oolong", config.model_copy(
        update={"enabled": False, "child_source": "root_proxy"}))
    assert all(s == "none" and math.isnan(v) for s, v in src(out[0]).values())


def test_schema_1_tree_file_loads_with_its_verifier_value(config, tmp_path):
    """A tree written before schema 2 (verifier value in env_info["verifier_success"]) still loads, and the
    judge reads the value as the node's verifier."""
    from rao_core.tree import SCHEMA_VERSION, read_trees, write_trees

    def old_node(nid, parent, depth, v):
        return {"node_id": nid, "parent_id": parent, "depth": depth, "goal": f"goal {nid}", "end_reason": "finished",
                "env_info": {"verifier_success": v, "inventory": {"stick": 1}}, "children": ["a"] if nid == "r" else []}

    line = {"schema_version": 1, "tree_id": "t", "env": "textcraft-synth", "task_id": "x", "group_id": "g",
            "root_id": "r", "nodes": [old_node("r", None, 0, 1.0), old_node("a", "r", 1, None)]}
    (tmp_path / "old.jsonl").write_text(json.dumps(line) + "\n")
    [t] = read_trees(tmp_path / "old.jsonl")
    assert SCHEMA_VERSION == 2 and t.schema_version == 2
    assert (t.root.verifier, t.node("a").verifier) == (1.0, None)
    assert t.root.env_info == {"inventory": {"stick": 1}}  # the moved key is gone, the rest kept
    out, _ = judge_trees_sync([t], None, config.model_copy(update={"enabled": False}))
    assert src(out[0]) == {"r": ("verifier", 1.0), "a": ("proxy", 1.0)}
    assert read_trees(write_trees(tmp_path / "new.jsonl", [t])) == [t]  # written back as schema 2
    line["schema_version"] = 3
    (tmp_path / "future.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match="schema_version 3, expected 2"):
        read_trees(tmp_path / "future.jsonl")


def forwarding_tree():
    """r (root, verifier) -> a forwards its own goal to a1; b delegates a strict part of its goal to b1;
    c launches two sub-agents, one of them with c's own goal."""
    return tree("oolong", [
        node("r", None, verifier=1.0, goal="How many rolls did Vex make in the transcript?"),
        node("a", "r", depth=1, goal="Count the rolls of Vex in episode 1."),
        node("a1", "a", depth=2, goal="  count the ROLLS of vex\nin episode 1. "),  # same goal, normalised
        node("b", "r", depth=1, goal="Count the rolls of Vex in episode 2."),
        node("b1", "b", depth=2, goal="Count the rolls of Vex in the first half of episode 2."),
        node("c", "r", depth=1, goal="Count the rolls of Vex in episode 3."),
        node("c1", "c", depth=2, goal="Count the rolls of Vex in episode 3."),
        node("c2", "c", depth=2, goal="Count the rolls of Vex in the second half of episode 3."),
    ])


def yes(body, _idx):
    return 200, YES, {}


async def test_a_node_that_forwards_its_goal_is_failed_by_rule(config):
    """A forwarded its whole goal to its only child, so s(a) = 0 without a request and a earns r
    no delegation bonus; b (a strict part) and c (two sub-agents) go to the judge as before."""
    with FakeOpenAI(yes) as srv:
        out, stats = await judge_trees([forwarding_tree()], "oolong", config.model_copy(
            update={"base_url": srv.base_url}))
    assert src(out[0]) == {"r": ("verifier", 1.0), "a": ("rule", 0.0), "a1": ("judge", 1.0), "b": ("judge", 1.0),
                           "b1": ("judge", 1.0), "c": ("judge", 1.0), "c1": ("judge", 1.0), "c2": ("judge", 1.0)}
    a = out[0].node("a").judge
    assert a["rule"] == "forwarded" and a["verdict"] == "no" and "own goal" in a["reason"]
    assert stats.requests == 6 and stats.sources["rule"] == 1 and stats.unfinished_rule == 0
    sent = [r["body"]["messages"][1]["content"] for r in srv.requests]
    assert not any(c.startswith("## Sub-task goal\nCount the rolls of Vex in episode 1.") for c in sent)
    # the switch hands a back to the judge (and so does the proxy with the judge off: a inherits r's 1.0)
    out, _ = await judge_trees([forwarding_tree()], "oolong", config.model_copy(
        update={"enabled": False, "forwarding_is_failure": False}))
    assert src(out[0])["a"] == ("proxy", 1.0)
    out, _ = await judge_trees([forwarding_tree()], "oolong", config.model_copy(update={"enabled": False}))
    assert src(out[0])["a"] == ("rule", 0.0) and src(out[0])["b"] == ("proxy", 1.0)


async def test_forwarding_rule_spares_roots_verifiers_and_the_ablation(config):
    """A root that forwards is scored by its own source (here the judge, judge_roots on); a forwarding node
    with an exact verifier keeps it; child_source root_proxy skips the rule like every other."""
    t = tree("oolong", [node("r", None, goal="Q?"), node("k", "r", depth=1, goal="q?", verifier=0.75),
                        node("k1", "k", depth=2, goal="Q?")])
    with FakeOpenAI(yes) as srv:
        out, _ = await judge_trees([t], "oolong", config.model_copy(
            update={"base_url": srv.base_url, "judge_roots": True}))
    assert src(out[0]) == {"r": ("judge", 1.0), "k": ("verifier", 0.75), "k1": ("judge", 1.0)}
    out, _ = await judge_trees([forwarding_tree()], "oolong", config.model_copy(
        update={"enabled": False, "child_source": "root_proxy"}))
    assert src(out[0])["a"] == ("proxy", 1.0)


async def test_judge_sees_the_parent_goal_the_subtasks_and_the_cells(config):
    """The fake judge answers no only when it is shown what the v2 failure rules need (the regex in the cells,
    the parent's goal, the delegated goal); its verdict is parsed as before."""
    t = tree("oolong", [
        node("r", None, verifier=1.0, goal="PARENT-QUESTION: how many rolls?"),
        node("a", "r", depth=1, goal="Count Vex's rolls in chunk 1.", result=7,
             cells=[("import re\nprint(len(re.findall(r'Vex rolls', context)))", "7")]),
        node("a1", "a", depth=2, goal="CHILD-GOAL: Vex's rolls in the first half of chunk 1."),
    ])

    def sees_all(body, _idx):
        user = body["messages"][1]["content"]
        ok = all(x in user for x in ("re.findall", "PARENT-QUESTION", "CHILD-GOAL"))
        return 200, NO if ok else YES, {}

    with FakeOpenAI(sees_all) as srv:
        out, stats = await judge_trees([t], "oolong", config.model_copy(update={"base_url": srv.base_url}))
    a = out[0].node("a")
    assert (a.success_source, a.success) == ("judge", 0.0) and a.judge["verdict"] == "no"
    assert a.judge["parsed_by"] == "json" and a.judge["raw"] == NO
    assert a.judge["prompt_version"].startswith("oolong/v2#")
    assert "pattern-match" in srv.requests[0]["body"]["messages"][0]["content"]


async def test_same_node_under_another_parent_is_not_a_cache_hit(config):
    """The parent's goal is in the prompt, so it is in the cache key: identical children of different
    parents get a request each."""
    def one(tid, parent_goal):
        return tree("oolong", [node("r", None, verifier=1.0, goal=parent_goal),
                               node("a", "r", depth=1, goal="good: count rolls")], tree_id=tid)

    with FakeOpenAI(by_goal) as srv:
        cfg = config.model_copy(update={"base_url": srv.base_url})
        _, s1 = await judge_trees([one("t0", "Q1"), one("t1", "Q2")], "oolong", cfg)
        _, s2 = await judge_trees([one("t2", "Q1")], "oolong", cfg)
    assert s1.requests == 2 and s1.cache_hits == 0 and s2.requests == 0 and s2.cache_hits == 1
