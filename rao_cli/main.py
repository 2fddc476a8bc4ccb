"""Entry point of the ``rao`` console command.

Sub-command modules (one per area) each expose ``app = typer.Typer(...)`` or plain functions and are
registered here. Heavy imports (torch, prefect, mlflow) happen inside the commands, so ``rao --help``
stays fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(name="rao", help="Recursive Agent Optimization: train recursive LLM agents with RL.",
                  no_args_is_help=True, pretty_exceptions_enable=False)

# (module, name) of sub-apps registered as `rao NAME ...`; modules missing during development are skipped.
_SUBAPPS = [
    ("rao_cli.services", "services"),
    ("rao_cli.tasks_cmd", "tasks"),
    ("rao_cli.sandbox_cmd", "sandbox"),
    ("rao_cli.judge_cmd", "judge"),
    ("rao_cli.experiment_cmd", "experiment"),
]
# modules that add top-level commands with @app.command via register(app)
_COMMANDS = [
    "rao_cli.solve_cmd",
    "rao_cli.train_cmd",
    "rao_cli.sft_cmd",
    "rao_cli.pipeline_cmd",
]

for _mod, _name in _SUBAPPS:
    try:
        app.add_typer(importlib.import_module(_mod).app, name=_name)
    except ModuleNotFoundError as e:
        if e.name != _mod:
            raise
for _mod in _COMMANDS:
    try:
        importlib.import_module(_mod).register(app)
    except ModuleNotFoundError as e:
        if e.name != _mod:
            raise


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    lines = text.splitlines()
    return lines[0] if len(lines) == 1 else f"{lines[0]} ({len(lines) - 1} more lines; RAO_DEBUG=1 shows all)"


def main() -> None:
    """Console entry point: user errors (bad input, missing files, services that fail) print one line
    ``error: ...`` and exit 1; ``RAO_DEBUG=1`` shows the full traceback instead."""
    import os
    import sys

    from pydantic import ValidationError

    from infra.models import ModelError
    from infra.process import ServiceError

    try:
        app()
    except (ValueError, FileNotFoundError, ModelError, ServiceError, ValidationError, ImportError) as e:
        if os.environ.get("RAO_DEBUG"):
            raise
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
