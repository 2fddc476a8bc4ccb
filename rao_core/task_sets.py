"""A campaign's task sets, never mixed: training (the RL pool and the demonstrations), development and evaluation.

:func:`campaign_task_sets` draws each set from a campaign config as the stages do (the seeded rule of
``rao_core.task_sampling``) and :func:`check_task_sets` refuses held-out sets that share a task with training or
with each other. Docs: docs/pipeline/evaluation.md.
"""

from __future__ import annotations

from rao_core.config import CampaignConfig
from rao_core.envs import Task, get_env, load_tasks
from rao_core.evaluation import dev_tasks, eval_tasks
from rao_core.task_sampling import check_disjoint, sample_tasks
from rao_core.warmstart import DemoConfig, demo_tasks

__all__ = ["campaign_demo_config", "campaign_task_sets", "check_task_sets"]


def campaign_task_sets(cfg: CampaignConfig) -> tuple[dict[str, list[Task]], dict[str, list[Task]]]:
    """The task sets of campaign ``cfg``, as its stages draw them: held out, ``{"evaluation": eval tasks
    (rao_core.evaluation.eval_tasks), "development": eval.dev's tasks (only when set)}``; training,
    ``{"training": the RL pool (tasks.train_file's train-split tasks, else stream "rl-pool" of the master
    seed: the rule of tasks.stages.training_pool), "demonstrations": the warm start's tasks (only in mode
    'demos'; rao_core.warmstart.demo_tasks with the config tasks.warm_start builds)}``. The names carry
    their seeds, e.g. ``"evaluation (eval.seed 1234)"``."""
    tc, ev, ws = cfg.tasks, cfg.eval, cfg.warm_start
    env = get_env(tc.env, **tc.env_options)
    held = {f"evaluation (eval.seed {ev.seed})": eval_tasks(env, ev, **tc.generator_options)}
    if ev.dev is not None:
        held[f"development (eval.dev.seed {ev.dev.seed})"] = dev_tasks(env, ev, ev.dev, **tc.generator_options)
    if tc.train_file:
        pool = load_tasks(tc.train_file, env)
        train = {f"training (tasks.train_file {tc.train_file})": [t for t in pool if t.split == "train"] or pool}
    else:
        train = {f"training (seed {cfg.seed})": sample_tasks(env, seed=cfg.seed, stream="rl-pool",
                                                             difficulties=tc.difficulties, n=tc.pool_size,
                                                             split="train", **tc.generator_options)}
    if ws.mode == "demos":
        train[f"demonstrations (seed {cfg.seed})"] = demo_tasks(env, campaign_demo_config(cfg))
    return held, train


def campaign_demo_config(cfg: CampaignConfig) -> DemoConfig:
    """The :class:`rao_core.warmstart.DemoConfig` of campaign ``cfg``'s warm start (mode ``demos``):
    ``warm_start.n_tasks``, ``warm_start.difficulties``, the master seed, the campaign's
    ``tasks.generator_options`` (demonstrations from the RL pool's generator), then ``warm_start.options``."""
    ws = cfg.warm_start
    return DemoConfig(n_tasks=ws.n_tasks, difficulties=ws.difficulties, seed=cfg.seed,
                      **{"generator_options": cfg.tasks.generator_options, **ws.options})


def check_task_sets(cfg: CampaignConfig) -> dict[str, int]:
    """``rao_core.task_sampling.check_disjoint`` of :func:`campaign_task_sets` ``(cfg)``: the number of tasks of
    each set (names with their seeds); ValueError naming the overlap when a held-out task is also a training
    task or the development and evaluation sets share one."""
    return check_disjoint(*campaign_task_sets(cfg))
