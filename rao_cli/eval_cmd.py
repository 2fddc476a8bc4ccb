"""``rao eval``: evaluate any checkpoint folder on any task file, with the campaign's evaluation code.

The command is one job of ``infra.checkpoint_eval.serve_and_evaluate``, the serve-then-evaluate path the checkpoint
studies share (``rao experiment textcraft-generalisation`` / ``textcraft-wallclock``): it serves the
checkpoint with vLLM as the campaign's serving stage does (``infra.serving.server_from_config``: the serving
settings and the GPU placement of ``--config``, i.e. ``gpus.serve`` as CUDA_VISIBLE_DEVICES and vLLM's
tensor/data parallelism; no LoRA slots, no sleep mode; ``max_model_len`` at least the runtime's context
window) or uses a running OpenAI-compatible server (``--base-url``), then calls
``rao_core.evaluation.run_evaluation``, the function behind the campaign's, the experiment's and the
nightly evaluations, with the runtime limits of ``--config``. It prints the success rate with its Wilson
95% interval; ``--json`` prints exactly one JSON object on stdout (everything else goes to stderr).
Ctrl-C or SIGTERM stops it within seconds (``infra.process.run_interruptible``, as ``rao run``): the vLLM
server it started and every REPL are stopped, one ``error: interrupted ...`` line, exit 130 / 143.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def _load(config: str, overrides: list[str]):
    """The campaign config of ``config`` (a path, or relative to the repository) with ``--set`` overrides."""
    from rao_core.config import load_config
    from rao_core.paths import REPO_ROOT

    path = Path(config)
    if not path.is_absolute() and not path.exists():
        path = REPO_ROOT / path
    return load_config(path, list(overrides))


def check_base_url(base_url: str, key_env: str) -> None:
    """Ask the server at ``--base-url`` for its models once (``GET {base_url}/models``) with the key it gets
    (``rao_core.policies.openai_policy.policy_client_key``: the installation's service its own key, any other
    server the variable ``key_env`` names). Raises :class:`rao_cli.InputError` (exit 2) when it answers 401 or
    403: the server refused the key, which is named by where it came from, never shown. A server that does not
    answer (yet) is left to the evaluation's own wait."""
    import httpx

    from rao_cli import InputError
    from rao_core.policies.openai_policy import policy_client_key

    key = policy_client_key(base_url, key_env=key_env)
    try:
        r = httpx.get(f"{base_url.rstrip('/')}/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    except httpx.HTTPError:
        return
    if r.status_code in (401, 403):
        import os

        sent = (f"no key (${key_env} is unset)" if key == "EMPTY" else
                f"the key in ${key_env}" if key == os.environ.get(key_env) else "this installation's key for it")
        raise InputError(f"--base-url {base_url}: the server refused the key (HTTP {r.status_code}; sent {sent}); "
                         f"set {key_env} (serving.api_key_env) to its key, or use the server `rao services up "
                         "--model` started")


def register(app: typer.Typer) -> None:
    """Add ``rao eval`` to the top-level app."""

    @app.command("eval")
    def eval_cmd(
        model: Path = typer.Option(..., "--model", help="Checkpoint folder (config.json, weights, tokenizer)."),
        task_file: Path = typer.Option(..., "--task-file", help="JSON-lines task file (one environment)."),
        mode: str = typer.Option("recursive", "--mode", help="recursive (delegation on) | single (off)."),
        n: int = typer.Option(None, "--n", min=1, help="Evaluate the first N tasks of the file (default: all)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object {n, successes, success, "
                                     "ci95, mean_depth, delegation_rate, child_success, tree_wall_s, "
                                     "tokens_per_success} on stdout."),
        base_url: str = typer.Option(None, "--base-url", help="Use this running OpenAI-compatible server "
                                     "(serving --model) instead of starting vLLM."),
        served_name: str = typer.Option(None, "--served-model-name", help="Model name sent to --base-url "
                                        "(default: serving.served_model_name of the config)."),
        config: str = typer.Option("configs/cpu-smoke.yaml", "--config", help="Campaign config whose "
                                   "runtime limits, serving settings and eval.graded are used."),
        override: list[str] = typer.Option([], "--set", help="KEY=VALUE config override (repeatable), e.g. "
                                           "runtime.temperature=0.7."),
    ) -> None:
        """Evaluate a checkpoint on a task file: success with its Wilson 95% interval (one tree per task)."""
        from infra.models import ModelError
        from rao_cli import InputError, input_errors
        from rao_core.envs import get_env, load_tasks
        from rao_core.evaluation import EvalConfig, render_report
        from rao_core.runtime import load_tokenizer

        if mode not in ("recursive", "single"):
            raise typer.BadParameter(f"must be 'recursive' or 'single', got {mode!r}", param_hint="'--mode'")
        from rao_core.config import checkpoint_config_problem

        cfg = _load(config, override)  # ConfigError: exit 2
        if not (model / "config.json").exists():
            raise ModelError(f"model not found: {model} has no config.json (a checkpoint folder is expected)")
        if (bad := checkpoint_config_problem(model)) is not None:
            raise ModelError(f"--model {model}: {bad}")
        with input_errors():  # the reader names the file and the line
            tasks = load_tasks(task_file)
            envs = sorted({t.env for t in tasks})
            if not tasks:
                raise InputError(f"{task_file} holds no task")
            if len(envs) > 1:
                raise InputError(f"{task_file} mixes environments {envs}; rao eval takes one environment per file")
            env = get_env(envs[0], **(cfg.tasks.env_options if cfg.tasks.env == envs[0] else {}))
            tasks = load_tasks(task_file, env)  # every record checked against its environment
        if n is not None:
            if n > len(tasks):
                raise typer.BadParameter(f"{n} is more than the {len(tasks)} tasks of {task_file}",
                                         param_hint="'--n'")
            tasks = tasks[:n]
        ev = EvalConfig(modes=[mode], graded=cfg.eval.graded)  # the tasks are given: only modes/graded matter
        load_tokenizer(str(model))  # a checkpoint without a chat template fails here, before any server starts
        if base_url:
            from infra.services import apply_service_env

            apply_service_env()  # `rao services up --model`'s server: its URL and key, the key for that URL alone
            check_base_url(base_url, cfg.serving.api_key_env)  # a server that refuses the key: exit 2, now
        say = (lambda msg: print(msg, file=sys.stderr)) if as_json else print

        def evaluate() -> object:
            from infra.checkpoint_eval import EvalJob, serve_and_evaluate

            job = EvalJob(label=f"{len(tasks)} {env.name} tasks of {task_file}, mode {mode}", config=ev,
                          runtime=cfg.runtime, tasks=tasks)
            return serve_and_evaluate(cfg, model, [job], env=env, base_url=base_url, served_name=served_name,
                                      say=say)[0]

        def on_interrupt(signum: int) -> str:
            import signal

            return f"interrupted ({signal.Signals(signum).name}): evaluation of {model} on {task_file} stopped"

        from infra.process import run_interruptible

        # Ctrl-C / SIGTERM: the server (and every REPL) stopped, one error: line, exit 130 / 143
        report = run_interruptible(evaluate, on_interrupt)
        row = report.pooled(mode)
        if as_json:
            print(json.dumps(row.summary()))
            return
        from rao_cli import make_console

        render_report(report, console=make_console(), title=f"{model} on {task_file}")
        extra = f", {row.unscored} unscored" if row.unscored else ""
        print(f"success {row.success:.3f} (95% CI [{row.ci_low:.3f}, {row.ci_high:.3f}]) = {row.successes:g} / "
              f"{row.scored} tasks{extra}; mean depth {row.mean_depth:.2f}, delegation rate "
              f"{row.delegation_rate:.2f}")
        if row.misses:  # rao_core.evaluation.miss_cause: one cause per missed task
            print("missed: " + ", ".join(f"{c} {k}" for c, k in row.misses.items()))
