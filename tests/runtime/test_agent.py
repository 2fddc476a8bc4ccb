"""Agent-loop tests with scripted policies and a fake environment (tests/runtime/fakes.py)."""

from __future__ import annotations

import asyncio

import pytest

from rao_core.policies.base import Generation, Policy, PolicyRequest
from rao_core.policies.scripted import ReplayPolicy, cell
from rao_core.runtime import RuntimeConfig, run_tree, run_trees, system_prompt
from rao_core.runtime.chat import ChatTokens
from rao_core.tree import CellStatus, EndReason, ExecutionTree, read_trees, write_trees
from tests.runtime.fakes import FakeEnv, runtime_config, task

cfg = runtime_config


def check_tokens(tree: ExecutionTree, chat: ChatTokens) -> None:
    """Every node's trajectory = last prompt + completion; mask marks exactly its own completions."""
    for n in tree.nodes:
        if not n.turns:
            continue
        assert len(n.token_ids) == len(n.assistant_mask) == len(n.behaviour_logprobs)
        assert sum(n.assistant_mask) == sum(len(t.completion_token_ids) for t in n.turns)
        for a, b in zip(n.turns, n.turns[1:]):  # prefix property: next prompt extends prompt + completion
            prev = a.prompt_token_ids + a.completion_token_ids
            assert b.prompt_token_ids[: len(prev)] == prev
        assert n.token_ids[: len(n.turns[0].prompt_token_ids)] == n.turns[0].prompt_token_ids


async def test_depth3_tree_parallel_children_and_result_types(tok, tmp_path):
    pol = ReplayPolicy(by_depth={
        0: [cell("r = await asyncio.gather(launch_subagent('child dict'), launch_subagent('child list'))\n"
                 "print(type(r[0]).__name__, type(r[1]).__name__)"),
            cell("finish({'kids': r, 'info': get_info()})")],
        1: [cell("r = await launch_subagent('leaf')\nfinish({'leaf': r} if 'dict' in 'GOAL' else [r, NODE_DEPTH])")],
        2: [cell("s = await launch_subagent('deepest')\nfinish(s + '!')")],
        3: [cell("add(1)\nfinish('deep')")],
    }, delay_s=0.3)
    # the depth-1 script refers to its own goal through the goal text below
    pol.by_depth[1] = [cell("r = await launch_subagent('leaf')\nfinish([r, NODE_DEPTH])")]
    tree = await run_tree(FakeEnv(), task(expect=None), pol, cfg(), tokenizer=tok)
    assert tree.error is None
    assert tree.depth == 3 and len(tree.nodes) == 7
    assert all(n.end_reason == EndReason.FINISHED for n in tree.nodes), [(n.node_id, n.error) for n in tree.nodes]
    root = tree.root
    assert root.turns[0].observation == "list list\n"
    assert root.result == {"kids": [["deep!", 1], ["deep!", 1]], "info": {"depth": 0, "counter": 2}}
    assert root.children == ["0.0", "0.1"]
    assert [n.depth for n in tree.walk()] == [0, 1, 2, 3, 1, 2, 3]
    # siblings really ran at the same time: the policy saw both depth-1 requests in flight at once
    assert pol.max_in_flight >= 2
    c0, c1 = tree.node("0.0"), tree.node("0.1")
    assert abs(c0.timings.started_at - c1.timings.started_at) < 0.25
    # the parent never sees a child's transcript
    assert all("deep" not in m["content"] for m in root.messages[:2])
    assert root.verifier is None and "verifier_error" not in root.env_info  # no "expect": not checkable
    check_tokens(tree, ChatTokens(tok))
    path = write_trees(tmp_path / "t.jsonl", [tree])
    assert read_trees(path) == [tree]


async def test_child_result_stays_in_its_variable_unless_printed(tok):
    """A bare `await launch_subagent(...)` on a cell's last line must not leak the child's result into the
    parent's observation (docs/concepts.md); with `echo_last_expression` on it would."""
    pol = ReplayPolicy(by_goal={"secret": [cell("finish('SECRET-VALUE-123')")]},
                       default=[cell("r = 1\nawait launch_subagent('secret')"), cell("finish('ok')")])
    tree = await run_tree(FakeEnv(), task(), pol, cfg(), tokenizer=tok)
    assert tree.root.end_reason == EndReason.FINISHED
    assert "SECRET-VALUE-123" not in tree.root.turns[0].observation
    assert "only what you print is shown" in tree.root.messages[0]["content"].lower()
    pol2 = ReplayPolicy(by_goal={"secret": [cell("finish('SECRET-VALUE-123')")]},
                        default=[cell("r = 1\nawait launch_subagent('secret')"), cell("finish('ok')")])
    tree2 = await run_tree(FakeEnv(), task(), pol2, cfg(echo_last_expression=True), tokenizer=tok)
    assert "SECRET-VALUE-123" in tree2.root.turns[0].observation


async def test_child_results_dict_list_str_arrive_as_objects(tok):
    pol = ReplayPolicy(by_goal={
        "give dict": [cell("finish({'a': [1, 2], 'b': None})")],
        "give list": [cell("finish([1, 'x', 2.5])")],
        "give str": [cell("finish('text')")],
    }, default=[cell("d, l, s = await asyncio.gather(launch_subagent('give dict'), launch_subagent('give list'), "
                     "launch_subagent('give str'))\nfinish([d['a'][1], l[2], s.upper()])")])
    tree = await run_tree(FakeEnv(), task(expect=[2, 2.5, "TEXT"]), pol, cfg(), tokenizer=tok)
    assert tree.root.result == [2, 2.5, "TEXT"]
    assert tree.root.verifier == 1.0


async def test_tools_errors_and_sync_tool_inside_coroutine(tok):
    pol = ReplayPolicy(by_goal={"slow child": [cell("await asyncio.sleep(0.3)\nfinish(add(10))")]}, default=[
        cell("async def work():\n    t = asyncio.ensure_future(launch_subagent('slow child'))\n"
             "    info = get_info()  # sync tool while the child runs\n    return info, await t\n"
             "info, c = await work()\nprint(info, c)\n"
             "try:\n    fail()\nexcept ToolError as e:\n    print('ToolError:', e)"),
        cell("submit(123)\nprint('not reached')"),
    ])
    tree = await run_tree(FakeEnv(), task(), pol, cfg(), tokenizer=tok)
    root = tree.root
    assert root.turns[0].observation == "{'depth': 0, 'counter': 0} 10\nToolError: this tool always fails\n"
    assert root.end_reason == EndReason.FINISHED and root.result == {"submitted": 123}  # finishing tool


async def test_max_steps_and_no_code(tok):
    pol = ReplayPolicy(default=["I will think without code."])
    tree = await run_tree(FakeEnv(), task(), pol, cfg(max_steps_per_node=3), tokenizer=tok)
    assert tree.root.end_reason == EndReason.MAX_STEPS and len(tree.root.turns) == 3
    assert all(t.cell_status == CellStatus.NO_CODE for t in tree.root.turns)


async def test_child_max_steps_is_capped_and_child_failure_raises_in_parent(tok):
    pol = ReplayPolicy(by_goal={"needs max_steps": [cell("print('working')")]}, default=[
        cell("try:\n    await launch_subagent('needs max_steps')\nexcept ToolError as e:\n    print(e)"),
        cell("finish('ok')")])
    tree = await run_tree(FakeEnv(), task(), pol, cfg(max_steps_per_node=2), tokenizer=tok)
    child = tree.node("0.0")
    assert child.max_steps == 2 and len(child.turns) == 2  # env asked for 100, config caps at 2
    assert child.end_reason == EndReason.MAX_STEPS
    assert tree.root.turns[0].observation == "sub-agent ended without finishing (max_steps)\n"


async def test_context_overflow(tok):
    pol = ReplayPolicy(default=[cell("print('y' * 3000)")])
    tree = await run_tree(FakeEnv(), task(), pol, cfg(context_window=1200, max_new_tokens=100,
                                                      observation_max_chars=3000), tokenizer=tok)
    root = tree.root
    assert root.end_reason == EndReason.CONTEXT_OVERFLOW
    assert len(root.token_ids) + 100 <= 1200 + 100  # never beyond one turn over the window
    assert all(len(t.prompt_token_ids) + 100 <= 1200 for t in root.turns)


async def test_tree_step_budget(tok):
    pol = ReplayPolicy(by_depth={0: [cell("await asyncio.gather(*[launch_subagent(f'c{i}') for i in range(3)], return_exceptions=True)")],
                                 1: [cell("print(1)")]})
    tree = await run_tree(FakeEnv(), task(), pol, cfg(tree_step_budget=5), tokenizer=tok)
    assert sum(len(n.turns) for n in tree.nodes) == 5
    assert {n.end_reason for n in tree.nodes} == {EndReason.TREE_STEP_BUDGET}


async def test_tree_timeout_cancels_all_nodes(tok):
    # the slow policy's waits reach the limit on the wall clock (the own clock leaves them out: test_busy_limits.py)
    pol = ReplayPolicy(by_depth={0: [cell("await launch_subagent('c')")], 1: [cell("print(1)")]}, delay_s=0.5)
    tree = await run_tree(FakeEnv(), task(), pol, cfg(tree_timeout_s=2.0, max_steps_per_node=50, tree_clock="wall"),
                          tokenizer=tok)
    assert {n.end_reason for n in tree.nodes} == {EndReason.TREE_TIMEOUT}
    assert len(tree.nodes) == 2 and 1.9 < tree.wall_s < 10


async def test_max_depth_and_max_children_refusals(tok):
    pol = ReplayPolicy(by_depth={
        0: [cell("for i in range(3):\n    try:\n        print(await launch_subagent(f'c{i}'))\n"
                 "    except ToolError as e:\n        print('refused:', e)\nfinish('x')")],
        1: [cell("try:\n    await launch_subagent('too deep')\nexcept ToolError as e:\n    finish(str(e))")]})
    tree = await run_tree(FakeEnv(), task(), pol, cfg(max_depth=1, max_children_per_node=2), tokenizer=tok)
    assert len(tree.nodes) == 3 and tree.depth == 1
    assert tree.node("0.0").result.startswith("launch_subagent refused: maximum depth 1 reached")
    assert tree.root.turns[0].observation.splitlines()[2] == \
        "refused: launch_subagent refused: at most 2 sub-agents per agent"


async def test_cell_timeout_restarts_repl_and_says_variables_are_lost(tok):
    pol = ReplayPolicy(default=[cell("x = 1\nwhile True:\n    pass"), cell("print(x)")])
    tree = await run_tree(FakeEnv(), task(), pol, cfg(cell_timeout_s=1.0, max_steps_per_node=2), tokenizer=tok)
    t0, t1 = tree.root.turns
    assert t0.cell_status == CellStatus.TIMEOUT and "variables from earlier cells are lost" in t0.observation
    assert t1.cell_status == CellStatus.ERROR and "NameError" in t1.observation


async def test_single_agent_mode(tok):
    pol = ReplayPolicy(default=[cell("print('launch_subagent' in globals())\nfinish(1)")])
    env = FakeEnv()
    tree = await run_tree(env, task(), pol, cfg(delegation=False), tokenizer=tok)
    assert tree.root.turns[0].observation == "False\n"
    assert "launch_subagent" not in tree.root.messages[0]["content"]
    assert tree.meta["max_depth"] == 0


@pytest.mark.parametrize("sequential", [False, True])
async def test_sequential_children_switch_runs_gathered_children_one_at_a_time(tok, sequential):
    """runtime.sequential_children: the same gather, the same tree, but no two children's lives overlap."""
    pol = ReplayPolicy(by_depth={0: [cell("r = await asyncio.gather(*[launch_subagent(f'c{i}') for i in range(3)])\n"
                                          "finish(r)")],
                                 1: [cell("finish(1)")]}, delay_s=0.3)
    tree = await run_tree(FakeEnv(), task(), pol, cfg(sequential_children=sequential), tokenizer=tok)
    kids = sorted((n for n in tree.nodes if n.depth == 1), key=lambda n: n.node_id)
    assert [n.end_reason for n in kids] == [EndReason.FINISHED] * 3 and tree.root.result == [1, 1, 1]
    spans = [(n.timings.started_at, n.timings.started_at + n.timings.wall_s) for n in kids]
    overlap = any(b0 < a1 - 1e-3 for (_, a1), (b0, _) in zip(spans, spans[1:]))
    assert overlap is not sequential, spans
    if sequential:  # the root waits; the children's requests never overlap
        assert pol.max_in_flight == 1
    # gathered: the children's lives overlap (above); their 0.3 s requests need not, when a loaded machine starts
    # each child's REPL slower than that (seen at nice 19 beside an experiment: max_in_flight 1)


class BrokenPrefixPolicy(Policy):
    """Echoes prompt ids with one id changed on the second turn (a re-tokenisation bug)."""

    name = "broken"

    async def generate(self, request: PolicyRequest) -> Generation:
        ids = list(request.prompt_token_ids)
        if request.node.turns:
            ids[5] += 1
        return Generation(text=cell("print(1)"), token_ids=[10, 11, 12], logprobs=[-1.0, -2.0, -3.0],
                          prompt_token_ids=ids)


async def test_token_prefix_break_is_reported(tok):
    tree = await run_tree(FakeEnv(), task(), BrokenPrefixPolicy(), cfg(), tokenizer=tok)
    root = tree.root
    assert root.end_reason == EndReason.TOKEN_PREFIX_BREAK and "position 5" in root.error
    assert len(root.turns) == 2
    # the trajectory keeps only the valid first turn
    assert root.token_ids == root.turns[0].prompt_token_ids + [10, 11, 12]
    assert root.behaviour_logprobs[-3:] == [-1.0, -2.0, -3.0] and sum(root.assistant_mask) == 3


class RaisingPolicy(Policy):
    async def generate(self, request):
        raise ConnectionError("boom")


async def test_policy_exception_ends_node_with_policy_error(tok):
    tree = await run_tree(FakeEnv(), task(), RaisingPolicy(), cfg(), tokenizer=tok)
    assert tree.root.end_reason == EndReason.POLICY_ERROR and "boom" in tree.root.error


async def test_run_trees_groups(tok):
    pol = ReplayPolicy(default=[cell("finish(get_info()['depth'])")])
    trees = await run_trees(FakeEnv(), [(task(task_id="a"), 2), (task(task_id="b"), 3)], pol, cfg(),
                            tokenizer=tok, progress=lambda d, t, tree: None)
    assert [(t.group_id, t.rollout_index) for t in trees] == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]
    assert all(t.root.result == 0 for t in trees)
    assert len({t.tree_id for t in trees}) == 5


class SlowPolicy(Policy):
    """Finishes after 0.2 s; counts the trees whose first turn is in flight at once. With ``wait_for`` = n each
    call also waits (up to 60 s) until n calls are in flight together, so a peak of n does not depend on how fast
    a loaded machine starts the trees' REPLs (peak 4 of 6 at load); a runtime that let fewer than n
    run at once would show that smaller peak after the timeout."""

    def __init__(self, wait_for: int | None = None):
        self.live, self.peak = 0, 0
        self.wait_for, self.all_in = wait_for, asyncio.Event()

    async def generate(self, request):
        self.live += 1
        self.peak = max(self.peak, self.live)
        if self.wait_for is not None:
            if self.live >= self.wait_for:
                self.all_in.set()
            try:
                await asyncio.wait_for(self.all_in.wait(), 60)
            except asyncio.TimeoutError:
                pass
        await asyncio.sleep(0.2)
        self.live -= 1
        return Generation(text="```python\nfinish(1)\n```")


async def test_max_concurrent_trees_gates_trees_and_their_clocks(tok):
    """At most max_concurrent_trees trees grow at once, and a queued tree's clock (``wall_s``,
    ``tree_timeout_s``) starts when the tree starts, not when it was queued. Asserted as an ordering, not a
    wall-clock ratio ("a tree's wall time < half the elapsed time" failed on a machine at load 6-7).
    A tree's clock ends when run_trees reports it (``progress``, called as the tree leaves the gate, before a
    queued tree can start), so it started at that instant minus its ``wall_s``: each tree of a later wave must
    start after an earlier tree ended, and at most 2 root nodes run whenever one starts. Had the clocks started
    at the queue, every tree's clock would start together, before any tree ended."""
    import time

    ended: dict[str, float] = {}
    pol = SlowPolicy()
    trees = await run_trees(FakeEnv(), [(task(task_id="a"), 6)], pol, cfg(max_concurrent_trees=2), tokenizer=tok,
                            progress=lambda done, total, tree: ended.setdefault(tree.tree_id, time.time()))
    assert pol.peak == 2 and all(t.root.result == 1 for t in trees)
    eps = 1e-3  # time.time() instants against perf_counter durations: allow their skew
    starts = sorted(ended[t.tree_id] - t.wall_s for t in trees)
    ends = sorted(ended.values())
    for k, start in enumerate(starts[2:]):  # the (k + 3)-th tree to start waited for k + 1 trees to end
        assert start >= ends[k] - eps, (k, starts, ends)
    roots = [(t.root.timings.started_at, t.root.timings.started_at + t.root.timings.wall_s) for t in trees]
    for start, _ in roots:
        assert sum(1 for s, e in roots if s <= start < e - eps) <= 2, roots
    ungated = SlowPolicy(wait_for=6)
    await run_trees(FakeEnv(), [(task(task_id="a"), 6)], ungated, cfg(), tokenizer=tok, progress=False)
    assert ungated.peak == 6


def test_system_prompt_lists_tools():
    env = FakeEnv()
    from rao_core.tree import Node

    text = system_prompt(env, RuntimeConfig(), Node(node_id="0", goal="g"))
    assert "add(n: int) -> int" in text and "launch_subagent(goal: str" in text and "finish(result)" in text


def test_config_validation():
    with pytest.raises(ValueError, match="max_new_tokens"):
        RuntimeConfig(context_window=100, max_new_tokens=100)
    assert RuntimeConfig(delegation=False, max_depth=3).effective_max_depth == 0


class _ShortLogprobsPolicy(Policy):
    async def generate(self, request):
        return Generation(text=cell("print(1)"), token_ids=[10, 11, 12], logprobs=[-1.0, -2.0])


class _SlowPolicy(Policy):
    async def generate(self, request):
        await asyncio.sleep(5)


class _StartFailsEnv(FakeEnv):
    def on_node_start(self, episode, node):
        raise RuntimeError("no snapshot")


async def test_each_end_of_the_node_loop_is_recorded(tok, monkeypatch):
    """The steps of ``_NodeLoop`` end the node with the reason and message of each failure."""
    tree = await run_tree(FakeEnv(), task(), _ShortLogprobsPolicy(), cfg(), tokenizer=tok)
    assert (tree.root.end_reason, tree.root.error) == (EndReason.POLICY_ERROR,
                                                       "policy returned 3 token ids but 2 log-probs")
    assert tree.root.turns == []  # the bad generation is not recorded as a turn
    tree = await run_tree(FakeEnv(), task(), _SlowPolicy(), cfg(policy_timeout_s=0.2), tokenizer=tok)
    assert (tree.root.end_reason, tree.root.error) == (EndReason.POLICY_ERROR, "policy did not answer within 0.2 s")
    tree = await run_tree(_StartFailsEnv(), task(), _SlowPolicy(), cfg(), tokenizer=tok)
    assert (tree.root.end_reason, tree.root.error) == (EndReason.SANDBOX_ERROR, "RuntimeError: no snapshot")
    assert tree.error == "node 0: RuntimeError: no snapshot" and tree.root.turns == []

    from rao_core.runtime.sandbox import ReplPool, SandboxError

    async def no_repl(self):
        raise SandboxError("bubblewrap is missing")

    monkeypatch.setattr(ReplPool, "acquire", no_repl)
    tree = await run_tree(FakeEnv(), task(), _SlowPolicy(), cfg(), tokenizer=tok)
    assert (tree.root.end_reason, tree.root.error) == (EndReason.SANDBOX_ERROR, "bubblewrap is missing")
    assert tree.error is None and tree.root.messages[1]["content"] == "root goal"  # started, no REPL
