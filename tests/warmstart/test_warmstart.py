"""Warm start: demonstrations through the real runtime, SFT samples, stats, SFT lowers loss, vLLM serving."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from rao_core.envs import get_env
from rao_core.paths import tiny_model_path
from rao_core.runtime import RuntimeConfig, load_tokenizer, run_tree
from rao_core.tree import EndReason, ExecutionTree, Node, NodeTimings
from rao_core.warmstart import (DemoConfig, Demonstrations, build_demonstrations, child_sample_tree_indices,
                                default_sft_trainer_config, demo_loss, demo_samples, demo_stats, demo_tasks,
                                expert_for_tree, run_warm_start, single_agent_tree)

SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
pytestmark = pytest.mark.skipif(not (tiny_model_path() / "tokenizer_config.json").exists(),
                                reason="tiny model not prepared (make setup)")


def _rc(**kw) -> RuntimeConfig:
    return RuntimeConfig(**{"sandbox": SANDBOX, "context_window": 4096, "max_new_tokens": 768, **kw})


@pytest.fixture(scope="module")
def demos() -> Demonstrations:
    env = get_env("textcraft-synth")
    cfg = DemoConfig(n_tasks=4, seed=5, parallel_prob=0.5, delegate_min_depths=[2])
    return asyncio.run(build_demonstrations(env, demo_tasks(env, cfg), cfg, tokenizer=tiny_model_path(),
                                            runtime_config=_rc()))


def test_config_validation_and_defaults():
    with pytest.raises(ValueError, match="difficulties"):
        DemoConfig(difficulties=[])
    with pytest.raises(ValueError, match="delegate_min_depths"):
        DemoConfig(delegate_min_depths=[0])
    with pytest.raises(ValueError):
        DemoConfig(parallel_prob=1.5)
    with pytest.raises(ValueError):
        DemoConfig(n_taks=3)  # typo: extra fields are rejected
    d = DemoConfig()
    assert d.difficulties == ["easy", "medium"]
    tc = default_sft_trainer_config(epochs=1)
    assert tc.loss_type == "sft" and tc.epochs == 1
    with pytest.raises(ValueError, match="sft"):
        run_warm_start("textcraft-synth", tiny_model_path(), "/nonexistent",
                       trainer_config=default_sft_trainer_config(loss_type="ppo"))


def test_demo_tasks_split_over_difficulties():
    env = get_env("textcraft-synth")
    tasks = demo_tasks(env, DemoConfig(n_tasks=5, difficulties=["easy", "medium"], seed=1))
    assert [t.difficulty for t in tasks] == ["easy"] * 3 + ["medium"] * 2
    assert all(t.split == "train" for t in tasks)


def test_expert_settings_vary_per_tree():
    cfg = DemoConfig(delegate_min_depths=[2, 3, 4])
    experts = [expert_for_tree("textcraft-synth", cfg, i, _rc()) for i in range(12)]
    assert len({e.seed for e in experts}) == 12
    assert {e.delegate_min_depth for e in experts} == {2, 3, 4}
    assert all(e.max_depth == 2 and e.parallel_prob == cfg.parallel_prob for e in experts)
    again = [expert_for_tree("textcraft-synth", cfg, i, _rc()).delegate_min_depth for i in range(12)]
    assert again == [e.delegate_min_depth for e in experts]  # seeded


def test_single_agent_fraction_mixes_single_agent_trees():
    assert [single_agent_tree(DemoConfig(single_agent_fraction=0.25), i) for i in range(8)] == [
        False, False, False, True, False, False, False, True]
    assert not any(single_agent_tree(DemoConfig(), i) for i in range(8))
    assert all(single_agent_tree(DemoConfig(single_agent_fraction=1.0), i) for i in range(3))
    env = get_env("textcraft-synth")
    cfg = DemoConfig(n_tasks=2, difficulties=["medium"], seed=5, delegate_min_depths=[2], single_agent_fraction=0.5)
    out = asyncio.run(build_demonstrations(env, demo_tasks(env, cfg), cfg, tokenizer=tiny_model_path(),
                                           runtime_config=_rc()))
    assert len(out) == 2 and [t.meta["demo_single_agent"] for t in out] == [False, True]
    tok = load_tokenizer(tiny_model_path())
    multi, single = (tok.decode(t.root.token_ids) for t in out)
    assert len(out[1].nodes) == 1 and "launch_subagent" not in single  # no delegation tool in the prompt
    assert "launch_subagent" in multi and len(out[0].nodes) > 1
    assert demo_stats(out)["single_agent_trees"] == 1


def test_demonstrations_are_verified_trees_with_delegation(demos):
    assert demos.attempted == 4 and demos.rejected == 0 and len(demos) == 4
    for t in demos:
        assert t.root.verifier == 1.0 and t.root.end_reason == EndReason.FINISHED
        assert "delegate_min_depth" in t.meta["demo_expert"]
    assert any(len(t.nodes) > 1 for t in demos)  # medium tasks delegate through the real launch_subagent


def test_masks_cover_exactly_the_assistant_tokens(demos):
    tok = load_tokenizer(tiny_model_path())
    eos = tok.eos_token_id
    checked = 0
    for t in demos:
        for n in t.nodes:
            assert len(n.token_ids) == len(n.assistant_mask) == len(n.behaviour_logprobs)
            expected = [0] * len(n.token_ids)
            for k, turn in enumerate(n.turns):
                start = len(turn.prompt_token_ids)
                # the turn's ids are the tokenised text plus the end-of-turn token
                assert turn.completion_token_ids == list(tok(turn.text, add_special_tokens=False)["input_ids"]) + [eos]
                assert n.token_ids[start:start + len(turn.completion_token_ids)] == turn.completion_token_ids
                for j in range(len(turn.completion_token_ids)):
                    expected[start + j] = 1
                if k + 1 < len(n.turns):  # token in, token out: the next prompt extends this one
                    nxt = n.turns[k + 1].prompt_token_ids
                    assert nxt[:start + len(turn.completion_token_ids)] == n.token_ids[:start + len(turn.completion_token_ids)]
            assert n.assistant_mask == expected
            # decode the masked spans: exactly each turn's text, then the EOS
            spans, cur = [], []
            for i, m in zip(n.token_ids, n.assistant_mask):
                if m:
                    cur.append(i)
                elif cur:
                    spans.append(cur)
                    cur = []
            if cur:
                spans.append(cur)
            assert [tok.decode(s, skip_special_tokens=True) for s in spans] == [tu.text for tu in n.turns]
            assert all(s[-1] == eos for s in spans)
            # observations are never targets
            unmasked = tok.decode([i for i, m in zip(n.token_ids, n.assistant_mask) if not m])
            for tu in n.turns[:-1]:
                assert tu.observation.strip()[:40] in unmasked
            checked += 1
    assert checked == sum(len(t.nodes) for t in demos)


def test_demo_samples_one_per_node(demos):
    batch = demo_samples(demos)
    assert len(batch) == sum(len(t.nodes) for t in demos)
    by_key = {(s.tree_id, s.node_id): s for s in batch.samples}
    for t in demos:
        for n in t.nodes:
            s = by_key[(t.tree_id, n.node_id)]
            assert s.token_ids == n.token_ids and s.assistant_mask == n.assistant_mask
            assert (s.advantage, s.weight, s.success, s.depth) == (1.0, 1.0, 1.0, n.depth)
    assert batch.stats.num_assistant_tokens == sum(n.num_completion_tokens for t in demos for n in t.nodes)


def _node(nid: str, parent: str | None, depth: int, ok: float | None, start: float = 0.0, wall: float = 1.0) -> Node:
    return Node(node_id=nid, parent_id=parent, depth=depth, goal="g", end_reason=EndReason.FINISHED,
                verifier=ok, token_ids=[5, 6, 7], assistant_mask=[0, 1, 1],
                behaviour_logprobs=[0.0] * 3, timings=NodeTimings(started_at=start, wall_s=wall))


def test_demo_samples_drop_failed_and_empty_nodes_and_stats_count_launches():
    empty = _node("0.2", "0", 1, 1.0, start=5.0)
    empty.token_ids, empty.assistant_mask, empty.behaviour_logprobs = [], [], []
    par = ExecutionTree(tree_id="a", env="textcraft-synth", task_id="k", group_id="k", root_id="0", nodes=[
        _node("0", None, 0, 1.0), _node("0.0", "0", 1, 1.0, start=1.0, wall=2.0),
        _node("0.1", "0", 1, 0.0, start=1.5, wall=2.0), empty])
    seq = ExecutionTree(tree_id="b", env="textcraft-synth", task_id="k2", root_id="0", nodes=[
        _node("0", None, 0, 1.0), _node("0.0", "0", 1, 1.0, start=1.0, wall=1.0),
        _node("0.1", "0", 1, 1.0, start=2.5, wall=1.0)])
    b = demo_samples([par, seq])
    assert [(s.tree_id, s.node_id) for s in b.samples] == [("a", "0"), ("a", "0.0"), ("b", "0"), ("b", "0.0"),
                                                           ("b", "0.1")]
    assert b.stats.dropped_nan_nodes == 1 and b.stats.dropped_empty_nodes == 1
    assert b.samples[2].group_id == "b"  # no group id: the tree id
    assert len(demo_samples([par], only_successful_nodes=False)) == 3
    st = demo_stats([par, seq])
    assert (st["trees"], st["nodes"], st["parallel_launches"], st["sequential_launches"]) == (2, 7, 1, 1)
    assert st["depth_histogram"] == {0: 2, 1: 5} and st["tree_depth_histogram"] == {1: 2}
    assert st["assistant_tokens"] == 12 and st["mean_assistant_tokens"] == pytest.approx(12 / 7)
    bad = _node("0", None, 0, 1.0)
    bad.assistant_mask = [0, 1]
    with pytest.raises(ValueError, match="differ in length"):
        demo_samples([ExecutionTree(tree_id="c", env="e", task_id="k", root_id="0", nodes=[bad])])


def test_child_sample_trees_keeps_every_root_and_the_children_of_evenly_spread_trees():
    trees = [ExecutionTree(tree_id=f"t{i}", env="textcraft-synth", task_id=f"k{i}", root_id="0", nodes=[
        _node("0", None, 0, 1.0), _node("0.0", "0", 1, 1.0, start=1.0), _node("0.1", "0", 1, 1.0, start=1.0)])
        for i in range(6)]
    assert child_sample_tree_indices(6, None) == set(range(6)) == child_sample_tree_indices(6, 9)
    assert child_sample_tree_indices(6, 2) == {0, 3} and child_sample_tree_indices(6, 3) == {0, 2, 4}
    assert child_sample_tree_indices(6, 0) == set()
    b = demo_samples(trees, child_sample_trees=2)
    assert [(s.tree_id, s.node_id) for s in b.samples] == [
        ("t0", "0"), ("t0", "0.0"), ("t0", "0.1"), ("t1", "0"), ("t2", "0"), ("t3", "0"), ("t3", "0.0"),
        ("t3", "0.1"), ("t4", "0"), ("t5", "0")]
    assert b.stats.dropped_child_nodes == 8 and b.stats.samples_per_depth == {0: 6, 1: 4}
    assert len(demo_samples(trees)) == 18 and demo_samples(trees).stats.dropped_child_nodes == 0
    assert [s.depth for s in demo_samples(trees, child_sample_trees=0).samples] == [0] * 6
    with pytest.raises(ValueError):
        DemoConfig(child_sample_trees=-1)


def test_demo_stats_of_real_demonstrations(demos):
    st = demo_stats(demos)
    assert st["trees"] == 4 and st["attempted"] == 4 and st["rejected"] == 0
    assert st["nodes"] == sum(st["depth_histogram"].values())
    assert st["parallel_launches"] + st["sequential_launches"] == sum(
        1 for t in demos for n in t.nodes if n.children)


def test_failed_roots_are_rejected_and_counted():
    from rao_core.policies.scripted import ReplayPolicy, cell

    class Quitter(ReplayPolicy):  # finishes without crafting: the verifier says 0
        pass

    env = get_env("textcraft-synth")
    cfg = DemoConfig(n_tasks=2, difficulties=["easy"], seed=2)
    import rao_core.warmstart as ws

    orig = ws.expert_for_tree
    ws.expert_for_tree = lambda *a, **k: Quitter(default=[cell("finish('nothing')")])
    try:
        out = asyncio.run(build_demonstrations(env, demo_tasks(env, cfg), cfg, tokenizer=tiny_model_path(),
                                               runtime_config=_rc()))
    finally:
        ws.expert_for_tree = orig
    assert (len(out), out.attempted, out.rejected) == (0, 2, 2)
    with pytest.raises(ValueError, match="at least one task"):
        asyncio.run(build_demonstrations(env, [], cfg, tokenizer=tiny_model_path(), runtime_config=_rc()))


@pytest.fixture(scope="module")
def sft_checkpoint(demos, tmp_path_factory):
    """SFT of the tiny model on one easy tree and one medium root; the other easy tree is held out
    (kept small: the 49152-word output layer dominates the cost even for the tiny model)."""
    from rao_core.train import train

    train_b = [s for s in demo_samples([demos[0], demos[2]]).samples if s.depth == 0]
    held = demo_samples([demos[1]])
    out = tmp_path_factory.mktemp("sft") / "ckpt"
    before = demo_loss(tiny_model_path(), held)
    cfg = default_sft_trainer_config(lr=3e-3, epochs=3, grad_accum=1, micro_batch_tokens=4096, warmup_steps=0,
                                     gradient_checkpointing=False)
    res = train(train_b, tiny_model_path(), out, cfg)
    after = demo_loss(out, held)
    return out, before, after, res


@pytest.mark.slow
def test_sft_lowers_loss_on_held_out_demonstrations(sft_checkpoint):
    out, before, after, res = sft_checkpoint
    assert res.manifest["config"]["loss_type"] == "sft"
    assert after < before - 1.0, (before, after)  # random init: ~ln(49152) = 10.8 nats/token before
    assert before > 9.0


@pytest.mark.slow
@pytest.mark.vllm
async def test_warm_started_checkpoint_is_served_and_grows_a_tree(sft_checkpoint, tmp_path):
    from infra.serving import VLLMServer
    from rao_core.policies.openai_policy import OpenAIPolicy

    ckpt = sft_checkpoint[0]
    env = get_env("textcraft-synth")
    task = env.generate_tasks(n=1, seed=0, difficulty="easy", split="validation")[0]
    cfg = _rc(max_steps_per_node=2, max_new_tokens=128, context_window=2048)
    with VLLMServer(ckpt, served_model_name="policy", max_model_len=2048, log_dir=tmp_path) as srv:
        policy = OpenAIPolicy(srv.base_url, "policy", temperature=1.0)
        try:
            tree = await run_tree(env, task, policy, cfg, tokenizer=ckpt)
        finally:
            await policy.aclose()
    assert tree.error is None, tree.error
    root = tree.root
    assert root.turns and root.token_ids and sum(root.assistant_mask) > 0
    assert root.end_reason in (EndReason.FINISHED, EndReason.MAX_STEPS, EndReason.CONTEXT_OVERFLOW)
    assert root.verifier in (0.0, 1.0)


def test_demonstrations_report_each_finished_tree():
    """``on_progress(done, total)`` after each tree (what the warm start's log lines count)."""
    env = get_env("textcraft-synth")
    cfg = DemoConfig(n_tasks=2, difficulties=["easy"], seed=3, rollouts_per_task=2)
    seen: list[tuple[int, int]] = []
    out = asyncio.run(build_demonstrations(env, demo_tasks(env, cfg), cfg, tokenizer=tiny_model_path(),
                                           runtime_config=_rc(), on_progress=lambda d, t: seen.append((d, t))))
    assert out.attempted == 4 and seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
