"""`rao solve`: grow one execution tree for one task and show it live."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import Field

from rao_cli import InputError, env_option, input_errors, make_console

#: ``--script``: the assistant messages a scripted policy replays (turn k gets message k, the last repeats).
Script = Annotated[list[str], Field(min_length=1)]


def _render(tree):  # -> rich.tree.Tree
    from rich.tree import Tree

    def label(n) -> str:
        colour = {"finished": "green", "running": "yellow"}.get(n.end_reason.value, "red")
        score = "" if n.verifier is None else f"verifier={n.verifier:g} "  # the node's own check, once it ended
        return (f"[{colour}]{n.node_id}[/] d{n.depth} [{colour}]{n.end_reason.value}[/] turns={len(n.turns)} "
                f"tok={len(n.token_ids)} {score}{_line(n.goal, 120)}")

    root = Tree(label(tree.root))
    items = {tree.root_id: root}
    for n in tree.walk():
        if n.parent_id is not None and n.parent_id in items:
            items[n.node_id] = items[n.parent_id].add(label(n))
    return root


def _line(text: object, limit: int = 300) -> str:
    """``text`` on one line (whitespace collapsed), cut to ``limit`` characters, escaped for rich markup."""
    from rich.markup import escape

    one = " ".join(str(text).split())
    return escape(one if len(one) <= limit else one[:limit - 3] + "...")


def _read_script(path: Path) -> list[str]:
    """The ``--script`` file: a JSON list of assistant messages (strings); one-line ValueError naming the file."""
    from pydantic import TypeAdapter, ValidationError

    from rao_core.jsonl import one_line_error

    if not path.is_file():
        raise FileNotFoundError(f"--script file not found: {path}")
    try:
        return TypeAdapter(Script).validate_json(path.read_bytes())
    except ValidationError as e:
        raise ValueError(f"--script {path}: expected a non-empty JSON list of assistant messages (strings): "
                         f"{one_line_error(e)}") from None


def register(app: typer.Typer) -> None:
    """Add ``rao solve`` to ``app``."""

    @app.command("solve")
    def solve(env: str = typer.Option(..., "--env", help="Environment: a name, e.g. textcraft-synth, or your own "
                                  "class by import path 'module:Class' (docs/tutorial.md)."),
              task_file: Path = typer.Option(..., "--task-file", help="JSON-lines task file."),
              task_index: int = typer.Option(0, "--task-index", help="Which task of the file (0-based)."),
              policy: str = typer.Option("oracle", "--policy", help="oracle | scripted | endpoint."),
              max_depth: int = typer.Option(2, "--max-depth", help="Max node depth (0 = single agent)."),
              base_url: str = typer.Option("", "--base-url", help="OpenAI-compatible URL (endpoint)."),
              model: str = typer.Option("", "--model", help="Served model name (endpoint)."),
              tokenizer: str = typer.Option("", "--tokenizer", help="Checkpoint folder with the tokenizer."),
              script: Path = typer.Option(None, "--script", help="scripted: JSON list of assistant messages."),
              sandbox: str = typer.Option("bwrap", "--sandbox", help="bwrap | none."),
              out: Path = typer.Option(None, "--out", help="Write the tree here (JSON lines, one line).")) -> None:
        """Solve one task with a policy, showing the execution tree as it grows."""
        import asyncio

        from rich.live import Live

        from rao_cli.pipeline_cmd import params_from_options
        from rao_core.envs import load_tasks
        from rao_core.paths import default_model_path, tiny_model_path
        from rao_core.runtime import RuntimeConfig, oracle_policy, run_tree
        from rao_core.tree import write_trees

        console = make_console()
        environment = env_option(env)  # as `rao evaluate --env`: exit 2 naming the known environments
        with input_errors():  # the reader names the file and the line
            tasks = load_tasks(task_file, environment)  # every record checked (env, validate_task) up front
        if not tasks:
            raise InputError(f"{task_file}: holds no task; `rao tasks generate` writes task files")
        if not 0 <= task_index < len(tasks):
            raise typer.BadParameter(f"{task_index} is out of range: {task_file} has {len(tasks)} tasks",
                                     param_hint="'--task-index'")
        task = tasks[task_index]
        # an option RuntimeConfig refuses is named as written (--max-depth, --sandbox), exit 2
        config = params_from_options(RuntimeConfig, max_depth=max_depth, delegation=max_depth > 0, sandbox=sandbox,
                                     context_window=16384, max_new_tokens=2048)
        if policy == "oracle":
            pol = oracle_policy(env)
        elif policy == "scripted":
            from rao_core.policies.scripted import ReplayPolicy

            if script is None:
                raise typer.BadParameter("--policy scripted needs --script FILE (a JSON list of messages)")
            with input_errors():
                pol = ReplayPolicy(default=_read_script(script))
        elif policy == "endpoint":
            from rao_core.policies.openai_policy import OpenAIPolicy

            if not base_url or not model:
                raise typer.BadParameter("--policy endpoint needs --base-url and --model")
            pol = OpenAIPolicy(base_url, model)
        else:
            raise typer.BadParameter(f"--policy must be oracle, scripted or endpoint, got {policy!r}")
        tok = tokenizer or next((str(p) for p in (tiny_model_path(), default_model_path())
                                 if (p / "tokenizer.json").exists()), "")
        if not tok:
            raise typer.BadParameter("no tokenizer: pass --tokenizer or run `make setup`")
        if policy == "endpoint":  # a server that does not answer is one error line, as in `rao eval`
            from infra.serving import wait_for_server

            wait_for_server(base_url)

        async def go():
            if not console.is_terminal:  # piped: no live view (rich would print it again when it stops)
                return await run_tree(environment, task, pol, config, tokenizer=tok)
            with Live(console=console, refresh_per_second=8, transient=True) as live:
                return await run_tree(environment, task, pol, config, tokenizer=tok,
                                      on_update=lambda t: live.update(_render(t)))

        tree = asyncio.run(go())
        console.print(_render(tree))  # the final tree, once
        root = tree.root
        tokens = sum(len(n.token_ids) for n in tree.nodes)
        console.print(f"task {task.task_id}: success={root.verifier} "
                      f"end={root.end_reason.value} depth={tree.depth} nodes={len(tree.nodes)} tokens={tokens} "
                      f"wall={tree.wall_s:.2f}s" + (f" error={_line(tree.error)}" if tree.error else ""),
                      soft_wrap=True)
        failed = [n for n in tree.nodes if n.end_reason.value in ("sandbox_error", "policy_error",
                                                                  "token_prefix_break")]
        for n in failed[:3]:
            console.print(f"[red]node {n.node_id} ended with {n.end_reason.value}:[/red] {_line(n.error)}",
                          soft_wrap=True)
        if out is not None:
            write_trees(out, [tree])
            console.print(f"tree written to {out}")
        if root.end_reason.value in ("sandbox_error", "policy_error") or tree.error:
            raise typer.Exit(1)  # the rollout itself broke (not a wrong answer)
