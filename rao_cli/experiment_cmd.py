"""``rao experiment textcraft-tier1|textcraft-cpu``: learning-curve experiments (recursive vs single agent on CPU)."""

from __future__ import annotations

import typer

from rao_cli import make_console
from rao_cli.pipeline_cmd import _key_values

app = typer.Typer(help="Documented experiments (results go to docs/results.md and MLflow).", no_args_is_help=True)
console = make_console()


def _run(experiment: str, config: str, iterations: int | None, arm: list[str], write_docs: bool,
         override: list[str]) -> None:
    from rao_cli.pipeline_cmd import _prefect_env, params_from_options

    _prefect_env()
    from flows.campaign import CampaignParams
    from flows.experiment import ExperimentParams, rao_experiment

    # a bad option names it (--iterations, --arm); a config mistake is one ConfigError line (printed by
    # rao_cli.main); both before any service starts
    params = params_from_options(ExperimentParams, experiment=experiment, config=config, iterations=iterations,
                                 arms=list(arm), write_docs=write_docs, overrides=list(override))
    CampaignParams(config=config, iterations=iterations, overrides=list(override)).resolve()
    out = rao_experiment(params)
    console.print(out["markdown"])


@app.command("textcraft-tier1")
def textcraft_tier1(
    config: str = typer.Option("configs/experiment-textcraft-tier1.yaml", help="Config of both arms."),
    iterations: int = typer.Option(None, help="RL iterations per arm (default: the config's)."),
    arm: list[str] = typer.Option(["recursive", "single"], help="Arms to run (repeatable)."),
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-tier1.json and "
                                    "docs/img/textcraft-tier1.png."),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override for both arms (repeatable)."),
) -> None:
    """The CPU-scale learning curve: warm-start SmolLM2-135M on TextCraft-Synth tier1 tasks, run RAO
    iterations, evaluate 50 held-out tasks after each (recursive arm, then the single-agent arm)."""
    _run("textcraft-tier1", config, iterations, arm, write_docs, override)


@app.command("textcraft-cpu")
def textcraft_cpu(
    config: str = typer.Option("configs/experiment-textcraft-cpu.yaml", help="Config of both arms."),
    iterations: int = typer.Option(None, help="RL iterations per arm (default: the config's)."),
    arm: list[str] = typer.Option(["recursive", "single"], help="Arms to run (repeatable)."),
    write_docs: bool = typer.Option(True, help="Write docs/results.md and docs/img/learning_curve.png."),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override for both arms (repeatable)."),
) -> None:
    """Warm-start SmolLM2-135M, run RAO iterations, evaluate after each; same for a single agent (the paper's
    easy/medium/hard levels, which the 135M model does not learn on CPU: docs/results.md)."""
    _run("textcraft-cpu", config, iterations, arm, write_docs, override)
