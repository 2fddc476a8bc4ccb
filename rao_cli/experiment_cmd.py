"""``rao experiment``: learning-curve experiments on CPU, one command each (textcraft-ablation, textcraft-nested,
textcraft-tier1x, textcraft-tier1, textcraft-cpu: RAO vs an outcome-only ablation vs a single agent; recursion one
level deeper than trained; recursive vs single agent)."""

from __future__ import annotations

import typer

from rao_cli import make_console
from rao_cli.pipeline_cmd import _key_values

app = typer.Typer(help="Documented experiments (results go to docs/results.md and MLflow).", no_args_is_help=True)
console = make_console()


def _run(experiment: str, config: str, iterations: int | None, arm: list[str], write_docs: bool,
         override: list[str], seeds: list[int] | None = None, single_max_steps: int | None = None,
         single_warm_start: str = "shared") -> None:
    """Run ``experiment`` once per seed (``seeds``; none = the config's), then, for several seeds, write the
    side-by-side and pooled section (``tasks.experiment.seeds_markdown``)."""
    from rao_cli.pipeline_cmd import _prefect_env, params_from_options

    _prefect_env()
    from flows.campaign import CampaignParams
    from flows.experiment import ExperimentParams, rao_experiment

    # a bad option names it (--iterations, --arm, --seed); a config mistake is one ConfigError line (printed
    # by rao_cli.main); both before any service starts
    runs = [params_from_options(ExperimentParams, experiment=experiment, config=config, iterations=iterations,
                                arms=list(arm), write_docs=write_docs, overrides=list(override), seed=s,
                                single_max_steps=single_max_steps, single_warm_start=single_warm_start)
            for s in (seeds or [None])]
    for p in runs:
        CampaignParams(config=config, iterations=iterations, overrides=p.seed_overrides() + list(override)).resolve()
    records = []
    for p in runs:
        out = rao_experiment(p)
        console.print(out["markdown"])
        records.append(out["record"])
    if len(records) > 1:
        from tasks.experiment import write_seeds_section

        console.print(write_seeds_section(experiment, records, write_docs))


SEED_HELP = ("Seed of the run (task pool, demonstrations, sampling, trainers); repeat for several seeds, reported "
             "side by side and pooled (default: the config's seed).")


@app.command("textcraft-ablation")
def textcraft_ablation(
    config: str = typer.Option("configs/experiment-textcraft-ablation.yaml", help="Config of the three arms."),
    iterations: int = typer.Option(None, help="RL iterations per arm (default: the config's)."),
    arm: list[str] = typer.Option(["recursive", "outcome", "single"], help="Arms to run (repeatable): recursive "
                                  "(RAO), outcome (outcome-only credit), single (single agent)."),
    seed: list[int] = typer.Option([], help=SEED_HELP),
    single_warm_start: str = typer.Option("own", help="own: the single agent's warm start from single-agent "
                                          "demonstrations; shared: the recursive arm's."),
    single_max_steps: int = typer.Option(None, help="Steps of the single agent's node (default: max_steps_per_node "
                                         "x (1 + max_children_per_node), a whole recursive tree's)."),
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-ablation[-seed<S>].json "
                                    "and docs/img/textcraft-ablation.png."),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override for every arm (repeatable)."),
) -> None:
    """RAO's method tested as the paper tests it (issue 38): on tier1x2 at a 1536-token window, where the single
    agent can solve the task too, RAO vs an outcome-only recursive ablation vs a single agent with its own warm
    start, the same RL task stream and rollout budget, evaluated on a fresh held-out set (n = 100) with the
    endpoint preregistered in the config; one run per seed."""
    _run("textcraft-ablation", config, iterations, arm, write_docs, override, seed, single_max_steps,
         single_warm_start)


@app.command("textcraft-nested")
def textcraft_nested(
    config: str = typer.Option("configs/experiment-textcraft-nested.yaml", help="Config of the experiment."),
    iterations: int = typer.Option(None, help="RL iterations (default: the config's)."),
    arm: list[str] = typer.Option(["recursive"], help="Arms to run (repeatable): recursive (RAO; the experiment), "
                                  "outcome (outcome-only credit), single (single agent)."),
    seed: list[int] = typer.Option([], help=SEED_HELP),
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-nested[-seed<S>].json, "
                                    "docs/img/textcraft-nested.png and docs/img/textcraft-nested-depth.png."),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override for every arm (repeatable)."),
) -> None:
    """Recursion one level deeper than trained (issue 39): warm-start SmolLM2-135M on demonstrations of the
    expert that recurses on TextCraft-Synth nest1 tasks (a tier-2 target made of two tier-1 sub-goals: trees of
    depth 1), run RAO iterations on nest1 with max_depth 4 (never binding) at a 1344-token window, and evaluate
    after each on fresh held-out nest1 and nest2 tasks (nest2: depth 2, never seen in training), n = 100 per
    point, endpoint preregistered in the config; per depth: nodes, success, delegation, children, end reasons,
    and the depth histogram of the evaluated trees; one run per seed."""
    _run("textcraft-nested", config, iterations, arm, write_docs, override, seed)


@app.command("textcraft-tier1x")
def textcraft_tier1x(
    config: str = typer.Option("configs/experiment-textcraft-tier1x.yaml", help="Config of both arms."),
    iterations: int = typer.Option(None, help="RL iterations per arm (default: the config's)."),
    arm: list[str] = typer.Option(["recursive", "single"], help="Arms to run (repeatable)."),
    seed: list[int] = typer.Option([], help=SEED_HELP),
    single_max_steps: int = typer.Option(None, help="Steps of the single agent's node (default: max_steps_per_node "
                                         "x (1 + max_children_per_node), a whole recursive tree's)."),
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-tier1x.json and "
                                    "docs/img/textcraft-tier1x.png."),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override for both arms (repeatable)."),
) -> None:
    """The delegation experiment: warm-start SmolLM2-135M on TextCraft-Synth tier1x<K> tasks (K tier-1
    sub-goals that do not fit one node's window), run RAO iterations, evaluate 50 held-out tasks per split
    after each (K = 2, trained; K = 3, harder than anything trained on), recursive arm then the single-agent
    arm (`--set name=X`: campaigns X-recursive and X-single)."""
    _run("textcraft-tier1x", config, iterations, arm, write_docs, override, seed, single_max_steps)


@app.command("textcraft-tier1")
def textcraft_tier1(
    config: str = typer.Option("configs/experiment-textcraft-tier1.yaml", help="Config of both arms."),
    iterations: int = typer.Option(None, help="RL iterations per arm (default: the config's)."),
    arm: list[str] = typer.Option(["recursive", "single"], help="Arms to run (repeatable)."),
    seed: list[int] = typer.Option([], help=SEED_HELP),
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-tier1.json and "
                                    "docs/img/textcraft-tier1.png."),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override for both arms (repeatable)."),
) -> None:
    """The CPU-scale learning curve: warm-start SmolLM2-135M on TextCraft-Synth tier1 tasks, run RAO
    iterations, evaluate 50 held-out tasks after each (recursive arm, then the single-agent arm)."""
    _run("textcraft-tier1", config, iterations, arm, write_docs, override, seed)


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


@app.command("seeds")
def seeds(
    experiment: str = typer.Argument(..., help="Experiment whose stored records to report, e.g. textcraft-tier1x."),
    write_docs: bool = typer.Option(True, help="Write the '## Seeds: <experiment>' section of docs/results.md."),
) -> None:
    """Report every stored seed of an experiment side by side and pooled (docs/results/<experiment>.json and
    <experiment>-seed<S>.json, e.g. seeds run in separate sessions or on other machines)."""
    from tasks.experiment import seed_records, write_seeds_section

    from rao_cli import input_errors

    with input_errors():  # no record, or one that is not JSON: one error: line naming it, exit 2
        records = seed_records(experiment)
    console.print(write_seeds_section(experiment, records, write_docs))
