"""``rao tasks``: generate seeded RL task files for any registered environment, and summarise task files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import typer

from rao_cli import InputError, env_option, input_errors, make_console

app = typer.Typer(help="Generate and inspect RL task files (JSON lines, one task per line).",
                  no_args_is_help=True)


#: ``--difficulty`` help: each environment's ``difficulties``.
DIFFICULTY_HELP = ("Environment-specific difficulty. TextCraft: tier1 (CPU-scale shape), tier1x<K> (K tier-1 sub-goals, K = 2..12; the delegation shape), nest1, nest2 (nested sub-goals, the recursion shape), easy, medium, hard, "
                   "extreme, or mixed (the four paper levels in turn; the default). Oolong: singledoc_rolls, "
                   "singledoc_spells, multidoc_rolls, multidoc_spells, or mixed (the default). DeepDive: easy, "
                   "medium (default), hard, or k<N> (exactly N hops). ART-E: easy, medium (default), hard.")


def _parse_options(options: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for opt in options:
        if "=" not in opt:
            raise typer.BadParameter(f"--option expects KEY=VALUE, got {opt!r}")
        key, value = opt.split("=", 1)
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


@app.command()
def generate(
    env: str = typer.Option(..., "--env", help="Environment: a name (textcraft-synth, oolong, deepdive, arte, example) or your own class "
                     "by import path 'module:Class' (docs/tutorial.md)."),
    n: int = typer.Option(..., "--n", min=1, help="Number of tasks."),
    seed: int = typer.Option(0, "--seed", help="Generation seed: the same seed gives a byte-identical file."),
    difficulty: str | None = typer.Option(None, "--difficulty", help=DIFFICULTY_HELP),
    split: str = typer.Option("train", "--split", help="train | validation | test."),
    out: Path = typer.Option(..., "--out", dir_okay=False, help="Output .jsonl file (written atomically; an "
                             "existing task file is replaced, any other existing file is refused)."),
    option: list[str] = typer.Option([], "--option", "-o", help="Generator option KEY=VALUE (JSON value), "
                                     "e.g. -o target_tokens=64000 (Oolong) or -o graph_seed=1 (TextCraft)."),
) -> None:
    """Generate N seeded tasks with the environment's generate_tasks and write them to OUT.

    Options are checked (names, types, bounds) by the generator before anything is written. An existing
    OUT is replaced only when it is empty or a task file (every line a task): anything else is refused
    (exit 2) and left as it was.
    """
    from pydantic import ValidationError

    from rao_core.envs import load_tasks, write_tasks
    from rao_core.jsonl import one_line_error

    if out.exists():
        try:
            load_tasks(out)
        except (ValueError, OSError) as e:
            typer.echo(f"error: --out {out} exists and is not a task file ({one_line_error(e)}); choose another "
                       "file or remove it", err=True)
            raise typer.Exit(2) from None

    environment = env_option(env)  # exit 2 naming the known environments
    try:
        tasks = environment.generate_tasks(n=n, seed=seed, difficulty=difficulty, split=split,
                                           **_parse_options(option))
    except (ValueError, NotImplementedError) as e:
        where = "generator option " if isinstance(e, ValidationError) else ""
        typer.echo(f"error: {where}{one_line_error(e)}", err=True)
        raise typer.Exit(2) from None
    path = write_tasks(out, tasks)
    typer.echo(f"wrote {len(tasks)} {env} tasks to {path}")


def task_stats(path: str | Path) -> dict[str, Any]:
    """Per (env, split, difficulty) counts and medians of known size fields of a task file."""
    from rao_core.envs import load_tasks

    groups: dict[tuple[str, str, str], list] = {}
    for t in load_tasks(path):
        groups.setdefault((t.env, t.split, t.difficulty), []).append(t)
    rows = {}
    for (env, split, diff), tasks in sorted(groups.items()):
        row: dict[str, Any] = {"n": len(tasks)}
        d = [t.data for t in tasks]
        if all("gold_plan" in x for x in d):
            row["median_gold_crafts"] = statistics.median(len(x["gold_plan"]) for x in d)
            row["median_inventory_items"] = statistics.median(len(x["inventory"]) for x in d)
            row["median_inventory_units"] = statistics.median(sum(x["inventory"].values()) for x in d)
        if all("context" in x for x in d):
            from rao_core.envs.oolong.synth import approx_tokens

            row["median_context_tokens"] = statistics.median(approx_tokens(x["context"]) for x in d)
        rows[f"{env}/{split}/{diff or '-'}"] = row
    return rows


@app.command()
def stats(path: Path = typer.Argument(..., exists=True, dir_okay=False, help="A task file (.jsonl).")) -> None:
    """Print counts and size statistics of a task file, per environment, split and difficulty.

    A file that is not a task file (a record that is not a task, text that is not UTF-8) or holds no task
    (empty or blank lines only) is an input error: one `error:` line naming the file (and the line), exit 2.
    """
    from rich.table import Table

    with input_errors():
        rows = task_stats(path)
    if not rows:
        raise InputError(f"{path}: holds no task (no non-blank line); `rao tasks generate` writes task files")
    cols = sorted({k for r in rows.values() for k in r if k != "n"})
    table = Table(title=str(path))
    for c in ["group", "n", *cols]:
        table.add_column(c)
    for group, r in rows.items():
        table.add_row(group, str(r["n"]), *(str(r.get(c, "")) for c in cols))
    make_console().print(table)
