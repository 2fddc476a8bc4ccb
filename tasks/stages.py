"""The Prefect tasks of one RL iteration (thin: load inputs, call ``rao_core``, save outputs, return URIs).

Order: serve_checkpoint (tasks/serve.py) -> generate_trees -> judge_trees -> validate_dataset ->
train_policy -> evaluate -> register_checkpoint. Each is a resumable Prefect task (``infra.stage_io.stage``):
its return value (an ``infra.stage_records`` record: URIs, small metrics) is stored on S3 once it completed.
Docs: docs/pipeline.md, docs/pipeline/resume-and-faults.md.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE

from rao_core.config import CampaignConfig
from rao_core.evaluation import Benchmark
from rao_core.envs import Task, get_env, load_tasks, write_tasks
from rao_core.progress import every_tenth, fan_out, quiet_heartbeat
from rao_core.train.checkpoint import is_checkpoint
from rao_core.tree import read_trees, tree_json_line, write_trees
from tasks import tracking
from infra.stage_io import (ProgressArtifact, RunContext, artifact_key, fetch, in_prefect_run, iter_key, run_logger,
                            stage)
from infra.stage_records import (Checkpoint, EvalOutput, GenerateOutput, JudgeOutput, RegisterOutput, ServedEndpoint,
                                 TrainOutput, ValidateOutput)
from tasks.serve import checkpoint_local, gpus_released, lost_server_line, server_diagnosis
from infra.process import ServiceError
from rao_core.policies.openai_policy import policy_client_key

IO_RETRIES = {"retries": 2, "retry_delay_seconds": [5, 20]}


class ValidationFailed(RuntimeError):
    """The training data failed the great-expectations suite; training did not run."""


class InfrastructureFailure(ServiceError):
    """Too many of a stage's trees ended by infrastructure failures (``runtime.max_infra_failure_share``): the
    stage failed without a completion marker, so a re-run redoes it (on a fresh server)."""


def infra_failure(tree) -> str | None:
    """The infrastructure failure ``tree`` ended by, or None when its outcome is the policy's own: its root's
    end reason when it is one of ``rao_core.judge.stage.INFRA_END_REASONS`` (the trees judging leaves
    unscored: policy_error, sandbox_error, token_prefix_break, tree_timeout), else ``"crashed"`` when the
    rollout itself raised (``tree.error``)."""
    from rao_core.judge.stage import INFRA_END_REASONS

    try:
        reason = tree.root.end_reason
    except KeyError:  # a crashed rollout without its root
        reason = None
    if reason in INFRA_END_REASONS:
        return str(reason)
    return "crashed" if tree.error else None


def infra_counts(trees) -> dict[str, int]:
    """Trees per infrastructure failure (:func:`infra_failure`), most frequent first; empty when none."""
    from collections import Counter

    return dict(Counter(r for r in map(infra_failure, trees) if r).most_common())


def infra_text(counts: dict[str, int]) -> str:
    """``"infrastructure failures 3 (policy_error 2, sandbox_error 1)"``, or ``"infrastructure failures 0"``."""
    detail = ", ".join(f"{k} {v}" for k, v in counts.items())
    return f"infrastructure failures {sum(counts.values())}" + (f" ({detail})" if detail else "")


def check_infra_failures(ctx: RunContext, what: str, trees) -> dict[str, int]:
    """Fail stage ``what`` (e.g. ``"iteration 1 generate"``) when more than ``runtime.max_infra_failure_share``
    of ``trees`` ended by infrastructure failures; returns the counts (:func:`infra_counts`) otherwise.

    Raises :class:`InfrastructureFailure`, one line: how many trees failed and why, the policy server's state
    (its exit status and log file: ``tasks.serve.server_diagnosis``), the last error a node recorded, and that
    a re-run redoes the stage."""
    trees = list(trees)
    counts = infra_counts(trees)
    n, limit = sum(counts.values()), ctx.config.runtime.max_infra_failure_share
    if not trees or n <= limit * len(trees):
        return counts
    errors = [x.error for t in trees if infra_failure(t) for x in t.nodes if x.error] + \
        [t.error for t in trees if t.error]
    last = " ".join(str(errors[-1]).split())[:300] if errors else "none recorded"
    detail = ", ".join(f"{k} {v}" for k, v in counts.items())
    raise InfrastructureFailure(
        f"{what}: {n} of {len(trees)} trees ({n / len(trees):.0%}; limit {limit:.0%}, runtime.max_infra_failure_share) "
        f"ended by infrastructure failures ({detail}): {server_diagnosis(ctx)}; last error: {last}; no completion "
        f"marker written: re-run to redo it on a fresh server")


def training_pool(ctx: RunContext) -> list[Task]:
    """The campaign's training RL tasks: from ``tasks.train_file``, or ``pool_size`` per difficulty from
    ``rao_core.task_sampling.sample_tasks`` (stream ``"rl-pool"``, split ``train``, the master seed),
    cached in the campaign's local folder."""
    cfg = ctx.config.tasks
    if cfg.train_file:
        tasks = load_tasks(cfg.train_file, get_env(cfg.env, **cfg.env_options))
        return [t for t in tasks if t.split == "train"] or tasks
    path = ctx.local("tasks/train.jsonl")
    if not path.exists():
        from rao_core.task_sampling import sample_tasks

        env = get_env(cfg.env, **cfg.env_options)
        write_tasks(path, sample_tasks(env, seed=ctx.config.seed, stream="rl-pool", difficulties=cfg.difficulties,
                                       n=cfg.pool_size, split="train", **cfg.generator_options))
    return load_tasks(path, get_env(cfg.env, **cfg.env_options))


def check_task_pool(config: CampaignConfig) -> int:
    """Read and check the campaign's task file (``tasks.train_file``) against its environment before
    anything is served; returns the number of tasks (0 when tasks are generated).

    Raises ValueError ``"<file>:<line>: not a valid task record: <field>: ... (expected ...)"`` on the
    first bad record, FileNotFoundError for a missing file.
    """
    cfg = config.tasks
    if not cfg.train_file:
        return 0
    return len(load_tasks(cfg.train_file, get_env(cfg.env, **cfg.env_options)))


def iteration_tasks(ctx: RunContext, iteration: int) -> list[Task]:
    """RL tasks of iteration ``iteration``: a seeded sample (without replacement) from the pool."""
    pool = training_pool(ctx)
    rng = random.Random(f"{ctx.config.seed}-{iteration}")
    k = min(ctx.config.tasks.tasks_per_iteration, len(pool))
    return rng.sample(pool, k)


def _policy(ctx: RunContext, served: ServedEndpoint):
    """The rollouts' policy: a ``rao_core.policies.pool.PolicyPool`` of the served replicas (one
    ``OpenAIPolicy`` each; one replica for a single server), each tree pinned to one replica, ties starting at
    ``served.replica_offset``; the requests carry their sampling seeds only if ``served.seeded``, and each
    replica's key is ``policy_client_key``'s (this installation's only for its own servers)."""
    from rao_core.policies.pool import PolicyPool

    rt = ctx.config.runtime
    key_env = ctx.config.serving.api_key_env
    return PolicyPool.of_endpoints(served.urls, served.model, offset=served.replica_offset,
                                   temperature=rt.temperature, top_p=rt.top_p, request_timeout_s=rt.policy_timeout_s,
                                   send_seeds=served.seeded,
                                   key=lambda url: policy_client_key(url, own=served.own, key_env=key_env))


def _served_how(served: ServedEndpoint) -> str:
    """How the served model got there, for the generate stage's line: the switch (``start``, ``reload``, ...) and,
    for external servers, that they serve their own weights (checked against the checkpoint at each switch)."""
    if served.own:
        return f"this flow's server, {served.how or 'switched'}"
    return {"external": "an external server, checked to serve this checkpoint's weights at the switch",
            "external-lora": "an external server, the checkpoint's LoRA adapter loaded"}.get(
        served.how, f"an external server ({served.how or 'as it is'})")


@stage("generate", name="generate-trees")
def generate_trees(ctx: RunContext, iteration: int, served: ServedEndpoint, tokenizer_path: str,
                   policy_version: int | None = None) -> GenerateOutput:
    """Grow G execution trees per sampled RL task through the runtime; returns the trees' S3 URI.

    Each tree records ``policy_version``, the version of the served checkpoint (None: ``iteration - 1``, the
    synchronous loop's parent; checkpoint ``iter-K`` is version K), which the trainer's staleness check reads
    (``algo.max_staleness``, docs/algorithm/async-rl.md).

    Each tree's sampling seed is ``rollout_seed(seed, iteration, task_id, g)`` (``ExecutionTree.seed``).
    ``execution.backend`` says where the trees grow: 'local', in this process (one ``run_trees``); 'ray', as
    shards on a Ray cluster (``infra.ray_rollouts``), the same trees with the same seeds, merged in the same order.
    Either way the trees go to ``iter-K/trees/trees.jsonl``.
    """
    log = run_logger()
    tasks = iteration_tasks(ctx, iteration)
    G = ctx.config.algo.G
    total = len(tasks) * G
    ui = ProgressArtifact(artifact_key(ctx.name, "generate-progress", iteration), "rollout trees finished")
    ui(0, total)
    log.info(f"iteration {iteration} generate: sampling from model {served.model!r} at {', '.join(served.urls)} "
             f"({_served_how(served)})")

    from infra.vllm_metrics import pool_delta, scrape

    served_before = [scrape(u) for u in served.urls]  # each replica's /metrics counters (None if unreadable)
    t0 = time.monotonic()
    if ctx.config.execution.backend == "ray":
        trees = _generate_on_ray(ctx, iteration, tasks, served, tokenizer_path, ui)
    else:
        trees = _generate_locally(ctx, iteration, tasks, served, tokenizer_path, ui)
    gen_s = time.monotonic() - t0
    serving = pool_delta(served_before, [scrape(u) for u in served.urls], gen_s)
    from rao_core.async_rl import tree_version

    version = tree_version(iteration, 0) if policy_version is None else policy_version
    for t in trees:
        t.meta.update({"campaign": ctx.name, "iteration": iteration})
        t.policy_version = version
    # a dead server fails the stage here (its trees stay in the journal), before anything is stored
    infra = check_infra_failures(ctx, f"iteration {iteration} generate", trees)
    if (lost := lost_server_line(ctx, f"iteration {iteration} generate", infra)) is not None:
        log.warning(lost)  # a server died, below the share: named here, replaced at the next switch
    path = write_trees(ctx.local(f"iter-{iteration}/trees.jsonl"), trees)  # one bad tree: a failed record
    ctx.local(f"iter-{iteration}/trees.partial.jsonl").unlink(missing_ok=True)
    up = ctx.store().put_file(path, iter_key(iteration, "trees/trees.jsonl"))
    log.info(f"generated {len(trees)} trees ({total} planned) in {gen_s:.1f} s; {infra_text(infra)}"
             + (f"; vLLM {serving['generation_tokens_per_s']:.0f} generated tok/s, prefix-cache hit rate "
                f"{serving.get('prefix_cache_hit_rate', float('nan')):.2f}, {serving.get('preemptions', 0):.0f} "
                f"preemptions" if "generation_tokens_per_s" in serving else ""))
    return GenerateOutput(trees_uri=up["uri"], sha256=up["sha256"], num_trees=len(trees),
                          crashed=sum(int(bool(t.error)) for t in trees), infra_failures=infra,
                          generation_s=round(gen_s, 3), serving=serving)


def _generate_locally(ctx: RunContext, iteration: int, tasks: list[Task], served: ServedEndpoint,
                      tokenizer_path: str, ui: ProgressArtifact) -> list:
    """The trees of ``tasks`` grown in this process (backend 'local'), each journalled as it finishes."""
    from rao_core.runtime import load_tokenizer, run_trees
    from rao_core.task_sampling import rollout_seed

    log = run_logger()
    env = get_env(ctx.config.tasks.env, **ctx.config.tasks.env_options)
    G = ctx.config.algo.G
    policy = _policy(ctx, served)
    counts = {"solved": 0}
    infra: dict[str, int] = {}  # trees per infrastructure failure so far
    # Each tree is written on its own as it finishes (a crash mid-generation leaves the finished ones
    # here for inspection; resume regenerates the iteration); removed once trees.jsonl is complete.
    journal = open(ctx.local(f"iter-{iteration}/trees.partial.jsonl"), "w", encoding="utf-8")

    log_tenths = every_tenth(lambda done, total_: log.info(
        f"rollouts {done}/{total_}  solved {counts['solved']}  {infra_text(infra)}"))

    news = {"at": time.monotonic(), "done": 0, "t0": time.monotonic()}

    def progress(done: int, total_: int, tree) -> None:
        news.update(at=time.monotonic(), done=done)
        journal.write(tree_json_line(tree) + "\n")
        journal.flush()
        ui(done, total_)
        if (why := infra_failure(tree)) is not None:
            infra[why] = infra.get(why, 0) + 1
        counts["solved"] += int(tree.root.verifier == 1.0)
        log_tenths(done, total_)

    total = len(tasks) * G
    log.info(f"generating {total} trees ({len(tasks)} RL tasks x G {G}); a line at each tenth finished")

    def still(quiet: float) -> None:
        log.info(f"still generating: {news['done']}/{total} trees finished, {time.monotonic() - news['t0']:.0f} s "
                 f"in, none in the last {quiet:.0f} s")

    async def go():
        beat = asyncio.create_task(quiet_heartbeat(still, lambda: news["at"]))
        try:
            return await run_trees(env, [(t, G) for t in tasks], policy, ctx.config.runtime,
                                   tokenizer=load_tokenizer(tokenizer_path), progress=progress,
                                   seeds=lambda task, g: rollout_seed(ctx.config.seed, iteration, task.task_id, g))
        finally:
            beat.cancel()
            await policy.aclose()

    try:
        return asyncio.run(go())
    finally:
        journal.close()


def _generate_on_ray(ctx: RunContext, iteration: int, tasks: list[Task], served: ServedEndpoint,
                     tokenizer_path: str, ui: ProgressArtifact) -> list:
    """The trees of ``tasks`` grown as shards on the Ray cluster (backend 'ray', ``infra.ray_rollouts``), read back
    from exactly the shards' objects, in the local backend's order."""
    from infra import ray_rollouts as rollouts

    log = run_logger()
    ex = ctx.config.execution
    shards = rollouts.plan_shards(tasks, ctx.config.algo.G, seed=ctx.config.seed, iteration=iteration,
                                  shards=ex.shards)
    total, done = sum(s.num_trees for s in shards), [0, 0]
    log.info(f"generate on Ray ({ex.ray_address}): {len(tasks)} groups in {len(shards)} shards "
             f"({', '.join(str(len(s.groups)) for s in shards)} groups), {ex.cpus_per_shard:g} CPU each, "
             f"{ex.max_retries} retries of a lost worker")

    def on_result(r) -> None:
        done[0], done[1] = done[0] + 1, done[1] + r.num_trees
        ui(done[1], total)
        log.info(f"shard {r.index + 1}/{len(shards)} done on {r.worker}: {r.num_trees} trees, solved {r.solved}, "
                 f"crashed {r.crashed}, {r.generation_s:.1f} s; rollouts {done[1]}/{total}")

    results = rollouts.run_on_ray(ctx, iteration, shards, served, tokenizer_path, _policy, on_result)
    return rollouts.read_shards(ctx, f"iteration {iteration} generate", shards, results)


@stage("judge", name="judge-trees")
def judge_trees(ctx: RunContext, iteration: int, trees_uri: str) -> JudgeOutput:
    """Score every node (verifier, LLM judge or root proxy) and compute Eq. (1) rewards."""
    from rao_core.judge import judge_trees_sync
    from rao_core.rewards import assign_rewards

    trees = read_trees(fetch(ctx, trees_uri, f"iter-{iteration}/trees.jsonl"))
    scored, stats = judge_trees_sync(trees, ctx.config.tasks.env, ctx.config.judge)
    algo = ctx.config.algo
    weight = algo.bonus_weight(ctx.config.tasks.env)
    scored = [assign_rewards(t, weight, bonus=algo.bonus) for t in scored]
    path = write_trees(ctx.local(f"iter-{iteration}/scored.jsonl"), scored)
    up = ctx.store().put_file(path, iter_key(iteration, "trees/scored.jsonl"))
    st = stats.model_dump() if hasattr(stats, "model_dump") else dict(stats)
    return JudgeOutput(scored_uri=up["uri"], sha256=up["sha256"],
                       judge={k: v for k, v in st.items() if isinstance(v, (int, float, bool, str, dict))})


@stage("validate", name="validate-dataset")
def validate_dataset(ctx: RunContext, iteration: int, scored_uri: str) -> ValidateOutput:
    """Flatten trees to a node table, build samples, run the great-expectations suite; fail before training."""
    from infra.validation import report_markdown, validate_training_data
    from rao_core.samples import build_samples, write_samples

    trees = read_trees(fetch(ctx, scored_uri, f"iter-{iteration}/scored.jsonl"))
    cfg = ctx.config
    batch = build_samples(trees, estimator=cfg.algo.advantage, depth_weighting=cfg.algo.depth_weights,
                          filter_zero_variance_groups=cfg.algo.filter_zero_variance_groups,
                          filter_errors=cfg.algo.filter_errors, interrupted=cfg.algo.interrupted)
    report = validate_training_data(trees, batch, max_depth=cfg.runtime.effective_max_depth,
                                    lam=cfg.algo.bonus_weight(cfg.tasks.env),
                                    context_window=cfg.runtime.context_window, estimator=cfg.algo.advantage)
    report["sample_stats"] = batch.stats.model_dump()
    store = ctx.store()
    rep = store.put_bytes(json.dumps(report, indent=1, default=str).encode(),
                          iter_key(iteration, "validation/report.json"))
    if in_prefect_run():  # outside a run (direct .fn() calls) there is no artifact to write
        try:
            create_markdown_artifact(key=artifact_key(ctx.name, "validation", iteration),
                                     markdown=report_markdown(report),
                                     description="Training-data validation (great-expectations)")
        except Exception as e:  # noqa: BLE001 - the UI's report never fails the stage
            run_logger().warning(f"validation artifact: {type(e).__name__}: {e}")
    if ctx.campaign_run_id:
        it_run = tracking.find_iteration_run(ctx.mlflow_experiment_id, ctx.name, iteration)
        if it_run:
            tracking.log_json(it_run, report, "validation/report.json")
    if not report["success"]:
        raise ValidationFailed(f"iteration {iteration}: training data failed validation "
                               f"({'; '.join(report['failures'][:3])}); report {rep['uri']}")
    spath = write_samples(ctx.local(f"iter-{iteration}/samples.jsonl"), batch)
    up = store.put_file(spath, iter_key(iteration, "samples/samples.jsonl"))
    return ValidateOutput(samples_uri=up["uri"], report_uri=rep["uri"], num_samples=len(batch),
                          sample_stats=batch.stats.model_dump())


def _resolved_trainer(ctx: RunContext):
    """The campaign's trainer config with ``kl_reference: warm_start`` replaced by the iteration-0 checkpoint's
    local folder (``warm_start.mode`` none: ``model.path``; checkpoint: that checkpoint; demos: ``iter-0``)."""
    cfg = ctx.config
    tcfg = cfg.trainer
    if tcfg.kl_coef == 0 or tcfg.kl_reference != "warm_start" or tcfg.lora is not None:
        return tcfg
    ws = cfg.warm_start
    if ws.mode == "none":
        ref = str(cfg.model.path)
    elif ws.mode == "checkpoint":
        ref = str(checkpoint_local(ctx, checkpoint_from_uri(ctx, ws.checkpoint or "")))
    else:
        ref = str(checkpoint_local(ctx, Checkpoint(name="iter-0", uri=ctx.store().uri("iter-0/checkpoint"),
                                                   local=str(ctx.local("checkpoints/iter-0")))))
    return tcfg.model_copy(update={"kl_reference": ref})


@stage("train", name="train-policy")
def train_policy(ctx: RunContext, iteration: int, samples_uri: str, parent: Checkpoint) -> TrainOutput:
    """One RAO update (token-level policy gradient, Eq. 4-5 weights) from ``parent``; saves a checkpoint."""
    from rao_core.samples import read_samples
    from rao_core.train.launch import run_training

    log = run_logger()
    samples_path = fetch(ctx, samples_uri, f"iter-{iteration}/samples.jsonl")
    batch = read_samples(samples_path)
    name = f"iter-{iteration}"
    out_dir = ctx.local(f"checkpoints/{name}")
    steps: list[dict[str, float]] = []
    peak_rss_mb: float | None = None  # the training child's own peak RSS (subprocess mode only)
    if len(batch) == 0 or all(s.advantage == 0.0 for s in batch.samples):
        # Every advantage is 0 (e.g. all rollouts of every group scored alike): the update is a no-op.
        log.warning(f"iteration {iteration}: no non-zero advantage; checkpoint unchanged")
        ProgressArtifact(artifact_key(ctx.name, "train-progress", iteration), "optimizer steps").finish(
            f"no update: {'no training sample' if len(batch) == 0 else f'every advantage of the {len(batch)} samples is 0'}"
            " (no group carried signal), 0 optimizer steps; the parent's weights were copied as this iteration's "
            "checkpoint")
        src = checkpoint_local(ctx, parent)
        import shutil

        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(src, out_dir, ignore=shutil.ignore_patterns(".complete"))
        train_s = 0.0
    else:
        t0 = time.monotonic()
        tcfg = _resolved_trainer(ctx)
        log.info(f"iteration {iteration} train: update {tcfg.update_budget()}"
                 + (f", KL penalty {tcfg.kl_coef} to {tcfg.kl_reference or 'the parent checkpoint'}"
                    if tcfg.kl_coef > 0 else ""))
        # subprocess: its memory is returned before vLLM serves again; vLLM sleeps while the trainer shares
        # its GPUs (gpus.sleep_while_training)
        ui = ProgressArtifact(artifact_key(ctx.name, "train-progress", iteration), "optimizer steps")

        def step_line(done: int, total: int) -> None:  # as the warm start's SFT lines: the loss at each tenth
            loss = f", loss {steps[-1]['train/loss']:.4f}" if steps and "train/loss" in steps[-1] else ""
            log.info(f"iteration {iteration} train: optimizer step {done}/{total}{loss}")

        run = run_training(batch, checkpoint_local(ctx, parent), out_dir, tcfg, iteration=iteration,
                           on_step=steps.append, on_progress=fan_out(every_tenth(step_line), ui),
                           samples_path=samples_path,
                           around_child=gpus_released(ctx),
                           on_status=lambda line: log.info(f"iteration {iteration} train: {line}"),
                           max_staleness=ctx.config.algo.max_staleness)
        peak_rss_mb = run.peak_rss_mb
        train_s = time.monotonic() - t0
        log.info(f"trained {len(steps)} steps in {train_s:.1f} s ({tcfg.process}"
                 + (f", peak RSS {peak_rss_mb:.0f} MB)" if peak_rss_mb is not None else ")"))
    uri = ctx.store().put_checkpoint(out_dir, iter_key(iteration, "checkpoint"))
    (out_dir / ".complete").write_text("ok")
    from collections import Counter

    from rao_core.async_rl import iteration_ratio_stats
    from rao_core.samples import sample_staleness

    last = (dict(steps[-1]) if steps else {}) | iteration_ratio_stats(steps)  # the last step, and all steps' means

    # the staleness histogram of the iteration's samples (asynchronous RL: lag behind the trained checkpoint)
    for lag, n in sorted(Counter(sample_staleness(batch.samples, iteration - 1)).items()):
        last[f"staleness/lag_{lag}_samples"] = float(n)
    return TrainOutput(checkpoint=Checkpoint(name=name, uri=uri, local=str(out_dir)),
                       steps=len(steps), train_s=round(train_s, 3), last_step=last, metrics=steps,
                       peak_rss_mb=round(peak_rss_mb, 1) if peak_rss_mb is not None else None)


def validation_tasks(ctx: RunContext, benchmark: Benchmark | None = None) -> list[Task]:
    """Held-out validation tasks of ``benchmark`` (default: the campaign's training benchmark, the first of
    ``CampaignConfig.suite``): ``rao_core.evaluation.eval_tasks`` on its environment with its generator options,
    cached locally under a key of everything that defines them (so the suite's benchmarks, the nightly's larger
    draws and a changed ``eval`` section never read another set's cache)."""
    import hashlib

    from rao_core.evaluation import eval_tasks

    b = benchmark or ctx.config.suite()[0]
    env = get_env(b.env, **b.env_options)
    key = json.dumps([b.env, b.env_options, b.generator_options, b.difficulties, b.n_tasks, b.seed, b.split],
                     sort_keys=True, default=str)
    path = ctx.local(f"tasks/validation-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsonl")
    if not path.exists():
        write_tasks(path, eval_tasks(env, b, **b.generator_options))
    return load_tasks(path, env)


def run_evaluation(ctx: RunContext, served: ServedEndpoint, tokenizer_path: str,
                   iteration: int | str | None = None, benchmarks: list[Benchmark] | None = None) -> EvalOutput:
    """Evaluate the served policy on each benchmark of ``benchmarks`` (default: the campaign's suite at this
    iteration, ``CampaignConfig.suite_at``: all of them at iteration 0 and the last, those with ``at`` 'every'
    in between), on its validation tasks (:func:`validation_tasks`) in each of its modes with the campaign's
    runtime: ``rao_core.evaluation.run_evaluation`` once per benchmark (the code path of ``rao eval``), each tree
    seeded from the benchmark's seed (``rao_core.task_sampling.eval_tree_seed``; sent to the server only if
    ``served.seeded``, as the rollouts' seeds are), so champion and candidate sample alike where the server
    honours seeds. Progress (trees finished over all benchmarks and modes) goes to the Prefect progress artifact
    ``artifact_key(ctx.name, "evaluate-progress", iteration)`` inside a flow run, and to a terminal bar. With
    ``execution.backend: ray`` the trees grow as shards on the Ray cluster (:func:`_evaluate_on_ray`) and are
    summarised by the same ``rao_core.evaluation.report_from_trees``.

    Returns flat ``eval/<benchmark>/<mode>/<difficulty>/...`` metrics and table rows, each row naming its
    benchmark (no report stored).
    """
    from rao_core.evaluation import EvalReport, run_evaluation as evaluate_tasks
    from rao_core.runtime import load_tokenizer

    suite = list(benchmarks) if benchmarks is not None else ctx.config.suite_at(iteration)
    sets = [(b, validation_tasks(ctx, b)) for b in suite]
    total = sum(len(tasks) * len(b.modes) for b, tasks in sets)  # run_trees counts per call: count across all here
    ui = ProgressArtifact(artifact_key(ctx.name, "evaluate-progress", iteration), "evaluation trees finished")
    finished, solved = [0], [0]
    # a log line at each tenth (a piped log or the Prefect UI has no bar: an evaluation of 100 trees is minutes)
    log_tenths = every_tenth(lambda done, total_: run_logger().info(
        f"evaluation trees {done}/{total_}  solved {solved[0]}"))

    def progress(done: int, total_: int, tree, n: int = 1, n_solved: int | None = None) -> None:
        """``n`` more trees finished (``tree``: the one, locally; a Ray shard's ``n`` with ``n_solved``)."""
        finished[0] += n
        solved[0] += n_solved if n_solved is not None else int(tree is not None and tree.root.verifier == 1.0)
        ui(finished[0], total)
        log_tenths(finished[0], total)

    ui(0, total)
    where = "evaluation" if iteration is None else f"iteration {str(iteration).removeprefix('iter-')} evaluate"
    # said before the first tree, which takes tens of seconds (the log was silent until the first tenth)
    what = "; ".join((f"{b.name}: " if len(sets) > 1 else "")
                     + f"{len(tasks)} held-out tasks x modes {', '.join(b.modes)}" for b, tasks in sets)
    run_logger().info(f"{where}: {total} trees ({what}); a line at each tenth finished")
    report = EvalReport()
    tokenizer = load_tokenizer(tokenizer_path) if ctx.config.execution.backend != "ray" else None
    for b, tasks in sets:
        if ctx.config.execution.backend == "ray":
            report = report + _evaluate_on_ray(ctx, iteration, tasks, served, tokenizer_path, where,
                                               lambda r: progress(0, 0, None, r.num_trees, r.solved), b)
        else:
            report = report + evaluate_tasks(b, env=get_env(b.env, **b.env_options), tasks=tasks,
                                             runtime=ctx.config.runtime, tokenizer=tokenizer,
                                             policy=_policy(ctx, served), progress=progress, seeded=True)
    infra = check_infra_failures(ctx, where, report.trees)  # a dead server fails the stage, no marker written
    if infra:
        run_logger().warning(f"{where}: {len(report.trees)} trees, {infra_text(infra)} (left unscored)")
    return EvalOutput(metrics=report.metrics(), rows=[r.table_row() for r in report.rows])


def _evaluate_on_ray(ctx: RunContext, iteration: int | str | None, tasks: list[Task], served: ServedEndpoint,
                     tokenizer_path: str, where: str, advance, benchmark: Benchmark | None = None) -> "EvalReport":
    """The evaluation of ``tasks`` in each mode of ``benchmark`` (default: the training benchmark) as shards on
    the Ray cluster (backend 'ray'): per mode, ``infra.ray_rollouts.plan_eval_shards`` (objects under
    ``<folder>/eval/shards/``, folder ``iter-K``, or ``eval`` outside an iteration, then ``/<benchmark>`` for a
    benchmark other than the training one), read back in task order and summarised as the local backend does
    (``rao_core.evaluation.report_from_trees``), rows named by the benchmark. ``advance(result)``: a shard
    finished (``ShardResult``: its trees and roots solved)."""
    from rao_core.evaluation import EvalReport, report_from_trees
    from infra import ray_rollouts as rollouts

    ex = ctx.config.execution
    b = benchmark or ctx.config.suite()[0]
    folder = iter_key(iteration) if iteration is not None else "eval"
    if b.name != ctx.config.training_benchmark_name():
        folder = f"{folder}/{b.name}"
    report = EvalReport(graded=b.graded)
    for mode in b.modes:
        shards = rollouts.plan_eval_shards(tasks, mode=mode, shards=ex.shards, folder=folder, seed=b.seed)
        t0 = time.monotonic()
        results = rollouts.run_on_ray(ctx, iteration, shards, served, tokenizer_path, _policy,
                                      advance, what=f"{where} ({b.name}, {mode})")
        trees = rollouts.read_shards(ctx, f"{where} ({b.name}, {mode})", shards, results)
        report = report + report_from_trees(tasks, trees, mode=mode, graded=b.graded,
                                            wall_s=time.monotonic() - t0, keep_trees=b.stored_trees)
    return report.named(b.name)


evaluate_checkpoint = task(run_evaluation, name="evaluate-checkpoint", cache_policy=NONE)  # not resumable: the nightly


def primary_metric(ctx: RunContext) -> str:
    """The metric the champion rule ranks by: ``eval.primary_metric`` (a key without a benchmark is the primary
    benchmark's: ``rao_core.evaluation.named_key``), else the primary benchmark's
    (``CampaignConfig.primary_benchmark``) success in its first mode on its first difficulty."""
    from rao_core.evaluation import metric_key, named_key

    cfg, name = ctx.config, ctx.config.primary_benchmark()
    if cfg.eval.primary_metric:
        return named_key(cfg.eval.primary_metric, name)
    b = next(b for b in cfg.suite() if b.name == name)
    return metric_key(name, b.modes[0], b.difficulties[0])


def primary_score(ctx: RunContext, metrics: dict[str, float], metric: str) -> float | None:
    """``metrics[metric]``, or for the training benchmark's metric of a record written before metric keys
    named their benchmark, its key without the benchmark (``rao_core.evaluation.legacy_key``); None when
    neither is there."""
    from rao_core.evaluation import legacy_key

    if metric in metrics:
        return metrics[metric]
    old = legacy_key(metric)
    if old is not None and metric.split("/")[1] == ctx.config.training_benchmark_name():
        return metrics.get(old)
    return None


@stage("evaluate", name="evaluate")
def evaluate(ctx: RunContext, iteration: int | str, served: ServedEndpoint, tokenizer_path: str) -> EvalOutput:
    """Evaluate the served checkpoint on held-out validation tasks (recursive and/or single-agent)."""
    res = run_evaluation(ctx, served, tokenizer_path, iteration)
    report = res.model_dump(include={"metrics", "rows"})
    rep = ctx.store().put_bytes(json.dumps(report, indent=1).encode(), iter_key(iteration, "eval/report.json"))
    if in_prefect_run():  # outside a run (direct .fn() calls) there is no artifact to write
        try:
            create_table_artifact(key=artifact_key(ctx.name, "eval", iteration),
                                  table=[{k: v for k, v in r.items() if not isinstance(v, (dict, list))}
                                         for r in res.rows],
                                  description="Validation success by mode and difficulty (Wilson 95% CI)")
        except Exception as e:  # noqa: BLE001 - the UI's table never fails the stage
            run_logger().warning(f"eval artifact: {type(e).__name__}: {e}")
    res.report_uri = rep["uri"]
    return res


@stage("evaluate", name="evaluate-skipped")
def skip_evaluation(ctx: RunContext, iteration: int, trained_from: int | None = None) -> EvalOutput:
    """The ``evaluate`` stage of an iteration the campaign does not evaluate (``eval.every``:
    ``rao_core.evaluation.EvalConfig.evaluates``): no tree grown, no server asked. Its record (and resumable
    marker) has ``evaluated`` False, no metrics, no rows, and ``trained_from``, the iteration whose checkpoint
    this one trained from (the collapse guard walks from it to the last evaluated iteration). Logs one line,
    ``iteration 5: not evaluated (eval.every 6; next: iteration 6)``."""
    ev = ctx.config.eval
    run_logger().info(f"iteration {iteration}: not evaluated (eval.every {ev.every}; next: iteration "
                      f"{ev.next_evaluated(iteration, ctx.config.iterations)})")
    return EvalOutput(evaluated=False, trained_from=trained_from)


def benchmark_tags(rows: list[dict]) -> dict[str, str]:
    """A model version's one tag per evaluated benchmark, ``rao.benchmark.<name>``: each of its rows as
    ``<mode>/<difficulty> <success> [<Wilson 95%>] n <n>``, ``; ``-joined, e.g. ``recursive/tier1 0.250 [0.07,
    0.59] n 8`` (the registry's Compare lists them side by side; the metrics are tagged besides). Rows of no
    named benchmark are left out."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if r.get("benchmark"):
            out.setdefault(f"rao.benchmark.{r['benchmark']}", []).append(
                f"{r['mode']}/{r['difficulty']} {r['success']:.3f} {r['ci95']} n {r['n']}")
    return {k: "; ".join(v) for k, v in out.items()}


@stage("register", name="register-checkpoint", **IO_RETRIES)
def register_checkpoint(ctx: RunContext, iteration: int, ckpt: Checkpoint, eval_metrics: dict[str, float],
                        run_id: str, updated: bool = True, evaluated: bool = True,
                        eval_rows: list[dict] | None = None) -> RegisterOutput:
    """Register the checkpoint as a model version (unless its weights equal a version the campaign registered
    before: ``updated`` False), tagged with every evaluation metric (each benchmark's) and
    :func:`benchmark_tags` of ``eval_rows``; move champion only for a real update not worse than the champion on
    the primary metric (:func:`primary_metric`) beyond ``eval.tolerance``, never for a checkpoint not evaluated
    (``evaluated`` False: ``eval.every``; tag ``rao.evaluated`` false)."""
    from rao_core.evaluation import legacy_key

    name = tracking.registered_model_name(ctx.config)
    metric = primary_metric(ctx)
    score = primary_score(ctx, eval_metrics, metric)
    same = None if updated else tracking.campaign_version(name, ctx.name, iteration)  # weights unchanged
    if same is not None:
        return RegisterOutput(model=name, version=same, champion=False, metric=metric, score=score, updated=False)
    tags = {"rao.campaign": ctx.name, "rao.iteration": iteration, "rao.updated": str(updated).lower(),
            **({} if evaluated else {"rao.evaluated": "false"}), **{k: round(v, 4) for k, v in eval_metrics.items()},
            **benchmark_tags(eval_rows or [])}
    desc = (f"Checkpoint {ckpt.uri}\n\ncampaign {ctx.name}, iteration {iteration}"
            + ("" if updated else "; update skipped (no optimizer step): the weights it started from")
            + ("" if evaluated else f"; not evaluated (eval.every {ctx.config.eval.every}): never champion"))
    version = tracking.register_version(name, ckpt.uri, run_id, tags, desc)
    # a champion registered before metric keys named their benchmark holds the training benchmark's score as
    # its key without the benchmark
    legacy = legacy_key(metric) if metric.split("/")[1:2] == [ctx.config.training_benchmark_name()] else None
    promoted = evaluated and tracking.promote(name, version, score, metric, tolerance=ctx.config.eval.tolerance,
                                              updated=updated, legacy_metric=legacy)
    return RegisterOutput(model=name, version=version, champion=promoted, metric=metric, score=score,
                          updated=updated)


def checkpoint_from_uri(ctx: RunContext, ref: str) -> Checkpoint:
    """Resolve ``models:/NAME@ALIAS``, ``models:/NAME/VERSION``, ``s3://...`` or a local folder."""
    if ref.startswith("models:/"):
        from mlflow import MlflowClient

        body = ref[len("models:/"):]
        c = MlflowClient()
        mv = c.get_model_version_by_alias(*body.split("@", 1)) if "@" in body else c.get_model_version(*body.split("/", 1))
        if mv.source.startswith("s3://"):
            return Checkpoint(name=f"{mv.name}-v{mv.version}", uri=mv.source)
        ref = mv.source.removeprefix("file://")  # a version registered from a local folder
    if ref.startswith("s3://"):
        parts = ref.rstrip("/").split("/")  # the name keys the local cache: campaign-iter-K-checkpoint
        return Checkpoint(name="-".join(parts[-3:]), uri=ref)
    p = Path(ref)
    if not is_checkpoint(p):
        from infra.models import ModelError

        raise ModelError(f"model not found: {p} has no config.json (run `make setup`, or fix `model.path`)")
    return Checkpoint(name=p.name, local=str(p))
