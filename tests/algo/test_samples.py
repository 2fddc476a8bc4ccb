"""build_samples: Eqs. (1), (3), (4), (5) over a batch of trees, checked by hand and by a naive loop."""

import math

import pytest

from rao_core.advantages import depth_weights
from rao_core.rewards import assign_rewards, local_node_reward
from rao_core.samples import SampleBatch, build_samples, read_samples, write_samples
from rao_core.tree import Node
from tests.algo.helpers import node, tree, wide_tree


def by_id(batch: SampleBatch):
    return {(s.tree_id, s.node_id): s for s in batch.samples}


def test_one_group_of_two_trees():
    # tree A: root s=1, child s=1 -> R(root) = 1 + 0.5 * 1 = 1.5, R(child) = 1
    # tree B: root s=0 (leaf)      -> R(root) = 0
    # b_A = r_B = 0, b_B = r_A = 1.5
    # A(A.root) = 1.5 - 0 = 1.5; A(A.child) = 1 - 0 = 1; A(B.root) = 0 - 1.5 = -1.5
    # depths kept: 0, 1, 0 -> N = 3, K = 2, alpha = 1.5: w_0 = 1.5/2 = 0.75, w_1 = 1.5/1 = 1.5
    ta = tree("A", "g", [node("r", None, 0, 1.0), node("c", "r", 1, 1.0)])
    tb = tree("B", "g", [node("r", None, 0, 0.0)])
    batch = build_samples([ta, tb], lam=0.5)
    s = by_id(batch)
    assert len(batch) == 3
    assert s["A", "r"].reward == pytest.approx(1.5) and s["A", "r"].baseline == pytest.approx(0.0)
    assert s["A", "r"].advantage == pytest.approx(1.5)
    assert s["A", "c"].advantage == pytest.approx(1.0)
    assert s["B", "r"].advantage == pytest.approx(-1.5) and s["B", "r"].baseline == pytest.approx(1.5)
    assert [s["A", "r"].weight, s["A", "c"].weight, s["B", "r"].weight] == pytest.approx([0.75, 1.5, 0.75])
    assert s["A", "c"].depth == 1 and s["A", "c"].group_id == "g"
    # token data copied as is
    assert s["A", "c"].token_ids == ta.node("c").token_ids
    assert s["A", "c"].assistant_mask == [0, 0, 1, 1] and s["A", "c"].behaviour_logprobs == [0, 0, -0.5, -0.5]
    assert batch.stats.num_samples == 3 and batch.stats.dropped_nan_nodes == 0
    assert ta.node("r").reward is None  # input not modified
    assert batch.stats.num_signal_samples == 3 and batch.stats.num_signal_groups == 1


def test_signal_counts_groups_whose_roots_differ():
    same = [tree("A", "g1", [node("r", None, 0, 1.0)]), tree("B", "g1", [node("r", None, 0, 1.0)])]
    mixed = [tree("C", "g2", [node("r", None, 0, 1.0)]), tree("D", "g2", [node("r", None, 0, 0.0)])]
    st = build_samples(same + mixed, lam=0.5).stats
    assert (st.num_samples, st.num_signal_samples, st.num_groups, st.num_signal_groups) == (4, 2, 2, 1)


def test_group_with_nan_root():
    # roots: A s=1, B s=NaN, C s=0 (lam irrelevant: leaves). B is dropped with all its nodes,
    # b_A = r_C = 0, b_C = r_A = 1 -> A(A) = 1, A(C) = -1
    ta = tree("A", "g", [node("r", None, 0, 1.0)])
    tb = tree("B", "g", [node("r", None, 0, math.nan), node("c", "r", 1, 1.0)])
    tc = tree("C", "g", [node("r", None, 0, 0.0)])
    batch = build_samples([ta, tb, tc], lam=0.1)
    s = by_id(batch)
    assert set(s) == {("A", "r"), ("C", "r")}
    assert s["A", "r"].advantage == pytest.approx(1.0) and s["C", "r"].advantage == pytest.approx(-1.0)
    assert batch.stats.dropped_nan_root_trees == 1 and batch.stats.dropped_nodes_of_dropped_trees == 2
    assert batch.stats.dropped_small_groups == 0


def test_small_groups_dropped_and_counted():
    # group g1 has 2 trees but one NaN root -> 1 scored root < 2 -> whole group dropped
    # group g2 has a single tree (G = 1) -> dropped; group g3 is fine
    g1 = [tree("A", "g1", [node("r", None, 0, 1.0)]), tree("B", "g1", [node("r", None, 0, None)])]
    g2 = [tree("C", "g2", [node("r", None, 0, 1.0), node("k", "r", 1, 1.0)])]
    g3 = [tree("D", "g3", [node("r", None, 0, 1.0)]), tree("E", "g3", [node("r", None, 0, 0.5)])]
    batch = build_samples(g1 + g2 + g3, lam=0.0)
    assert {(x.tree_id) for x in batch.samples} == {"D", "E"}
    st = batch.stats
    assert st.dropped_small_groups == 2 and st.dropped_nan_root_trees == 1
    assert st.dropped_nodes_of_dropped_trees == 4 and st.num_groups == 3 and st.num_trees == 5


def test_tree_of_only_a_root():
    # two root-only trees: s = 0.75, 0.25; b = 0.25, 0.75; A = +0.5, -0.5; one depth -> w = 1
    batch = build_samples([tree("A", "g", [node("r", None, 0, 0.75)]),
                          tree("B", "g", [node("r", None, 0, 0.25)])], lam=0.5)
    assert [x.advantage for x in batch.samples] == pytest.approx([0.5, -0.5])
    assert [x.weight for x in batch.samples] == [1.0, 1.0]


def test_wide_tree_weights_7_175_04375():
    # two trees of 1 + 4 + 16 nodes would give N = 42, alpha = 14 and w = 14/2, 14/8, 14/32 = 7, 1.75, 0.4375
    batch = build_samples([wide_tree("A", "g", 1.0), wide_tree("B", "g", 0.0)], lam=0.5)
    w = {d: {x.weight for x in batch.samples if x.depth == d} for d in (0, 1, 2)}
    assert w == {0: {7.0}, 1: {1.75}, 2: {0.4375}}
    assert sum(x.weight for x in batch.samples) == pytest.approx(42)
    # tree A: R(root) = 1 + 0.5 * 1 = 1.5, R(child) = 1.5, R(grandchild) = 1; tree B: all 0; b_A = 0, b_B = 1.5
    s = by_id(batch)
    assert s["A", "r"].advantage == pytest.approx(1.5) and s["A", "c0g0"].advantage == pytest.approx(1.0)
    assert s["B", "c2"].advantage == pytest.approx(-1.5)
    assert batch.stats.samples_per_depth == {0: 2, 1: 8, 2: 32}
    # per depth: |A| is 1.5 at depths 0 and 1; depth 2: 16 x 1.0 (tree A) and 16 x 1.5 (tree B)
    assert batch.stats.signal_samples_per_depth == {0: 2, 1: 8, 2: 32}
    assert batch.stats.mean_abs_advantage_per_depth == pytest.approx({0: 1.5, 1: 1.5, 2: 1.25})
    # signed: depth 2 is 16 x +1.0 (A's solved grandchildren) and 16 x -1.5 (B's failed ones)
    assert batch.stats.mean_advantage_per_depth == pytest.approx({0: 0.0, 1: 0.0, 2: -0.25})
    assert batch.stats.mean_advantage_solved_per_depth == pytest.approx({0: 1.5, 1: 1.5, 2: 1.0})
    from rao_core.metrics import sample_depth_metrics

    m = sample_depth_metrics(batch.stats.model_dump(mode="json"))  # JSON: the depths became strings
    assert m["samples/depth_2/samples"] == 32 and m["samples/depth_2/mean_abs_advantage"] == pytest.approx(1.25)
    assert m["samples/depth_2/mean_advantage_solved"] == pytest.approx(1.0)
    assert m["samples/depth_1/assistant_tokens"] == batch.stats.assistant_tokens_per_depth[1] > 0


def test_nan_nodes_and_empty_nodes_dropped_and_counted():
    # tree A: root s=1, child a s=NaN (dropped), child b s=1 but no assistant tokens (dropped)
    ta = tree("A", "g", [node("r", None, 0, 1.0), node("a", "r", 1, math.nan), node("b", "r", 1, 1.0, n_gen=0)])
    tb = tree("B", "g", [node("r", None, 0, 0.0)])
    batch = build_samples([ta, tb], lam=1.0)
    # R(A.r) = 1 + 1.0 * mean(valid children s = [1]) = 2; b_A = 0 -> A = 2; b_B = 2 -> A(B.r) = -2
    assert {(x.tree_id, x.node_id): x.advantage for x in batch.samples} == pytest.approx({("A", "r"): 2.0, ("B", "r"): -2.0})
    assert batch.stats.dropped_nan_nodes == 1 and batch.stats.dropped_empty_nodes == 1


def test_uses_stored_rewards_when_lam_none():
    ta = assign_rewards(tree("A", "g", [node("r", None, 0, 1.0), node("c", "r", 1, 0.0)]), lam=0.5)
    tb = assign_rewards(tree("B", "g", [node("r", None, 0, 0.5)]), lam=0.5)
    assert [x.advantage for x in build_samples([ta, tb]).samples] == pytest.approx([0.5, -0.5, -0.5])
    with pytest.raises(ValueError, match="no reward"):
        build_samples([tree("C", "h", [node("r", None, 0, 1.0)]), tree("D", "h", [node("r", None, 0, 1.0)])])


def test_bad_records_raise():
    bad = tree("A", "g", [node("r", None, 0, 1.0)])
    bad.nodes[0].behaviour_logprobs.pop()
    with pytest.raises(ValueError, match="node r: token_ids .* differ in length"):
        build_samples([bad, tree("B", "g", [node("r", None, 0, 0.0)])], lam=0.0)
    with pytest.raises(ValueError, match="empty group_id"):
        build_samples([tree("A", "", [node("r", None, 0, 1.0)])], lam=0.0)
    with pytest.raises(ValueError, match="appears twice"):
        build_samples([tree("A", "g", [node("r", None, 0, 1.0)]), tree("A", "g", [node("r", None, 0, 1.0)])], lam=0.0)
    with pytest.raises(ValueError, match="unknown advantage estimator 'median'"):  # never taken for a small group
        build_samples(_two_trees(), lam=0.0, estimator="median")


def test_batched_matches_naive_loop():
    # a mixed batch: 2 groups, NaNs, different shapes; recompute everything with plain loops
    import random

    rng = random.Random(0)
    trees = []
    for g in range(2):
        for k in range(3):
            nodes = [node("r", None, 0, rng.choice([0.0, 0.5, 1.0]))]
            for i in range(rng.randint(0, 3)):
                nodes.append(node(f"c{i}", "r", 1, rng.choice([0.0, 1.0, math.nan])))
                for j in range(rng.randint(0, 2)):
                    nodes.append(node(f"c{i}g{j}", f"c{i}", 2, rng.choice([0.25, 1.0])))
            trees.append(tree(f"t{g}{k}", f"g{g}", nodes))
    lam = 0.3
    batch = build_samples(trees, lam=lam)
    naive = []
    for t in trees:
        def R(n):
            return local_node_reward(n.success, [m.success for m in t.nodes if m.parent_id == n.node_id], lam)
        others = [o for o in trees if o.group_id == t.group_id and o.tree_id != t.tree_id]
        b = sum(R_root(o, lam) for o in others) / len(others)
        for n in t.walk():
            if n.success is None or math.isnan(n.success):
                continue
            naive.append((t.tree_id, n.node_id, n.depth, R(n) - b))
    w = depth_weights([d for *_, d, _ in naive])
    assert [(s.tree_id, s.node_id) for s in batch.samples] == [(a, b) for a, b, _, _ in naive]
    assert [s.advantage for s in batch.samples] == pytest.approx([a for *_, a in naive])
    assert [s.weight for s in batch.samples] == pytest.approx(w)


def R_root(t, lam):
    return local_node_reward(t.root.success, [m.success for m in t.nodes if m.parent_id == t.root_id], lam)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_write_read_roundtrip(tmp_path, suffix):
    batch = build_samples([wide_tree("A", "g", 1.0), tree("B", "g", [node("r", None, 0, 0.0)])], lam=0.5)
    p = write_samples(tmp_path / f"s{suffix}", batch)
    back = read_samples(p)
    assert back.samples == batch.samples
    assert back.stats.num_samples == batch.stats.num_samples
    if suffix == ".parquet":
        assert back.stats == batch.stats
    assert [f.name for f in tmp_path.iterdir()] == [f"s{suffix}"]  # no temp file left
    with pytest.raises(ValueError, match="unknown samples format"):
        write_samples(tmp_path / "s.csv", batch)


def _two_trees():
    # tree A: root s=1 with child s=1; tree B: root s=0 (leaf). Depths kept 0, 1, 0.
    return [tree("A", "g", [node("r", None, 0, 1.0), node("c", "r", 1, 1.0)]), tree("B", "g", [node("r", None, 0, 0.0)])]


@pytest.mark.parametrize("estimator, advantages", [
    # lam = 0.5: R(A.r) = 1 + 0.5 * 1 = 1.5, R(A.c) = 1, R(B.r) = 0
    ("leave_one_out", [1.5 - 0.0, 1.0 - 0.0, 0.0 - 1.5]),  # b_A = r_B = 0, b_B = r_A = 1.5
    ("group_mean", [1.5 - 0.75, 1.0 - 0.75, 0.0 - 0.75]),  # b = (1.5 + 0) / 2 = 0.75 for both trees
    # grpo: mean 0.75, std = sqrt((0.75^2 + 0.75^2) / (2 - 1)) = sqrt(1.125) = 1.06066
    ("grpo", [0.75 / math.sqrt(1.125), 0.25 / math.sqrt(1.125), -0.75 / math.sqrt(1.125)]),
    ("none", [1.5, 1.0, 0.0]),  # A = R
])
def test_estimator_from_config(estimator, advantages):
    batch = build_samples(_two_trees(), lam=0.5, estimator=estimator)
    assert [(s.tree_id, s.node_id) for s in batch.samples] == [("A", "r"), ("A", "c"), ("B", "r")]
    assert [s.advantage for s in batch.samples] == pytest.approx(advantages)
    assert [s.weight for s in batch.samples] == pytest.approx([0.75, 1.5, 0.75])  # Eq. (5) whatever the estimator


def test_ablation_lambda_zero():
    # lam = 0: no delegation bonus, R = s: R(A.r) = 1, R(A.c) = 1, R(B.r) = 0; b_A = 0, b_B = 1
    batch = build_samples(_two_trees(), lam=0.0)
    assert [s.reward for s in batch.samples] == [1.0, 1.0, 0.0]
    assert [s.advantage for s in batch.samples] == pytest.approx([1.0, 1.0, -1.0])


def test_ablation_no_depth_weights():
    # depth_weighting off: every w_d = 1 instead of 0.75, 1.5, 0.75; advantages unchanged (1.5, 1, -1.5)
    batch = build_samples(_two_trees(), lam=0.5, depth_weighting=False)
    assert [s.weight for s in batch.samples] == [1.0, 1.0, 1.0]
    assert [s.advantage for s in batch.samples] == pytest.approx([1.5, 1.0, -1.5])


def test_ablations_are_config_values():
    from rao_core.config import load_config
    from rao_core.samples import AlgoSettings

    cfg = load_config(None, ["algo.lam=0", "algo.advantage=grpo", "algo.depth_weights=false",
                             "judge.child_source=root_proxy"])
    assert (cfg.algo.lam, cfg.algo.advantage, cfg.algo.depth_weights) == (0.0, "grpo", False)
    assert cfg.judge.child_source == "root_proxy"
    assert AlgoSettings().advantage == "leave_one_out" and AlgoSettings().depth_weights is True
    with pytest.raises(ValueError, match="'leave_one_out', 'group_mean', 'grpo' or 'none'"):
        AlgoSettings(advantage="median")


# ------------------------------------------------------------- the authors' filters ----------------------
def _turned_node(node_id: str, parent: str | None, depth: int, success: float, statuses: list[str]) -> Node:
    """A node with one turn per status: turn k's prompt is 3 + 4k ids long and it generates 2 ids (1 prompt id
    between turns), so turn k's completion sits at [3 + 4k, 5 + 4k) of the trajectory."""
    from rao_core.tree import CellStatus, EndReason, Turn

    turns, ids = [], list(range(1, 4))
    for k, st in enumerate(statuses):
        gen = [100 + 2 * k, 101 + 2 * k]
        turns.append(Turn(prompt_token_ids=list(ids), completion_token_ids=gen, completion_logprobs=[-0.1, -0.2],
                          text="", cell_status=CellStatus(st)))
        ids = ids + gen + [7, 8]
    last = turns[-1]
    traj = last.prompt_token_ids + last.completion_token_ids
    mask = [0] * len(traj)
    lps = [0.0] * len(traj)
    for t in turns:
        s = len(t.prompt_token_ids)
        mask[s:s + 2], lps[s:s + 2] = [1, 1], [-0.1, -0.2]
    return Node(node_id=node_id, parent_id=parent, depth=depth, goal=node_id, token_ids=traj, assistant_mask=mask,
                behaviour_logprobs=lps, turns=turns, end_reason=EndReason.FINISHED, success=success)


def test_filter_errors_masks_error_turns_of_positive_advantage_samples_only():
    ok = _turned_node("r", None, 0, 1.0, ["error", "ok", "error"])
    bad = _turned_node("r", None, 0, 0.0, ["error", "ok"])
    trees = [tree("a", "g", [ok]), tree("b", "g", [bad])]
    plain = build_samples(trees, 0.5)
    filt = build_samples(trees, 0.5, filter_errors=True)
    a_plain, a_filt = plain.samples[0], filt.samples[0]
    assert a_filt.advantage == 1.0 and a_plain.num_assistant_tokens == 6
    # turns 0 and 2 raised: their completions at [3, 5) and [11, 13) lose the mask; turn 1's at [7, 9) stays
    assert [j for j, m in enumerate(a_filt.assistant_mask) if m] == [7, 8]
    assert a_filt.behaviour_logprobs[3] == 0.0 and a_filt.behaviour_logprobs[7] == -0.1
    assert filt.stats.masked_error_tokens == 4
    # the failed tree (A = -1) keeps its error turns: the authors suppress positive credit only
    assert filt.samples[1].assistant_mask == plain.samples[1].assistant_mask
    # a positive sample made only of error turns is dropped and counted
    only = build_samples([tree("a", "g", [_turned_node("r", None, 0, 1.0, ["error"])]),
                          tree("b", "g", [_turned_node("r", None, 0, 0.0, ["ok"])])], 0.5, filter_errors=True)
    assert only.stats.dropped_error_only_nodes == 1 and [s.tree_id for s in only.samples] == ["b"]


def test_filter_zero_variance_groups_drops_uniform_groups_before_the_depth_weights():
    # group g: both roots succeed, tree a's children s = 1 and 0 -> R differ (lam 0: 1, 1, 1, 0): kept
    a = tree("a", "g", [node("r", None, 0, 1.0), node("c0", "r", 1, 1.0), node("c1", "r", 1, 0.0)])
    b = tree("b", "g", [node("r", None, 0, 1.0)])
    # group h: every node of both trees R = 1 -> every A = 0: dropped
    c = tree("c", "h", [node("r", None, 0, 1.0), node("c0", "r", 1, 1.0)])
    d = tree("d", "h", [node("r", None, 0, 1.0), node("c0", "r", 1, 1.0)])
    plain = build_samples([a, b, c, d], 0.0)
    filt = build_samples([a, b, c, d], 0.0, filter_zero_variance_groups=True)
    assert {s.group_id for s in filt.samples} == {"g"} and len(plain.samples) == 8 and len(filt.samples) == 4
    assert (filt.stats.dropped_uniform_groups, filt.stats.dropped_nodes_of_uniform_groups) == (1, 4)
    # Eq. 5 over the 4 samples left: N = 4, K = 2; depth 0 has 2 -> 1.0, depth 1 has 2 -> 1.0
    assert [s.weight for s in filt.samples] == [1.0, 1.0, 1.0, 1.0]
    # without the filter: N = 8, K = 2, 4 per depth -> 1.0 each too; the normaliser differs, not the weights
    assert filt.stats.num_samples == 4 and plain.stats.num_samples == 8
    # a group with signal at depth 1 only (roots equal) is kept: its children's advantages are not all 0
    assert [s.advantage for s in filt.samples] == [0.0, 0.0, -1.0, 0.0]


def test_a_solved_child_is_pushed_down_when_every_root_earned_the_bonus():
    """Eq. 4 as the paper writes it: every node of tree g shares the root baseline b_g. When the roots of a
    group all succeed and earn the delegation bonus (R = 1 + lam), a solved child (R = 1) has A = -lam: its
    tokens are trained down although it succeeded. Seed 1 of textcraft-nested (docs/experiments/textcraft-nested.md)
    met this at a warm start near the ceiling; ``mean_advantage_solved_per_depth`` shows it."""
    trees = [tree(t, "g", [node("r", None, 0, 1.0), node("c", "r", 1, 1.0)]) for t in ("A", "B", "C")]
    batch = build_samples(trees, lam=0.4)
    assert {round(x.advantage, 9) for x in batch.samples if x.depth == 0} == {0.0}
    assert [x.advantage for x in batch.samples if x.depth == 1] == pytest.approx([-0.4] * 3)
    assert batch.stats.mean_advantage_solved_per_depth == pytest.approx({0: 0.0, 1: -0.4})
