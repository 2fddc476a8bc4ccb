"""Prefect task ``warm_start``: the campaign's iteration-0 checkpoint.

Modes (``warm_start.mode``): ``none`` uses ``model.path``; ``checkpoint`` resolves a registered model
version (``models:/NAME@ALIAS``), an S3 URI or a folder (a folder of this machine is copied to the
campaign's ``iter-0/checkpoint`` on S3, so the campaign resumes on another machine from S3 alone);
``demos`` runs the one warm start of the project, ``rao_core.warmstart.run_warm_start`` (also behind
``rao sft``: expert demonstrations through the real runtime, SFT with the same trainer), stores
demonstrations, samples and checkpoint on S3, and the flow registers the result as iteration 0.
"""

from __future__ import annotations

import json

import rao_core.warmstart
from rao_core.envs import get_env
from rao_core.progress import every_tenth, fan_out
from rao_core.task_sets import campaign_demo_config
from tasks import tracking
from infra.stage_io import ProgressArtifact, RunContext, artifact_key, run_logger, stage
from infra.stage_records import Checkpoint, WarmStartOutput
from tasks.stages import checkpoint_from_uri


@stage("warm_start", name="warm-start")
def warm_start(ctx: RunContext, iteration: str = "iter-0") -> WarmStartOutput:
    """Make the iteration-0 checkpoint (base model, a registered checkpoint, or SFT on demonstrations)."""
    cfg = ctx.config
    ws = cfg.warm_start
    if ws.mode == "none":
        return WarmStartOutput(checkpoint=checkpoint_from_uri(ctx, str(cfg.model.path)), mode="none")
    if ws.mode == "checkpoint":
        ckpt = checkpoint_from_uri(ctx, ws.checkpoint or "")
        if ckpt.uri is None:  # a folder of this machine: kept with the campaign, like a demos warm start
            store = ctx.store()
            run_logger().info(f"warm start: uploading {ckpt.local} to {store.uri('iter-0/checkpoint')}")
            ckpt = Checkpoint(name="iter-0", uri=store.put_checkpoint(ckpt.local, "iter-0/checkpoint"), local=ckpt.local)
        return WarmStartOutput(checkpoint=ckpt, mode="checkpoint")
    env = get_env(cfg.tasks.env, **cfg.tasks.env_options)
    demo_cfg = campaign_demo_config(cfg)
    out_dir = ctx.local("checkpoints/iter-0")
    tpath, spath = ctx.local("iter-0/demos.jsonl"), ctx.local("iter-0/demo_samples.jsonl")
    log, steps = run_logger(), []  # progress lines every tenth: minutes pass in a log with no bar drawn

    def demo_line(done: int, total: int) -> None:
        log.info(f"warm start: demonstration trees {done}/{total}")

    def sft_line(done: int, total: int) -> None:
        loss = f", loss {steps[-1]['train/loss']:.3f}" if steps and "train/loss" in steps[-1] else ""
        log.info(f"warm start: SFT step {done}/{total}{loss}")

    n_demos = demo_cfg.n_tasks * demo_cfg.rollouts_per_task
    log.info(f"warm start: {n_demos} expert demonstration trees, then SFT of {cfg.model.path}")
    # the UI's view of the same two phases (minutes each on a CPU; the Logs tab was the only sign of life)
    demo_ui = ProgressArtifact(artifact_key(ctx.name, "warm-start-demos-progress", iteration),
                               "demonstration trees finished")
    sft_ui = ProgressArtifact(artifact_key(ctx.name, "warm-start-sft-progress", iteration), "SFT optimizer steps")
    demo_ui(0, n_demos)

    def status(line: str) -> None:  # the SFT's start and its trainer's phases, in the UI too until the first step
        log.info(f"warm start: {line}")
        sft_ui.note(f"SFT: {line}")

    res = rao_core.warmstart.run_warm_start(
        env, cfg.model.path, out_dir, demo_config=demo_cfg, trainer_config=ws.trainer, runtime_config=cfg.runtime,
        tasks_path=ctx.local("iter-0/demo_tasks.jsonl"), trees_path=tpath, samples_path=spath, on_step=steps.append,
        on_demo_progress=fan_out(every_tenth(demo_line), demo_ui),
        on_train_progress=fan_out(every_tenth(sft_line), sft_ui), on_status=status)
    demo_s, sft_s, stats = res.demo_wall_s, res.sft_wall_s, res.stats
    store = ctx.store()
    log.info(f"warm start: SFT done ({sft_s:.0f} s); uploading demonstrations and the checkpoint to {store.uri('iter-0')}")
    demos = store.put_file(tpath, "iter-0/demos/trees.jsonl")
    store.put_file(spath, "iter-0/demos/samples.jsonl")
    uri = store.put_checkpoint(out_dir, "iter-0/checkpoint")
    (out_dir / ".complete").write_text("ok")
    if ctx.campaign_run_id:
        flat = {f"warm_start/{k}": float(v) for k, v in stats.items() if isinstance(v, (int, float))}
        flat.update({"warm_start/demo_s": demo_s, "warm_start/sft_s": sft_s,
                     "warm_start/final_loss": float(res.train_metrics[-1].get("train/loss", float("nan")))
                     if res.train_metrics else float("nan")})
        tracking.log_metrics(ctx.campaign_run_id, flat, step=0)
        tracking.log_json(ctx.campaign_run_id, stats, "warm_start/demo_stats.json")
    return WarmStartOutput(checkpoint=Checkpoint(name="iter-0", uri=uri, local=str(out_dir)),
                           mode="demos", demos_uri=demos["uri"], stats=json.loads(json.dumps(stats, default=str)),
                           demo_s=round(demo_s, 2), sft_s=round(sft_s, 2), sft_steps=len(res.train_metrics))
