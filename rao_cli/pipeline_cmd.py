"""``rao run`` (the main job), ``rao evaluate`` (nightly regression) and ``rao deploy`` (Prefect deployments)."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks stop the services this process started."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _prefect_env() -> None:
    _exit_on_sigterm()
    from infra.orchestration import configure_prefect
    from infra.services import apply_service_env

    apply_service_env()
    configure_prefect()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _summary_table(summary: dict) -> Table:
    t = Table(title=f"campaign {summary['campaign']}: validation success by iteration")
    for c in ("iter", "train success", "signal (samples / groups)", "eval (mode/difficulty: success [95% CI])",
              "version", "champion"):
        t.add_column(c)

    def ev(rows: list[dict]) -> str:
        return "\n".join(f"{r['mode'][:3]}/{r['difficulty']}: {r['success']:.2f} {r['ci95']}" for r in rows)

    if summary.get("base_eval"):
        reg = (summary.get("warm_start") or {}).get("register") or {}
        t.add_row("0", "", "", ev(summary["base_eval"]), str(reg.get("version", "")),
                  "yes" if reg.get("champion") else "")
    for it in summary["iterations"]:
        m = it["metrics"]
        signal = (f"{int(m.get('samples/num_signal_samples', 0))}/{int(m.get('samples/num_samples', 0))} / "
                  f"{int(m.get('samples/num_signal_groups', 0))}/{int(m.get('samples/num_groups', 0))}"
                  + ("" if it["register"].get("updated", True) else "\n(no update)"))
        t.add_row(str(it["iteration"]), f"{m.get('success/root', float('nan')):.2f}", signal, ev(it["eval_rows"]),
                  str(it["register"]["version"]), "yes" if it["register"]["champion"] else "")
    return t


def stage_table(summary: dict) -> Table:
    """Wall time per stage and iteration, and the share spent outside generation and training.

    Orchestration overhead = iteration wall - rollout generation - training - evaluation rollouts
    (evaluation is itself model generation), as a fraction of the iteration wall time.
    """
    stages = ["serve", "generate", "judge", "validate", "train", "serve_new", "evaluate", "register"]
    heads = ["serve", "gen", "judge", "val", "train", "swap", "eval", "reg"]
    t = Table(title="wall time per stage (s); overhead = share outside generation and training")
    for c in ["it", *heads, "total", "ovh"]:
        t.add_column(c, justify="right", no_wrap=True, min_width=len(c))
    for it in summary["iterations"]:
        tm = it["times"]
        total = sum(tm.values())
        model = it["metrics"].get("time/generation_model_s", tm.get("generate", 0.0)) + tm.get("train", 0.0) \
            + tm.get("evaluate", 0.0)
        over = (total - model) / total if total else 0.0
        t.add_row(str(it["iteration"]), *(f"{tm[s]:.0f}" if s in tm else "-" for s in stages), f"{total:.0f}",
                  f"{100 * over:.1f}%")
    return t


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        config: str = typer.Option("configs/cpu-smoke.yaml", help="Campaign config (YAML)."),
        name: str = typer.Option(None, help="Campaign name (resume key); default from the config."),
        iterations: int = typer.Option(None, help="RL iterations."),
        override: list[str] = typer.Option([], "--set", help="KEY=VALUE config override (repeatable)."),
        plan: bool = typer.Option(False, "--plan", help="Print the GPU plan (placement, vLLM and trainer commands, "
                                  "memory per GPU, switch time) and start nothing; exit 1 if it cannot fit."),
        gpus: int = typer.Option(None, "--gpus", min=1, help="With --plan: GPUs of the target machine "
                                 "(default: those nvidia-smi sees)."),
        gpu_mem_gib: float = typer.Option(None, "--gpu-mem-gib", min=1, help="With --plan: memory per GPU, GiB."),
    ) -> None:
        """Run (or resume) a RAO campaign: the main job. Defaults: SmolLM2-135M on TextCraft-Synth easy."""
        if plan:  # nothing is started: no Prefect, S3, MLflow or vLLM
            from infra.plan import run_plan

            run_plan(config, list(override), name=name, iterations=iterations, gpus=gpus, gpu_mem_gib=gpu_mem_gib)
            return
        _prefect_env()
        from infra.models import ModelError, require_model
        from rao_core.config import ConfigError

        try:
            from flows.campaign import CampaignParams, rao_campaign

            params = CampaignParams(config=config, name=name, iterations=iterations, overrides=list(override))
            cfg = params.resolve()  # fail fast with a one-line error before Prefect starts
            if cfg.warm_start.mode != "checkpoint":
                require_model(cfg.model.path)
        except (ConfigError, FileNotFoundError, ModelError) as e:
            console.print(f"[red]error:[/red] {e}", soft_wrap=True)
            raise typer.Exit(2) from None

        from rao_core.train.launch import TrainingProcessError

        try:
            summary = rao_campaign(params)
        except ModelError as e:
            console.print(f"[red]error:[/red] {e}", soft_wrap=True)
            raise typer.Exit(2) from None
        except TrainingProcessError as e:  # one line: the training child's own error and its last stderr lines
            console.print(f"[red]error:[/red] {e}", soft_wrap=True)
            raise typer.Exit(1) from None
        console.print(_summary_table(summary))
        console.print(stage_table(summary))
        from rao_core.paths import rao_home

        console.print(f"wall time: {summary['wall_s']} s")
        console.print(f"artifacts: {summary['s3_prefix']}  (local cache: {rao_home() / 'campaigns' / summary['campaign']})")
        console.print(f"MLflow:    .venv/bin/mlflow ui --backend-store-uri {summary['mlflow_uri']}   (run {summary['mlflow_run_id']})")
        console.print("Prefect:   .venv/bin/rao services up --prefect-server  then open the printed URL "
                      "(or `.venv/bin/prefect server start`)")

    @app.command()
    def evaluate(
        model: str = typer.Option("candidate", help="Alias, version, or models:/ URI of the registered model."),
        config: str = typer.Option("configs/cpu-smoke.yaml", help="Config (serving, runtime, storage)."),
        env: list[str] = typer.Option(["textcraft-synth"], help="Environments of the suite (repeatable)."),
        difficulty: list[str] = typer.Option(["easy"], help="Difficulties (repeatable)."),
        n_tasks: int = typer.Option(8, help="Tasks per difficulty."),
        tolerance: float = typer.Option(None, help="Allowed drop vs champion."),
    ) -> None:
        """Evaluate a registered checkpoint and compare with the champion (the nightly regression)."""
        _prefect_env()
        from flows.evaluate import EvaluateParams, RegressionError, SuiteEntry, rao_evaluate

        suite = [SuiteEntry(env=e, difficulties=list(difficulty), n_tasks=n_tasks) for e in env]
        try:
            out = rao_evaluate(EvaluateParams(config=config, model=model, suite=suite, tolerance=tolerance))
        except RegressionError as e:
            console.print(f"[red]regression:[/red] {e}")
            raise typer.Exit(1) from None
        t = Table(title=f"{out['model']} vs champion (v{out['champion']})")
        for c in ("metric", "champion", "value", "delta", "status"):
            t.add_column(c)
        for r in out["comparison"]:
            t.add_row(*(str(r[c]) for c in ("metric", "champion", "value", "delta", "status")))
        console.print(t)

    @app.command()
    def deploy(
        pool: str = typer.Option("rao-pool", help="Prefect work pool (process type) for the deployments."),
    ) -> None:
        """Create the Prefect deployments of prefect.yaml (campaign on demand, nightly evaluation on cron)."""
        _prefect_env()
        from infra.orchestration import deploy as _deploy, worker_command

        if not os.environ.get("PREFECT_API_URL"):
            console.print("[red]error:[/red] no Prefect server: run `rao services up --prefect-server` first "
                          "(or set PREFECT_API_URL)")
            raise typer.Exit(2)
        rc = _deploy(pool)
        if rc:
            raise typer.Exit(rc)
        console.print(f"deployments created; start a worker: {worker_command(os.environ['PREFECT_API_URL'], pool)}",
                      soft_wrap=True)
