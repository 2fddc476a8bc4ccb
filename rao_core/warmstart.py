"""Warm start: supervised fine-tuning (SFT) of the policy on scripted-expert demonstrations.

A small instruct model does not yet know the REPL protocol (one fenced ```python cell per reply, ``finish(...)``,
``await launch_subagent(...)``), so RL from it finds no reward. :func:`build_demonstrations` runs the
environment's scripted expert (``rao_core.policies``) through the REAL runtime, with the RL rollouts' window and
limits; :func:`demo_samples` turns the verified nodes of the trees whose root the verifier accepted into SFT
samples (each node's own assistant tokens as targets), trained with ``TrainerConfig(loss_type="sft")``.
Departures from the paper / project choices: the paper starts RL without a warm start (a 135M model needs one);
the demonstration set is deliberately small; each scripted turn ends with EOS (:class:`_EosTerminated`); expert
settings are drawn per tree (:func:`expert_for_tree`); ``single_agent_fraction`` mixes in single-agent trees.
Docs: docs/concepts.md#warm-start.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rao_core.envs.base import Environment, Task
from rao_core.metrics import overlapping_children
from rao_core.policies.base import Generation, Policy, PolicyRequest
from rao_core.progress import ProgressCallback, StepProgress
from rao_core.runtime import RuntimeConfig, load_tokenizer, oracle_policy, run_tree
from rao_core.samples import Sample, SampleBatch, SampleStats, node_sample, summarise
from rao_core.task_sampling import sample_tasks, split_evenly
from rao_core.tree import ExecutionTree, Node, verifier_value

__all__ = [
    "DemoConfig", "Demonstrations", "WarmStartResult", "build_demonstrations", "child_sample_tree_indices",
    "demo_loss", "demo_samples", "demo_stats", "demo_tasks", "default_sft_trainer_config", "expert_for_tree",
    "run_warm_start", "recommended_runtime_config", "single_agent_tree",
]


class DemoConfig(BaseModel):
    """How the demonstration set of the warm start is built (defaults: the measured CPU recommendation,
    ``docs/results.md`` "Warm start sizing")."""

    model_config = ConfigDict(extra="forbid")

    n_tasks: int = Field(16, ge=1, description="RL tasks to demonstrate, split evenly over `difficulties` "
                         "(the first difficulties get the remainder).")
    difficulties: list[str] = Field(default_factory=lambda: ["easy", "medium"],
                                    description="Task difficulties of the demonstrations (env names).")
    seed: int = Field(0, description="Seed of task generation and of the per-tree expert settings.")
    split: str = Field("train", description="Task split the demonstrations come from.")
    generator_options: dict[str, Any] = Field(default_factory=dict, description="Extra generate_tasks options "
                                              "of the campaign's tasks (`tasks.generator_options`, e.g. "
                                              "TextCraft's `items_per_tier`): demonstrations come from the same "
                                              "generator as the RL pool and the evaluation.")
    rollouts_per_task: int = Field(1, ge=1, description="Demonstration trees per task (each with its own "
                                   "expert settings).")
    parallel_prob: float = Field(0.5, ge=0, le=1, description="Probability that the expert launches 2+ "
                                 "sub-agents with asyncio.gather (else one after another).")
    suboptimal_prob: float = Field(0.1, ge=0, le=1, description="Probability of a valid but longer route "
                                   "(split crafts, an extra inventory check).")
    wording_variety: bool = Field(True, description="Vary the expert's reasoning text between phrasings.")
    delegate_min_depths: list[int] = Field(default_factory=lambda: [2, 3], description="Delegate threshold: "
                                           "each tree draws the smallest crafting depth of an ingredient "
                                           "that the expert hands to a sub-agent from this list.")
    split_targets_min: int = Field(0, ge=0, description="A node that may delegate and has at least this many "
                                   "targets launches one sub-agent per target (the tier1x<K> delegation shape; "
                                   "TextCraftExpert.split_targets_min); 0 = never.")
    recurse: bool = Field(False, description="TextCraft: the expert that recurses (TextCraftExpert.recurse, the "
                          "nest<L> shape): a node that may delegate launches one sub-agent per craftable ingredient "
                          "it lacks, then makes its own craft; at the depth limit it is the plain expert.")
    only_successful_nodes: bool = Field(True, description="Train only on nodes the verifier accepted "
                                        "(verifier >= 1); False keeps every node of a kept tree.")
    child_sample_trees: int | None = Field(None, ge=0, description="Children's nodes become SFT samples in "
                                           "only this many of the kept trees, spread evenly over them "
                                           "(:func:`child_sample_tree_indices`); every kept root still does. "
                                           "None = every tree. A delegating root's trajectory is short (a launch "
                                           "cell, a finish), its children's are long: this buys many root "
                                           "demonstrations (the delegation decision on many unseen goals) for "
                                           "little SFT time.")
    max_concurrent_trees: int = Field(8, ge=1, description="Demonstration trees grown at once.")
    single_agent_fraction: float = Field(0.0, ge=0, le=1, description="Fraction of the demonstration trees "
                                         "grown with delegation disabled (single-agent system prompt, no "
                                         "launch_subagent), so that one warm start serves both the recursive "
                                         "agent and the single-agent baseline. Tree i is single-agent when "
                                         "i mod round(1 / fraction) == round(1 / fraction) - 1.")

    @field_validator("difficulties")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("difficulties must name at least one difficulty (e.g. ['easy', 'medium'])")
        return v

    @field_validator("delegate_min_depths")
    @classmethod
    def _depths(cls, v: list[int]) -> list[int]:
        if not v or any(d < 1 for d in v):
            raise ValueError(f"delegate_min_depths must be a non-empty list of depths >= 1, got {v}")
        return v


def recommended_runtime_config(**overrides: Any) -> RuntimeConfig:
    """The CPU runtime settings the warm start was sized with (``docs/results.md``): 4096-token context
    per agent, 768 new tokens per turn, 10 steps per node, max depth 2. ``overrides`` replace fields."""
    return RuntimeConfig(**{"context_window": 4096, "max_new_tokens": 768, "max_steps_per_node": 10, "max_depth": 2,
                            **overrides})


def default_sft_trainer_config(**overrides: Any):
    """``TrainerConfig`` of the warm start: SFT loss, lr 1e-4 (full weights, AdamW), 2 epochs, 4
    micro-batches of <= 4096 padded tokens per optimizer step, 2 warm-up steps, gradient checkpointing
    (an 8192-token micro-batch of SmolLM2-135M without it peaked at 19.6 GB RSS on CPU and was OOM-killed).
    ``overrides`` replace fields."""
    from rao_core.train import TrainerConfig

    return TrainerConfig(**{"loss_type": "sft", "lr": 1e-4, "epochs": 2, "grad_accum": 4, "micro_batch_tokens": 4096,
                            "warmup_steps": 2, "gradient_checkpointing": True, **overrides})


def demo_tasks(env: Environment, config: DemoConfig) -> list[Task]:
    """The demonstration tasks: ``config.n_tasks`` split over ``config.difficulties`` (the first get the
    remainder), drawn by :func:`rao_core.task_sampling.sample_tasks` from stream ``"demos"`` of
    ``config.split`` with ``config.seed`` and ``config.generator_options``.

    Raises NotImplementedError for an environment without a task generator.
    """
    return sample_tasks(env, seed=config.seed, stream="demos", difficulties=config.difficulties,
                        n=split_evenly(config.n_tasks, len(config.difficulties)), split=config.split,
                        **config.generator_options)


class _EosTerminated(Policy):
    """Wraps a text-only scripted policy: generations come back as ``ids(text) + [eos]``, what a served model
    returns when it stops at EOS. Without it the runtime would tokenise scripted text without an end-of-turn
    token and the model would never learn to stop after its cell; the EOS is an assistant token and is trained
    on. Log-probs of scripted tokens are 0.0 (ignored by SFT)."""

    def __init__(self, inner: Policy, tokenizer: Any):
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self.tok = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        if not isinstance(eos, int):
            raise ValueError("the tokenizer has no eos_token_id; cannot end scripted turns")
        self.eos_id = eos

    async def generate(self, request: PolicyRequest) -> Generation:
        gen = await self.inner.generate(request)
        if gen.token_ids is not None:
            return gen
        ids = list(self.tok(gen.text, add_special_tokens=False)["input_ids"]) + [self.eos_id]
        return Generation(text=gen.text, token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


def expert_for_tree(env_name: str, config: DemoConfig, index: int, runtime_config: RuntimeConfig) -> Policy:
    """The scripted expert of demonstration tree ``index`` (seeded draw of variety settings).

    TextCraft-Synth: a ``TextCraftExpert`` with ``seed = config.seed * 100003 + index``, the config's
    parallel/sub-optimal probabilities, wording variety, ``split_targets_min`` and ``recurse``, a delegate threshold drawn
    from ``config.delegate_min_depths``, and the runtime's max depth. Other environments: their oracle
    policy (``rao_core.runtime.oracle_policy``) as is.
    """
    if env_name != "textcraft-synth":
        return oracle_policy(env_name)
    from rao_core.policies.textcraft_expert import TextCraftExpert

    rng = random.Random(f"demo|{config.seed}|{index}")
    return TextCraftExpert(seed=config.seed * 100003 + index, parallel_prob=config.parallel_prob,
                           suboptimal_prob=config.suboptimal_prob, wording_variety=config.wording_variety,
                           delegate_min_depth=rng.choice(config.delegate_min_depths),
                           max_depth=runtime_config.effective_max_depth,
                           max_children=runtime_config.max_children_per_node,
                           child_steps=runtime_config.max_steps_per_node,
                           split_targets_min=config.split_targets_min, recurse=config.recurse)


def single_agent_tree(config: DemoConfig, index: int) -> bool:
    """Whether demonstration tree ``index`` is grown with delegation disabled (``config.single_agent_fraction``:
    every k-th tree, k = round(1 / fraction), counting from tree k - 1; 0 = never, 1 = always)."""
    f = config.single_agent_fraction
    if f <= 0:
        return False
    k = max(1, round(1 / f))
    return index % k == k - 1


class Demonstrations(list):
    """``list[ExecutionTree]`` of kept demonstrations, plus what was attempted and rejected.

    Attributes: ``attempted`` (trees grown), ``rejected`` (root not verified successful), ``wall_s``.
    """

    attempted: int = 0
    rejected: int = 0
    wall_s: float = 0.0


async def build_demonstrations(env: Environment, tasks: Sequence[Task], config: DemoConfig, *, tokenizer: Any,
                               runtime_config: RuntimeConfig,
                               on_progress: ProgressCallback | None = None) -> Demonstrations:
    """Grow ``config.rollouts_per_task`` expert trees per task through the real runtime; keep verified ones.

    Args:
        env: the environment (its exact verifier scores the roots).
        tasks: RL tasks (e.g. :func:`demo_tasks`).
        config: :class:`DemoConfig` (variety settings, concurrency).
        tokenizer: HF tokenizer or checkpoint folder of the model that will be fine-tuned (its chat
            template builds the token ids, so the samples are in that model's ids).
        runtime_config: the runtime limits (use the RL rollouts' settings, sandbox on).
        on_progress: called with ``(trees finished, trees planned)`` after each tree; a rich bar
            "demonstration trees" is drawn while they grow when stdout is a terminal (:class:`StepProgress`).

    Returns:
        :class:`Demonstrations` (a list of trees, task order, rollout index order) holding only trees
        whose root has ``verifier >= 1``; ``rejected`` counts the others.
        Each kept tree has ``meta["demo_expert"]`` with the expert's settings.

    Raises:
        ValueError: no tasks; a tokenizer without EOS.
    """
    if not tasks:
        raise ValueError("build_demonstrations needs at least one task")
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    sem = asyncio.Semaphore(config.max_concurrent_trees)
    t0 = time.perf_counter()

    single_rc = runtime_config.model_copy(update={"delegation": False})

    async def one(task: Task, g: int, index: int, single: bool) -> ExecutionTree:
        rc = single_rc if single else runtime_config
        expert = expert_for_tree(env.name, config, index, rc)
        async with sem:
            tree = await run_tree(env, task, _EosTerminated(expert, tok), rc, tokenizer=tok,
                                  group_id=task.task_id, rollout_index=g)
        bar.advance()
        tree.meta["demo_single_agent"] = single
        tree.meta["demo_expert"] = {k: v for k, v in vars(expert).items() if isinstance(v, (int, float, bool, str))}
        return tree

    jobs = [(t, g) for t in tasks for g in range(config.rollouts_per_task)]
    with StepProgress("demonstration trees", len(jobs), on_progress=on_progress) as bar:
        trees = await asyncio.gather(*(one(t, g, i, single_agent_tree(config, i)) for i, (t, g) in enumerate(jobs)))
    out = Demonstrations(t for t in trees if (verifier_value(t.root) or 0.0) >= 1.0)
    out.attempted, out.rejected, out.wall_s = len(trees), len(trees) - len(out), time.perf_counter() - t0
    return out


def child_sample_tree_indices(n_trees: int, child_sample_trees: int | None) -> set[int]:
    """Indices of the trees (of ``n_trees``) whose children's nodes become SFT samples: all when
    ``child_sample_trees`` is None or >= ``n_trees``, else ``child_sample_trees`` indices spread evenly
    (``floor(j * n_trees / child_sample_trees)``, j = 0..child_sample_trees-1), so that every difficulty
    keeps some."""
    if child_sample_trees is None or child_sample_trees >= n_trees:
        return set(range(n_trees))
    return {j * n_trees // child_sample_trees for j in range(child_sample_trees)}


def demo_samples(trees: Sequence[ExecutionTree], *, only_successful_nodes: bool = True,
                 child_sample_trees: int | None = None) -> SampleBatch:
    """One SFT sample per node of the demonstration trees (children only of the trees picked by
    :func:`child_sample_tree_indices` with ``child_sample_trees``; every root).

    Each sample is the node's trajectory exactly as recorded (``token_ids`` [T], ``assistant_mask`` [T]:
    1 on the node's own generated ids, 0 on system prompt, goal and observations;
    ``behaviour_logprobs`` [T]). ``success`` = the node's verifier value (0.0 when None), ``reward`` =
    ``success``, ``baseline`` 0, ``advantage`` 1.0, ``weight`` 1.0 (``loss_type='sft'`` ignores them).

    Nodes without assistant tokens are dropped (``stats.dropped_empty_nodes``), and with
    ``only_successful_nodes`` nodes the verifier did not accept (``stats.dropped_nan_nodes`` is reused
    for that count). Raises ValueError for a node whose ids, mask and log-probs differ in length.
    """
    stats = SampleStats(num_trees=len(trees), num_groups=len({t.group_id or t.tree_id for t in trees}),
                        num_nodes=sum(len(t.nodes) for t in trees))
    out: list[Sample] = []
    with_children = child_sample_tree_indices(len(trees), child_sample_trees)
    for i, t in enumerate(trees):
        for n in t.walk():
            if n.depth > 0 and i not in with_children:
                stats.dropped_child_nodes += 1
                continue
            s = verifier_value(n) or 0.0
            sample = node_sample(t, n, success=s, reward=s, baseline=0.0, advantage=1.0, weight=1.0)
            if sample.num_assistant_tokens == 0:
                stats.dropped_empty_nodes += 1
            elif only_successful_nodes and s < 1.0:
                stats.dropped_nan_nodes += 1
            else:
                out.append(sample)
    return SampleBatch(samples=out, stats=summarise(out, stats))


def _launch_kind(tree: ExecutionTree, node: Node) -> str | None:
    """'parallel' when two of ``node``'s children ran at overlapping times, 'sequential' when it has
    children that never overlapped, None without children."""
    over, kids = overlapping_children(tree, node.node_id)
    if not kids:
        return None
    return "parallel" if over else "sequential"


def demo_stats(trees: Sequence[ExecutionTree]) -> dict[str, Any]:
    """Summary of a demonstration set.

    Keys: ``trees``, ``nodes``, ``depth_histogram`` ({node depth: nodes}), ``tree_depth_histogram``
    ({tree depth: trees}), ``mean_assistant_tokens`` (per node), ``assistant_tokens``, ``tokens`` (all
    trajectory tokens), ``turns``, ``parallel_launches`` / ``sequential_launches`` (nodes whose
    children overlapped in time / never did), ``delegating_trees``, ``rejected`` (when ``trees`` is a
    :class:`Demonstrations`).
    """
    nodes = [n for t in trees for n in t.nodes]
    kinds = Counter(k for t in trees for n in t.nodes if (k := _launch_kind(t, n)))
    asst = sum(n.num_completion_tokens for n in nodes)
    out: dict[str, Any] = {
        "trees": len(trees), "nodes": len(nodes),
        "depth_histogram": dict(sorted(Counter(n.depth for n in nodes).items())),
        "tree_depth_histogram": dict(sorted(Counter(t.depth for t in trees).items())),
        "assistant_tokens": asst, "tokens": sum(len(n.token_ids) for n in nodes),
        "mean_assistant_tokens": asst / len(nodes) if nodes else 0.0,
        "turns": sum(len(n.turns) for n in nodes),
        "parallel_launches": kinds.get("parallel", 0), "sequential_launches": kinds.get("sequential", 0),
        "delegating_trees": sum(1 for t in trees if len(t.nodes) > 1),
        "single_agent_trees": sum(1 for t in trees if t.meta.get("demo_single_agent")),
    }
    if isinstance(trees, Demonstrations):
        out["attempted"], out["rejected"] = trees.attempted, trees.rejected
    return out


def demo_loss(model_path: str | Path, samples: SampleBatch | Sequence[Sample], *, micro_batch_tokens: int = 8192
              ) -> float:
    """Token-mean SFT loss (nats per assistant token) of the checkpoint at ``model_path`` on ``samples``.

    Uses the trainer's own code (``collate``, ``token_logprobs``, ``policy_loss(loss_type='sft')``) in
    eval mode without gradients, fp32 on CPU (or the first GPU). Raises ValueError for no samples.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from rao_core.train.data import collate, make_micro_batches
    from rao_core.train.loss import policy_loss, token_logprobs

    rows = list(samples.samples if isinstance(samples, SampleBatch) else samples)
    if not rows:
        raise ValueError("demo_loss needs at least one sample")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).to(dev).eval()
    tok = load_tokenizer(str(model_path))
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    total, tokens = 0.0, 0.0
    with torch.no_grad():
        for mb in make_micro_batches([len(s.token_ids) for s in rows], micro_batch_tokens=micro_batch_tokens):
            b = collate([rows[i] for i in mb.indices], pad, dev)
            lp = token_logprobs(model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits,
                                b["input_ids"])
            _, st = policy_loss(lp, b["behaviour_logprobs"], b["loss_mask"], b["coef"], loss_type="sft")
            total += float(st.loss_sum)
            tokens += float(st.tokens)
    return total / max(tokens, 1.0)


class WarmStartResult(BaseModel):
    """What :func:`run_warm_start` produced."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    checkpoint: Path
    stats: dict[str, Any]  # demo_stats(...) plus sample counts
    train_metrics: list[dict[str, float]] = Field(default_factory=list)
    demo_wall_s: float = 0.0
    sft_wall_s: float = 0.0
    num_samples: int = 0
    num_assistant_tokens: int = 0
    num_tokens: int = 0


def run_warm_start(env: Environment | str, model_path: str | Path, out_dir: str | Path, *,
                   demo_config: DemoConfig | None = None, trainer_config: Any = None,
                   runtime_config: RuntimeConfig | None = None, trees_path: str | Path | None = None,
                   tasks_path: str | Path | None = None, samples_path: str | Path | None = None,
                   on_step: Any = None, on_demo_progress: ProgressCallback | None = None,
                   on_train_progress: ProgressCallback | None = None,
                   on_status: Callable[[str], None] | None = None) -> WarmStartResult:
    """Build demonstrations, then SFT ``model_path`` on them; the checkpoint goes to ``out_dir``.

    The one warm start of the project: ``rao sft``, the campaign's ``warm_start`` task and the sizing
    script all call it. Synchronous (runs its own event loop; call it from a worker thread inside async
    code). ``trainer_config`` defaults to :func:`default_sft_trainer_config`; its ``loss_type`` must be
    ``'sft'``. ``runtime_config`` defaults to :func:`recommended_runtime_config`. ``tasks_path``,
    ``trees_path``, ``samples_path``: also write the demonstration tasks, the kept trees and the SFT
    samples there (JSON lines). ``on_step``: each SFT step's metrics; ``on_demo_progress``: ``(trees
    finished, planned)`` after each demonstration tree; ``on_train_progress``: ``(SFT steps done, planned)``
    after each step (terminal bars are drawn as well when stdout is a terminal); ``on_status``: one line
    between the demonstrations and the SFT (what was kept, the samples) and the trainer's own phase lines
    (loading, first step, saving, and a line every 20 s without one: :func:`rao_core.train.launch.run_training`).

    Raises:
        ValueError: ``loss_type`` is not ``'sft'`` (checked before any demonstration is built), or no
            demonstration tree succeeded (nothing to train on).
    """
    from rao_core.envs import get_env, write_tasks
    from rao_core.samples import write_samples
    from rao_core.train.launch import run_training
    from rao_core.tree import write_trees

    env = get_env(env) if isinstance(env, str) else env
    demo_config = demo_config or DemoConfig()
    trainer_config = trainer_config or default_sft_trainer_config()
    if trainer_config.loss_type != "sft":
        raise ValueError(f"the warm start trains with loss_type='sft', got {trainer_config.loss_type!r}")
    runtime_config = runtime_config or recommended_runtime_config()
    tasks = demo_tasks(env, demo_config)
    if tasks_path is not None:
        write_tasks(tasks_path, tasks)
    trees = asyncio.run(build_demonstrations(env, tasks, demo_config, tokenizer=str(model_path),
                                             runtime_config=runtime_config, on_progress=on_demo_progress))
    if not trees:
        raise ValueError(f"none of the {trees.attempted} demonstration trees succeeded; nothing to train on")
    if trees_path is not None:
        write_trees(trees_path, trees)
    batch = demo_samples(trees, only_successful_nodes=demo_config.only_successful_nodes,
                         child_sample_trees=demo_config.child_sample_trees)
    if samples_path is not None:
        write_samples(samples_path, batch)
    if on_status is not None:
        on_status(f"{len(trees)} of {trees.attempted} demonstration trees kept ({trees.wall_s:.0f} s), "
                  f"{len(batch)} SFT samples ({batch.stats.num_assistant_tokens} assistant tokens); starting the "
                  f"SFT ({trainer_config.process})")
    t0 = time.perf_counter()
    res = run_training(batch, model_path, out_dir, trainer_config, iteration=0, on_step=on_step,
                       on_progress=on_train_progress, samples_path=samples_path, on_status=on_status)
    sft_s = time.perf_counter() - t0
    stats = demo_stats(trees) | {"samples": len(batch), "dropped_failed_nodes": batch.stats.dropped_nan_nodes,
                                 "samples_per_depth": batch.stats.samples_per_depth,  # sorted by summarise
                                 "dropped_child_nodes": batch.stats.dropped_child_nodes}
    return WarmStartResult(checkpoint=res.checkpoint, stats=stats, train_metrics=res.metrics,
                           demo_wall_s=trees.wall_s, sft_wall_s=sft_s, num_samples=len(batch),
                           num_assistant_tokens=batch.stats.num_assistant_tokens,
                           num_tokens=sum(len(s.token_ids) for s in batch.samples))
