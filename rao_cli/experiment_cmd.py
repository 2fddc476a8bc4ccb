"""``rao experiment``: learning-curve experiments on CPU, one command each (textcraft-ablation, textcraft-deeper,
textcraft-nested, textcraft-tier1x, textcraft-tier1, textcraft-cpu: RAO vs an outcome-only ablation vs a single agent;
recursion one level deeper than trained, on the stable default or the old setting; recursive vs single agent), the
update-sweep (the update per batch swept on the training split, run as units only), and the studies of an
experiment's checkpoints (textcraft-generalisation: success and the cause of each miss vs the number of sub-goals K;
textcraft-wallclock: wall-clock one tree at a time, children gathered vs sequential vs the single agent;
``research/studies.py``)."""

from __future__ import annotations

from pathlib import Path

import typer

from rao_cli import make_console
from rao_core.paths import REPO_ROOT
from rao_cli.pipeline_cmd import _key_values

app = typer.Typer(help="Documented experiments (results go to docs/results.md and MLflow).", no_args_is_help=True)
console = make_console()


def _run(experiment: str, config: str, iterations: int | None, arm: list[str], write_docs: bool,
         override: list[str], seeds: list[int] | None = None, single_max_steps: int | None = None,
         single_warm_start: str = "shared", name: str = "", single_checkpoint: str = "") -> None:
    """Run ``experiment`` once per seed (``seeds``; none = the config's), then, for several seeds, write the
    side-by-side and pooled section (``research.records.seeds_markdown``)."""
    from rao_cli.pipeline_cmd import _prefect_env, params_from_options

    _prefect_env()
    from flows.campaign import CampaignParams
    from research.experiment import ExperimentParams, rao_experiment

    # a bad option names it (--iterations, --arm, --seed); a config mistake is one ConfigError line (printed
    # by rao_cli.main); both before any service starts
    runs = [params_from_options(ExperimentParams, experiment=experiment, config=config, iterations=iterations,
                                arms=list(arm), write_docs=write_docs, overrides=list(override), seed=s,
                                single_max_steps=single_max_steps, single_warm_start=single_warm_start,
                                name=name, single_checkpoint=single_checkpoint)
            for s in (seeds or [None])]
    for p in runs:
        CampaignParams(config=config, iterations=iterations, overrides=p.seed_overrides() + list(override)).resolve()
        if single_checkpoint:  # the single arm's warm start, checked as its campaign will check it
            CampaignParams(config=config, iterations=iterations,
                           overrides=[*p.seed_overrides(), *override, "warm_start.mode=checkpoint",
                                      f"warm_start.checkpoint={single_checkpoint}"]).resolve()
    records = []
    for p in runs:
        out = rao_experiment(p)
        console.print(out["markdown"])
        records.append(out["record"])
    if len(records) > 1:
        from research.experiment import write_seeds_section

        console.print(write_seeds_section(name or experiment, records, write_docs))


def _units(experiment: str, config: str, status: bool, unit: str, override: list[str],
           arms: list[str] | None = None, seeds: list[int] | None = None) -> bool:
    """``--status`` / ``--unit``: the experiment as units (``research.units``). ``--status`` prints which units are
    done, which remain, the next command and each unit's time; ``--unit UNIT`` runs that unit from its start and
    writes its record. A bad unit name or config is one ``error:`` line (exit 2) before anything starts. Returns
    False when neither option was given (the command runs the whole experiment). The printed commands name
    ``--config`` only where it is not the command's default."""
    if not status and not unit:
        return False
    if status and unit:
        raise typer.BadParameter("give --status or --unit, not both", param_hint="'--status'")
    from rao_cli import input_errors
    from research.designs import unit_design
    from research.units import plan_units, run_unit, status_text

    with input_errors():
        plan = plan_units(experiment, config, list(override), unit_design(experiment, arms, seeds),
                          default_config=f"configs/experiment-{experiment}.yaml")
        if unit:
            plan.unit(unit)
    if status:
        print(status_text(plan))
        return True
    from rao_cli.pipeline_cmd import _prefect_env

    _prefect_env()
    run_unit(plan, unit, say=lambda m: print(m, flush=True))
    return True


NAME_HELP = ("Name of a variant run (e.g. textcraft-tier1-async with --set algo.max_staleness=1): its record "
             "docs/results/<name>[-seed<S>].json, docs sections and plot, and campaigns <name>[-seed<S>]-<arm>; "
             "default: the experiment's record and the config's campaign name.")
SEED_HELP = ("Seed of the run (task pool, demonstrations, sampling, trainers); repeat for several seeds, reported "
             "side by side and pooled (default: the config's seed).")

# the options every experiment command shares (one definition each)
ITERATIONS = typer.Option(None, help="RL iterations per arm (default: the config's).")
NAME = typer.Option("", help=NAME_HELP)
SEED = typer.Option([], help=SEED_HELP)
SETS = typer.Option([], "--set", callback=_key_values, help="KEY=VALUE override for every arm (repeatable).")
THREE_ARMS = typer.Option(["recursive", "outcome", "single"], help="Arms to run (repeatable): recursive (RAO), "
                          "outcome (outcome-only credit), single (single agent).")
TWO_ARMS = typer.Option(["recursive", "single"], help="Arms to run (repeatable): recursive (RAO), outcome "
                        "(outcome-only credit), single (single agent).")
STATUS = typer.Option(False, "--status", help="Print the experiment's units (a warm start and its evaluation; each "
                      "arm x seed): which are done (their records in docs/results/units/<experiment>/), which remain, "
                      "the next command and each unit's measured or estimated minutes; run nothing.")
UNIT = typer.Option("", "--unit", help="Run this unit (see --status) from its start, from nothing but a clone (it "
                    "rebuilds its warm start), and write its record docs/results/units/<experiment>/<unit>.json at "
                    "its end.")
SINGLE_MAX_STEPS = typer.Option(None, help="Steps of the single agent's node (default: max_steps_per_node x "
                                "(1 + max_children_per_node), a whole recursive tree's).")


@app.command("textcraft-ablation")
def textcraft_ablation(
    config: str = typer.Option("configs/experiment-textcraft-ablation.yaml", help="Config of the three arms."),
    iterations: int = ITERATIONS,
    arm: list[str] = THREE_ARMS,
    name: str = NAME,
    seed: list[int] = SEED,
    single_warm_start: str = typer.Option("own", help="own: the single agent's warm start from single-agent "
                                          "demonstrations; shared: the recursive arm's."),
    single_max_steps: int = SINGLE_MAX_STEPS,
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-ablation[-seed<S>].json "
                                    "and docs/img/textcraft-ablation.png."),
    override: list[str] = SETS,
    status: bool = STATUS,
    unit: str = UNIT,
) -> None:
    """RAO's method tested as the paper tests it: on tier1x2 at a 1536-token window, where the single
    agent can solve the task too, RAO vs an outcome-only recursive ablation vs a single agent with its own warm
    start, the same RL task stream and rollout budget, evaluated on a fresh held-out set (n = 100) with the
    endpoint preregistered in the config; one run per seed."""
    if _units("textcraft-ablation", config, status, unit, override, arm, seed):
        return
    _run("textcraft-ablation", config, iterations, arm, write_docs, override, seed, single_max_steps,
         single_warm_start, name)


@app.command("textcraft-deeper")
def textcraft_deeper(
    config: str = typer.Option("configs/experiment-textcraft-deeper.yaml", help="Config of the three arms."),
    iterations: int = ITERATIONS,
    arm: list[str] = THREE_ARMS,
    name: str = NAME,
    seed: list[int] = SEED,
    single_checkpoint: str = typer.Option("", help="The single agent's warm-start checkpoint (a folder, an s3:// "
                                          "checkpoint folder or a models:/ URI), shared by every seed (default: its "
                                          "own from single-agent demonstrations)."),
    write_docs: bool = typer.Option(True, help="Write docs/results/textcraft-deeper[-seed<S>].json and its plots."),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override for every arm (repeatable), e.g. "
                                       "warm_start.mode=checkpoint and warm_start.checkpoint=DIR: the recursive "
                                       "warm start shared by every seed."),
    status: bool = STATUS,
    unit: str = UNIT,
) -> None:
    """Train one level deep, solve the next, on the stable default (preregistered in the config and
    docs/experiments/textcraft-deeper.md): nest1 training, nest1 and nest2 evaluation on 100 distinct problems
    per level, RAO vs outcome-only credit vs a single agent, one optimizer step per iteration each."""
    if _units("textcraft-deeper", config, status, unit, override, arm, seed):
        return
    _run("textcraft-deeper", config, iterations, arm, write_docs, override, seed, None, "own", name,
         single_checkpoint)


@app.command("update-sweep")
def update_sweep(
    config: str = typer.Option("configs/experiment-update-sweep.yaml", help="Config of the sweep."),
    override: list[str] = SETS,
    status: bool = STATUS,
    unit: str = UNIT,
) -> None:
    """The update per batch swept on the training split (preregistered in the config and
    docs/experiments/update-sweep.md): lr 1e-5, 3e-5, 1e-4 x 1 or 4 minibatches per batch (the 4-minibatch ones
    with the approximate-KL stop), one seed, one shared warm start, each variant one unit; evaluated on 100
    training-split tier1 problems no unit trains on. It runs as units only: --status, then --unit UNIT."""
    if _units("update-sweep", config, status, unit, override):
        return
    from rao_cli import InputError

    raise InputError("update-sweep runs as units only: give --status (the units and the next command) or --unit UNIT")


@app.command("textcraft-nested")
def textcraft_nested(
    config: str = typer.Option("configs/experiment-textcraft-nested.yaml", help="Config of the experiment."),
    iterations: int = ITERATIONS,
    arm: list[str] = typer.Option(["recursive"], help="Arms to run (repeatable): recursive (RAO; the experiment), "
                                  "outcome (outcome-only credit), single (single agent)."),
    name: str = NAME,
    seed: list[int] = SEED,
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-nested[-seed<S>].json, "
                                    "docs/img/textcraft-nested.png and docs/img/textcraft-nested-depth.png."),
    override: list[str] = SETS,
    status: bool = STATUS,
    unit: str = UNIT,
) -> None:
    """Recursion one level deeper than trained: warm-start SmolLM2-135M on demonstrations of the
    expert that recurses on TextCraft-Synth nest1 tasks (a tier-2 target made of two tier-1 sub-goals: trees of
    depth 1), run RAO iterations on nest1 with max_depth 4 (never binding) at a 1344-token window, and evaluate
    after each on fresh held-out nest1 and nest2 tasks (nest2: depth 2, never seen in training), n = 100 per
    point, endpoint preregistered in the config; per depth: nodes, success, delegation, children, end reasons,
    and the depth histogram of the evaluated trees; one run per seed."""
    if _units("textcraft-nested", config, status, unit, override, arm, seed):
        return
    _run("textcraft-nested", config, iterations, arm, write_docs, override, seed, name=name)


@app.command("textcraft-tier1x")
def textcraft_tier1x(
    config: str = typer.Option("configs/experiment-textcraft-tier1x.yaml", help="Config of both arms."),
    iterations: int = ITERATIONS,
    arm: list[str] = TWO_ARMS,
    name: str = NAME,
    seed: list[int] = SEED,
    single_max_steps: int = SINGLE_MAX_STEPS,
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-tier1x.json and "
                                    "docs/img/textcraft-tier1x.png."),
    override: list[str] = SETS,
    status: bool = STATUS,
    unit: str = UNIT,
) -> None:
    """The delegation experiment: warm-start SmolLM2-135M on TextCraft-Synth tier1x<K> tasks (K tier-1
    sub-goals that do not fit one node's window), run RAO iterations, evaluate 50 held-out tasks per split
    after each (K = 2, trained; K = 3, harder than anything trained on), recursive arm then the single-agent
    arm (`--name X`: campaigns X-recursive and X-single, record docs/results/X.json)."""
    if _units("textcraft-tier1x", config, status, unit, override, arm, seed):
        return
    _run("textcraft-tier1x", config, iterations, arm, write_docs, override, seed, single_max_steps, name=name)


@app.command("textcraft-tier1")
def textcraft_tier1(
    config: str = typer.Option("configs/experiment-textcraft-tier1.yaml", help="Config of both arms."),
    iterations: int = ITERATIONS,
    arm: list[str] = TWO_ARMS,
    name: str = NAME,
    seed: list[int] = SEED,
    write_docs: bool = typer.Option(True, help="Write docs/results.md, docs/results/textcraft-tier1.json and "
                                    "docs/img/textcraft-tier1.png."),
    override: list[str] = SETS,
    status: bool = STATUS,
    unit: str = UNIT,
) -> None:
    """The CPU-scale learning curve: warm-start SmolLM2-135M on TextCraft-Synth tier1 tasks, run RAO
    iterations, evaluate 50 held-out tasks after each (recursive arm, then the single-agent arm)."""
    if _units("textcraft-tier1", config, status, unit, override, arm, seed):
        return
    _run("textcraft-tier1", config, iterations, arm, write_docs, override, seed, name=name)


@app.command("textcraft-cpu")
def textcraft_cpu(
    config: str = typer.Option("configs/experiment-textcraft-cpu.yaml", help="Config of both arms."),
    iterations: int = ITERATIONS,
    arm: list[str] = TWO_ARMS,
    write_docs: bool = typer.Option(True, help="Write docs/results.md and docs/img/learning_curve.png."),
    override: list[str] = SETS,
    status: bool = STATUS,
    unit: str = UNIT,
) -> None:
    """Warm-start SmolLM2-135M, run RAO iterations, evaluate after each; same for a single agent (the paper's
    easy/medium/hard levels, which the 135M model does not learn on CPU: docs/results.md)."""
    if _units("textcraft-cpu", config, status, unit, override, arm, None):
        return
    _run("textcraft-cpu", config, iterations, arm, write_docs, override)


@app.command("seeds")
def seeds(
    experiment: str = typer.Argument(..., help="Experiment whose stored records to report, e.g. textcraft-tier1x."),
    write_docs: bool = typer.Option(True, help="Write the '## Seeds: <experiment>' section of docs/results.md."),
) -> None:
    """Report every stored seed of an experiment side by side and pooled (docs/results/<experiment>.json and
    <experiment>-seed<S>.json, e.g. seeds run in separate sessions or on other machines; an experiment run as
    units: its unit records, docs/results/units/<experiment>/, assembled per seed by research.units.seed_records)."""
    from research.experiment import write_seeds_section
    from research.records import seed_records
    from research.units import UNITS_DIR

    from rao_cli import input_errors

    with input_errors():  # no record, or one that is not JSON: one error: line naming it, exit 2
        if (REPO_ROOT / UNITS_DIR / experiment).is_dir():
            from research.designs import unit_design
            from research.units import control_records, plan_units, seed_records as unit_seed_records

            plan = plan_units(experiment, f"configs/experiment-{experiment}.yaml", [], unit_design(experiment))
            if plan.design.variants:
                raise ValueError(f"{experiment} is a sweep of config variants: it is read by its preregistered "
                                 f"decision rule (docs/experiments/{experiment}.md), not by a seeds section")
            records = unit_seed_records(plan)
            if not records:
                raise FileNotFoundError(f"no finished arm unit of {experiment} under {UNITS_DIR}/{experiment} (rao "
                                        f"experiment {experiment} --status)")
            controls = control_records(plan, records)
        else:
            records, controls = seed_records(experiment), None
    console.print(write_seeds_section(experiment, records, write_docs, controls=controls))


@app.command("rerun")
def rerun(
    first: Path = typer.Argument(..., help="The first run's record, e.g. docs/results/textcraft-ablation.json."),
    second: Path = typer.Argument(..., help="The second run's record, of the same design and held-out tasks."),
) -> None:
    """Two runs of one design compared on the same held-out tasks (a seed retrained, or run on another machine):
    per point, each run's successes and interval, the tasks only one solved, and a two-sided exact sign test on
    them (how far two runs of one seed differ: research.records.rerun_comparison). Prints a markdown table."""
    import json

    from research.records import rerun_markdown

    from rao_cli import input_errors

    with input_errors():  # a missing or non-JSON record, or records of other tasks: one error: line, exit 2
        recs = []
        for p in (first, second):
            try:
                recs.append(json.loads(p.read_text()))
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: not a JSON record: {e}") from None
            except FileNotFoundError:
                raise FileNotFoundError(f"record not found: {p}") from None
        md = rerun_markdown(recs[0], recs[1], (str(first), str(second)))
    console.print(md, markup=False)


RECORD_HELP = "Experiment record whose checkpoints (each arm's last iteration), configs and evaluation seed are used."
STUDY_DOCS_HELP = ("Write docs/results/{name}.json, its stored trees and the {doc} section (else all of it goes to "
                   "a folder ./{name}/ and the section is only printed).")


def _arm_paths(values: list[str]) -> list[str]:
    """typer callback of ``--model`` (generalisation): every value is ARM=PATH."""
    for v in values:
        arm, _, path = v.partition("=")
        if not arm.strip() or not path.strip():
            raise typer.BadParameter(f"expected ARM=PATH (e.g. single=/path/to/checkpoint), got {v!r}")
    return values


DRY_RUN_HELP = "Print the plan (checkpoints, evaluations, runtimes, task sets checked) and start nothing."


def _run_study(plan_fn, write_docs: bool, dry_run: bool, **options) -> None:
    """Plan the study (every input checked: one ``error:`` line, exit 2, before any server starts); with
    ``dry_run`` print the plan and stop; else run it interruptibly (Ctrl-C / SIGTERM: the server stopped, the
    record so far kept, exit 130 / 143; the same command resumes from it: ``research.studies.run_study``) and print
    its markdown section."""
    from pathlib import Path

    from rao_cli import input_errors
    from research.studies import plan_text, run_study

    with input_errors():
        plan = plan_fn(**options)
    if dry_run:
        print(plan_text(plan))
        return
    from infra.process import run_interruptible

    def on_interrupt(signum: int) -> str:
        import signal

        return (f"interrupted ({signal.Signals(signum).name}): {plan.name} stopped; the points done so far are in "
                f"docs/results/{plan.name}.json (complete: false); the same command resumes from them")

    root = None if write_docs else Path(plan.name).resolve()
    out = run_interruptible(lambda: run_study(plan, write_docs=write_docs, root=root,
                                              say=lambda m: print(m, flush=True)), on_interrupt)
    print(out["markdown"])
    print(f"record: {out['record_path']}")


@app.command("textcraft-generalisation")
def textcraft_generalisation(
    record: str = typer.Option("docs/results/textcraft-ablation.json", help=RECORD_HELP),
    arm: list[str] = typer.Option(["recursive", "single"], help="Arms whose last checkpoint is evaluated (repeatable): "
                                  "recursive (RAO), outcome (outcome-only credit), single (single agent)."),
    n: int = typer.Option(100, min=1, help="Held-out tasks per K (the record's eval.seed, split validation)."),
    k: list[int] = typer.Option([2, 3, 4, 5], "--k", help="K of the TextCraft-Synth shape tier1x<K> (K distinct "
                                "tier-1 targets; repeatable)."),
    model: list[str] = typer.Option([], "--model", callback=_arm_paths, help="ARM=PATH: evaluate this checkpoint "
                                    "folder for ARM instead of the record's last (repeatable)."),
    write_docs: bool = typer.Option(True, help=STUDY_DOCS_HELP.format(name="textcraft-generalisation[-seed<S>]",
                                                                      doc="docs/results.md (with its plot)")),
    dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override of every arm's config (repeatable), e.g. "
                                       "runtime.tree_timeout_s=600."),
) -> None:
    """Generalisation as a curve: the last checkpoints of the ablation's arms evaluated on
    tier1x2..tier1x5 (n per K, fresh held-out tasks), each arm in its own mode, every miss attributed to one
    cause from its execution tree (child given two targets, children failed, the root's window, a limit, an
    error, the root finished wrong). Each checkpoint is served once. Writes
    docs/results/textcraft-generalisation[-seed<S>].json and a section with a plot in docs/results.md."""
    from research.studies import plan_generalisation

    models = dict(v.partition("=")[::2] for v in model)
    command = (f"rao experiment textcraft-generalisation --record {record}" + "".join(f" --arm {a}" for a in arm)
               + f" --n {n}" + "".join(f" --k {x}" for x in k) + "".join(f" --model {v}" for v in model)
               + "".join(f" --set {o}" for o in override))
    _run_study(plan_generalisation, write_docs, dry_run, record=record, arms=list(arm), n=n, ks=list(k), models=models,
               overrides=list(override), command=command)


@app.command("textcraft-wallclock")
def textcraft_wallclock(
    record: str = typer.Option("docs/results/textcraft-ablation.json", help=RECORD_HELP),
    model: str = typer.Option(None, "--model", help="Recursive checkpoint folder (default: the record's recursive "
                              "arm's last)."),
    single_model: str = typer.Option(None, "--single-model", help="Single agent's checkpoint folder (default: the "
                                     "record's single arm's last)."),
    n: int = typer.Option(30, min=1, help="Held-out tasks per K (the record's eval.seed, split validation)."),
    k: list[int] = typer.Option([2, 3, 4, 6], "--k", help="K of tier1x<K> (repeatable)."),
    single_window: int = typer.Option(4096, min=128, help="The single agent's context window (tokens): one that fits "
                                      "the task; the server's max_model_len is raised to it."),
    setting: list[str] = typer.Option(["gather", "sequential", "single"], "--setting", help="Settings (repeatable): "
                                      "gather (children as the policy launches them), sequential "
                                      "(runtime.sequential_children), single (delegation off, --single-window)."),
    write_docs: bool = typer.Option(True, help=STUDY_DOCS_HELP.format(name="textcraft-wallclock",
                                                                      doc="docs/benchmarks.md")),
    dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override of every setting's config (repeatable)."),
) -> None:
    """Wall-clock, one tree at a time: a trained recursive checkpoint with
    runtime.max_concurrent_trees 1, children gathered as the policy writes them vs forced sequential
    (runtime.sequential_children), and the single agent with a window that fits, on tier1x2, 3, 4, 6 (n tasks
    each): median wall-clock and completion tokens per tree, success with its Wilson interval, and the ratios
    sequential / gather and single / gather per K. Writes docs/results/textcraft-wallclock.json and a section of
    docs/benchmarks.md."""
    from research.studies import plan_wallclock

    command = (f"rao experiment textcraft-wallclock --record {record}" + (f" --model {model}" if model else "")
               + (f" --single-model {single_model}" if single_model else "") + f" --n {n}"
               + "".join(f" --k {x}" for x in k) + f" --single-window {single_window}"
               + "".join(f" --setting {x}" for x in setting) + "".join(f" --set {o}" for o in override))
    _run_study(plan_wallclock, write_docs, dry_run, record=record, model=model, single_model=single_model, n=n, ks=list(k),
               single_window=single_window, settings=list(setting), overrides=list(override), command=command)

@app.command("depth-control")
@app.command("textcraft-nested-control", hidden=True)  # the name the nested experiment's records print
def depth_control(
    record: str = typer.Option("docs/results/textcraft-nested.json", help="Record of a nested-shape experiment "
                               "(textcraft-nested, textcraft-deeper) whose recursive checkpoints, config, evaluation "
                               "seed and trees at full depth are used."),
    iteration: list[int] = typer.Option([], "--iteration", help="Iterations whose checkpoint is evaluated "
                                        "(repeatable; default: the warm start and the last)."),
    difficulty: str = typer.Option("nest2", help="The record's evaluated split to repeat at max_depth 1."),
    n: int = typer.Option(None, min=1, help="Tasks (default: the record's n; at most that, the first n pair with "
                          "the record's trees)."),
    write_docs: bool = typer.Option(True, help=STUDY_DOCS_HELP.format(name="<experiment>-control[-seed<S>]",
                                                                      doc="docs/results.md")),
    dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
    override: list[str] = typer.Option([], "--set", callback=_key_values,
                                       help="KEY=VALUE override of the config (repeatable)."),
) -> None:
    """The depth-limited control: a nested-shape experiment's recursive checkpoints on its own
    nest2 tasks with runtime.max_depth 1 (the root may delegate, its children may not), paired by task with the
    record's trees at full depth: what depth buys, measured. Each checkpoint is served once. Writes
    docs/results/<experiment>-control[-seed<S>].json (e.g. textcraft-nested-control-seed1) and a section in
    docs/results.md."""
    from research.studies import plan_depth_control

    command = (f"rao experiment depth-control --record {record}"
               + "".join(f" --iteration {i}" for i in iteration) + f" --difficulty {difficulty}"
               + (f" --n {n}" if n else "") + "".join(f" --set {o}" for o in override))
    _run_study(plan_depth_control, write_docs, dry_run, record=record, iterations=list(iteration),
               difficulty=difficulty, n=n, overrides=list(override), command=command)
