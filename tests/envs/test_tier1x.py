"""The ``tier1x<K>`` delegation shape: K tier-1 sub-goals, one sub-agent per target, and a window
that one node crafting all K itself does not fit (the shape's defining property, through the real runtime)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from rao_core.envs.textcraft import TextCraftEnv, split_items
from rao_core.envs.textcraft.tasks import graph_of
from rao_core.policies.textcraft_expert import TextCraftExpert
from tests.envs.textcraft_driver import FakeRuntime, LazyChildren

ENV = TextCraftEnv()


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_tier1xk_tasks_have_k_distinct_tier1_targets_from_the_split(k):
    for split in ("train", "validation"):
        tasks = ENV.generate_tasks(n=20, seed=3, difficulty=f"tier1x{k}", split=split)
        graph = graph_of(tasks[0])
        pool = set(split_items(graph)[split][1])
        for t in tasks:
            targets = t.data["targets"]
            assert len(targets) == k and set(targets) <= pool, t.task_id
            assert all(graph.tier[i] == 1 and 1 <= c <= 3 for i, c in targets.items())
            ENV.validate_task(t)  # craftable from the starting inventory
        assert len({repr(sorted(t.data["targets"].items())) for t in tasks}) == 20  # no repeated task
    again = ENV.generate_tasks(n=20, seed=3, difficulty=f"tier1x{k}", split="validation")
    assert [t.data for t in again] == [t.data for t in tasks]


def test_unknown_tier1x_size_is_refused():
    with pytest.raises(ValueError, match="tier1x13"):
        ENV.generate_tasks(n=1, seed=0, difficulty="tier1x13")


@pytest.mark.parametrize("parallel", [0.0, 1.0])
async def test_expert_launches_one_subagent_per_target_and_checks(parallel):
    for task in ENV.generate_tasks(n=4, seed=7, difficulty="tier1x3"):
        ep = ENV.new_episode(task)
        rt = FakeRuntime(ENV, ep, TextCraftExpert(seed=1, parallel_prob=parallel, split_targets_min=2,
                                                  max_depth=1, child_steps=6), max_depth=1)
        root = await rt.run(task)
        kids = [n for n in rt.nodes if n.depth == 1]
        assert [dict(n.goal_args["targets"]) for n in kids] == [{t: c} for t, c in task.data["targets"].items()]
        assert [ENV.verify(ep, n) for n in rt.nodes] == [1.0] * 4
        root_code = root.messages[1]["content"]
        assert ("asyncio.gather" in root_code) == bool(parallel)
        assert "get_info(" not in root.messages[1]["content"].split("start =")[0]  # nothing read before launching
        assert "ALL-TARGETS-OK" in root.messages[2]["content"]  # the parent checked the inventory
        assert "finish(" in root.messages[-1]["content"]


async def test_expert_without_split_crafts_all_targets_itself():
    task = ENV.generate_tasks(n=1, seed=7, difficulty="tier1x3")[0]
    ep = ENV.new_episode(task)
    rt = FakeRuntime(ENV, ep, TextCraftExpert(seed=1, max_depth=1), max_depth=1)
    root = await rt.run(task)
    assert len(rt.nodes) == 1 and ENV.verify(ep, root) == 1.0


async def test_expert_repairs_when_a_subagent_fails():
    task = ENV.generate_tasks(n=1, seed=7, difficulty="tier1x2")[0]

    ep = ENV.new_episode(task)
    rt = FakeRuntime(ENV, ep, LazyChildren(seed=1, split_targets_min=2, max_depth=1), max_depth=1)
    root = await rt.run(task)
    assert [ENV.verify(ep, n) for n in rt.nodes[1:]] == [0.0, 0.0]
    assert any("# repair" in m["content"] for m in root.messages)
    assert ENV.verify(ep, root) == 1.0


def test_the_window_fits_the_delegating_expert_but_not_one_node():
    """configs/experiment-textcraft-tier1x.yaml's window (1408 tokens, 256 for the reply), SmolLM2's tokenizer,
    the real runtime: at K = 2 (the trained and claimed K) the expert with delegation off runs out of the
    window, the one that delegates solves every task (docs/environments/textcraft.md, "The tier1xK shape")."""
    from rao_core.config import load_config
    from rao_core.paths import default_model_path
    from rao_core.runtime import RuntimeConfig, load_tokenizer
    from rao_core.tree import EndReason
    from rao_core.warmstart import DemoConfig
    from scripts.shape_fit import arm_row

    if not (default_model_path() / "tokenizer.json").exists():
        pytest.skip("SmolLM2 not prepared (make setup)")
    cfg = load_config(Path(__file__).parents[2] / "configs" / "experiment-textcraft-tier1x.yaml")
    assert cfg.tasks.difficulties == ["tier1x2"] and cfg.eval.difficulties[0] == "tier1x2"  # trained, claimed K
    assert (cfg.runtime.context_window, cfg.runtime.max_new_tokens) == (1408, 256)
    tok = load_tokenizer(str(default_model_path()))
    tasks = ENV.generate_tasks(n=3, seed=0, difficulty="tier1x2")
    demo = DemoConfig(split_targets_min=2, suboptimal_prob=0.0)
    rows = {}
    for arm in ("single", "recursive"):
        rc = RuntimeConfig(context_window=cfg.runtime.context_window, max_new_tokens=cfg.runtime.max_new_tokens,
                           max_depth=1, delegation=arm == "recursive",
                           max_steps_per_node=40 if arm == "single" else 6,
                           sandbox="bwrap" if shutil.which("bwrap") else "none")
        rows[arm] = asyncio.run(arm_row(ENV, tasks, tok, rc, demo))
    assert rows["single"]["ok"] == 0 and rows["single"]["ends"] == {EndReason.CONTEXT_OVERFLOW.value: 3}
    assert rows["recursive"]["ok"] == 3 and rows["recursive"]["nodes"] == 3.0
