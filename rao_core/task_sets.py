"""A campaign's task sets, never mixed: training (the RL pool and the demonstrations), development and evaluation.

:func:`campaign_task_sets` draws each set from a campaign config as the stages do (the seeded rule of
``rao_core.task_sampling``) and :func:`check_task_sets` refuses held-out sets that share a task with training or
with each other. :func:`evaluation_tasks` draws an evaluation set that skips given problems: an evaluation on the
training split (a sweep's development set) made disjoint from what is trained on by construction. Docs:
docs/pipeline/evaluation.md.
"""

from __future__ import annotations

from collections.abc import Collection

from rao_core.config import CampaignConfig
from rao_core.envs import Task, get_env, load_tasks
from rao_core.evaluation import dev_tasks, eval_tasks
from rao_core.task_sampling import check_disjoint, sample_tasks, task_identity
from rao_core.warmstart import DemoConfig, demo_tasks

__all__ = ["campaign_demo_config", "campaign_task_sets", "check_task_sets", "evaluation_tasks", "training_problems",
           "training_task_sets"]


def training_task_sets(cfg: CampaignConfig) -> dict[str, list[Task]]:
    """The training sets of campaign ``cfg``, as its stages draw them: ``{"training": the RL pool
    (tasks.train_file's train-split tasks, else stream "rl-pool" of the master seed: the rule of
    tasks.stages.training_pool), "demonstrations": the warm start's tasks (only in mode 'demos';
    rao_core.warmstart.demo_tasks with the config tasks.warm_start builds)}``. The names carry their seeds, e.g.
    ``"training (seed 0)"``."""
    tc, ws = cfg.tasks, cfg.warm_start
    env = get_env(tc.env, **tc.env_options)
    if tc.train_file:
        pool = load_tasks(tc.train_file, env)
        train = {f"training (tasks.train_file {tc.train_file})": [t for t in pool if t.split == "train"] or pool}
    else:
        train = {f"training (seed {cfg.seed})": sample_tasks(env, seed=cfg.seed, stream="rl-pool",
                                                             difficulties=tc.difficulties, n=tc.pool_size,
                                                             split="train", **tc.generator_options)}
    if ws.mode == "demos":
        train[f"demonstrations (seed {cfg.seed})"] = demo_tasks(env, campaign_demo_config(cfg))
    return train


def training_problems(cfg: CampaignConfig) -> set[str]:
    """The problems (``rao_core.task_sampling.task_identity``) of campaign ``cfg``'s training sets
    (:func:`training_task_sets`: the RL pool and the demonstrations)."""
    return {task_identity(t) for tasks in training_task_sets(cfg).values() for t in tasks}


def campaign_task_sets(cfg: CampaignConfig) -> tuple[dict[str, list[Task]], dict[str, list[Task]]]:
    """The task sets of campaign ``cfg``, as its stages draw them: held out, ``{"evaluation": eval tasks
    (rao_core.evaluation.eval_tasks), "development": eval.dev's tasks (only when set)}``; training,
    :func:`training_task_sets`. The names carry their seeds, e.g. ``"evaluation (eval.seed 1234)"``."""
    tc, ev = cfg.tasks, cfg.eval
    env = get_env(tc.env, **tc.env_options)
    held = {f"evaluation (eval.seed {ev.seed})": eval_tasks(env, ev, **tc.generator_options)}
    if ev.dev is not None:
        held[f"development (eval.dev.seed {ev.dev.seed})"] = dev_tasks(env, ev, ev.dev, **tc.generator_options)
    return held, training_task_sets(cfg)


def evaluation_tasks(cfg: CampaignConfig, skip: Collection[str] = ()) -> list[Task]:
    """The evaluation tasks of campaign ``cfg`` without the problems in ``skip`` (``task_identity`` strings, e.g.
    :func:`training_problems`): per difficulty of ``eval.difficulties``, the first ``eval.n_tasks`` tasks of
    split ``eval.split`` in the order of stream ``"eval"`` with ``eval.seed`` (the draw of
    ``rao_core.evaluation.eval_tasks``, made larger as needed) whose problem is neither in ``skip`` nor an earlier
    task's. So an evaluation on the training split (``eval.split`` train: problems of the split the campaign
    trains on) shares no problem with the RL pool and the demonstrations by construction. With nothing to skip it
    is ``eval_tasks`` of ``cfg.eval``.

    Raises ValueError naming the difficulty when the generator cannot give ``eval.n_tasks`` such tasks.
    """
    tc, ev = cfg.tasks, cfg.eval
    env = get_env(tc.env, **tc.env_options)
    if not skip:
        return eval_tasks(env, ev, **tc.generator_options)
    skip = set(skip)
    out: list[Task] = []
    for d in ev.difficulties:
        got: list[Task] = []
        for factor in (2, 4, 8, 16):  # a larger draw of the same stream starts with the same tasks
            drawn = sample_tasks(env, seed=ev.seed, stream="eval", difficulties=[d], n=ev.n_tasks * factor,
                                 split=ev.split, **tc.generator_options)
            seen = set(skip)
            got = [t for t in drawn if task_identity(t) not in seen and not seen.add(task_identity(t))][:ev.n_tasks]
            if len(got) == ev.n_tasks:
                break
        if len(got) < ev.n_tasks:
            raise ValueError(f"eval: only {len(got)} of {ev.n_tasks} {d!r} evaluation tasks (split {ev.split}, "
                             f"eval.seed {ev.seed}) are not among the {len(skip)} problems to skip; lower "
                             "eval.n_tasks")
        out += got
    return out


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
