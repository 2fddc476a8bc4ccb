"""Evaluate one checkpoint: serve it once and run evaluation jobs against it.

:func:`serve_and_evaluate` serves ONE checkpoint folder with vLLM as the campaign's servers are built
(``infra.serving.server_from_config`` with ``switching=False``: no LoRA slots, no sleep mode), or uses a running
server or a given policy, and runs every :class:`EvalJob` through ``rao_core.evaluation.run_evaluation``. The one
path of ``rao eval``, the checkpoint studies and the stable-RAO check; a campaign's evaluation stage and the
nightly serve through the flow's pool (``tasks.serve``) and evaluate with ``tasks.stages.run_evaluation`` (Ray
shards, the pool's replicas). Docs: docs/pipeline/evaluation.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rao_core.envs.base import Environment, Task
from rao_core.evaluation import EvalConfig, EvalReport
from rao_core.runtime import RuntimeConfig


class EvalJob(BaseModel):
    """One evaluation against a served checkpoint: which tasks (``config``, or ``tasks`` given), how the agent
    runs (``runtime``), and the ``label`` its progress lines name."""
    model_config = ConfigDict(extra="forbid")

    label: str
    config: EvalConfig
    runtime: RuntimeConfig
    tasks: list[Task] | None = Field(None, description="The tasks (e.g. a task file); None: eval_tasks(config).")


def serving_config(cfg: Any, jobs: Sequence[EvalJob]) -> Any:
    """``cfg`` (a ``rao_core.config.CampaignConfig``) with ``serving.max_model_len`` raised to the largest
    context window of ``jobs`` (unchanged when it already fits): the server must take every job's prompts."""
    need = max([cfg.serving.max_model_len, *(j.runtime.context_window for j in jobs)])
    if need == cfg.serving.max_model_len:
        return cfg
    return cfg.model_copy(update={"serving": cfg.serving.model_copy(update={"max_model_len": need})})


def _tenths_said(label: str, say: Callable[[str], None]) -> Callable[[int, int, Any], None]:
    """A ``run_trees`` progress callback ``(done, total, tree)`` that says ``  <label>: trees d/N, solved s`` at each
    tenth of the trees (``rao_core.progress.every_tenth``; every tree below 20), counting from 0 again at each
    mode's first tree: a job of 100 trees is minutes, and a log file draws no bar."""
    from rao_core.progress import every_tenth

    solved = [0]
    line = every_tenth(lambda done, total: say(f"  {label}: trees {done}/{total}, solved {solved[0]}"))

    def progress(done: int, total: int, tree: Any) -> None:
        solved[0] = (0 if done == 1 else solved[0]) + int(tree is not None and tree.root.verifier == 1.0)
        line(done, total)

    return progress


def serve_and_evaluate(cfg: Any, model: Path, jobs: Sequence[EvalJob], *, env: Environment,
                       base_url: str | None = None, served_name: str | None = None, policy: Any = None,
                       say: Callable[[str], None] = print,
                       on_report: Callable[[EvalJob, EvalReport], None] | None = None) -> list[EvalReport]:
    """Serve checkpoint ``model`` once and run every job of ``jobs`` against it, in order.

    Args:
        cfg: the campaign config whose serving settings and GPU placement start the server
            (``serving.max_model_len`` raised to the jobs' largest window: :func:`serving_config`).
        model: checkpoint folder (its tokenizer's chat template is used by every job).
        jobs: the evaluations (:class:`EvalJob`); a job without ``tasks`` evaluates
            ``rao_core.evaluation.eval_tasks(env, job.config, **cfg.tasks.generator_options)``, the tasks a
            campaign with ``cfg`` holds out.
        env: the environment of the tasks.
        base_url / served_name: use this running OpenAI-compatible server (model name ``served_name``, default
            ``serving.served_model_name``) instead of starting vLLM.
        policy: use this policy (e.g. scripted) instead of any server; closed at the end.
        say: progress lines (the server's start phases, each job's start and result).
        on_report: called with each job and its report as soon as it is done (e.g. to save a partial record).

    Returns:
        One ``EvalReport`` per job, in order. Raises ``infra.serving.ServiceError`` when the server does not
        start or answer; the server is stopped in every case (an interrupt included).
    """
    import asyncio

    from rao_core import evaluation
    from rao_core.runtime import load_tokenizer

    tokenizer = load_tokenizer(str(model))
    options = cfg.tasks.generator_options  # a job without tasks gets the campaign's held-out set, generated alike
    server = None
    reports: list[EvalReport] = []
    key = None  # the policy's default: policy_client_key of the URL
    try:
        if policy is not None:
            url, name = None, "policy"
        elif base_url:
            from infra.serving import wait_for_server
            from rao_core.policies.openai_policy import policy_client_key

            key = policy_client_key(base_url, key_env=cfg.serving.api_key_env)
            wait_for_server(base_url, api_key=key)
            url, name = base_url, served_name or cfg.serving.served_model_name
        else:
            from infra.serving import server_from_config

            server = server_from_config(serving_config(cfg, jobs), model, switching=False)  # as the pool's
            where = f" on GPUs {','.join(map(str, server.gpus))}" if server.gpus else ""
            say(f"starting vLLM on {model}{where} (2-3 minutes on CPU)...")
            server.on_progress = say  # its phases from its log, and a line every 20 s
            server.start()
            url, name, key = server.base_url, server.model, server.api_key
        for job in jobs:
            say(f"evaluating {job.label}")
            tasks = job.tasks if job.tasks is not None else evaluation.eval_tasks(env, job.config, **options)
            report = evaluation.run_evaluation(job.config, env=env, tasks=tasks, runtime=job.runtime,
                                               tokenizer=tokenizer, base_url=url, model=name, api_key=key,
                                               policy=policy,
                                               close_policy=False, progress=_tenths_said(job.label, say))
            reports.append(report)
            for r in report.rows:
                say(f"  {job.label}: {r.mode} {r.difficulty}: success {r.success:.3f} = {r.successes:g} / {r.scored}"
                    f" [{r.ci_low:.2f}, {r.ci_high:.2f}], median tree wall {r.median_tree_wall_s:.1f} s, "
                    f"{r.wall_s:.0f} s in all")
            if on_report is not None:
                on_report(job, report)
    finally:
        if policy is not None:
            asyncio.run(policy.aclose())
        if server is not None:
            server.stop()
    return reports
