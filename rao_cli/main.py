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
    "rao_cli.eval_cmd",
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


def _usage_line(e: BaseException) -> str:
    """One line for a click usage error: the message (whitespace collapsed) and the command's --help."""
    msg = " ".join(e.format_message().split())  # type: ignore[attr-defined]
    ctx = getattr(e, "ctx", None)
    return f"{msg} (see `{ctx.command_path} --help`)" if ctx is not None else msg


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Every error is ONE line ``error: ...`` on stderr and a non-zero exit:

    - usage errors (bad option values, missing arguments, unknown commands): exit 2;
    - user errors (bad input, missing files, services that fail: ValueError, FileNotFoundError, OSError,
      ModelError, ServiceError, pydantic ValidationError, ImportError): exit 1;
    - anything else (a bug): exit 1, with the exception type named; Ctrl-C: ``error: interrupted``, 130.

    ``RAO_DEBUG=1`` re-raises instead, so the full traceback is shown. ``argv``: the arguments (default
    ``sys.argv[1:]``). ``rao`` with no arguments prints the help and exits 2. ``--help`` that goes to a pipe
    or a file is :data:`rao_cli.PIPED_HELP_WIDTH` columns wide (:func:`rao_cli.piped_help_width`).
    """
    import os
    import sys

    from pydantic import ValidationError
    from typer import _click as click  # typer >= 0.20 vendors click: its exceptions live here
    from typer.exceptions import Abort

    from infra.models import ModelError
    from infra.process import ServiceError
    from rao_cli import piped_help_width

    debug = bool(os.environ.get("RAO_DEBUG"))

    def fail(text: str, code: int) -> None:
        print(f"error: {text}", file=sys.stderr)
        sys.exit(code)

    try:
        with piped_help_width():  # piped `--help`: wider than rich's 80 columns
            rv = app(args=argv, prog_name="rao", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        with piped_help_width():
            print(e.format_message(), file=sys.stderr)
        sys.exit(2)
    except Abort:
        if debug:
            raise
        fail("aborted", 1)
    except click.exceptions.ClickException as e:  # usage errors, BadParameter raised inside commands
        if debug:
            raise
        fail(_usage_line(e) if isinstance(e, click.exceptions.UsageError) else _one_line(e), e.exit_code)
    except KeyboardInterrupt:
        if debug:
            raise
        fail("interrupted", 130)
    except (ValueError, OSError, ModelError, ServiceError, ValidationError, ImportError) as e:
        if debug:
            raise
        if isinstance(e, ValidationError):
            from rao_core.jsonl import one_line_error

            fail(f"{e.title}: {one_line_error(e)}", 1)
        fail(_one_line(e), 1)
    except Exception as e:  # noqa: BLE001 - still one line; RAO_DEBUG=1 shows where
        if debug:
            raise
        fail(f"{type(e).__name__}: {_one_line(e)} (unexpected; RAO_DEBUG=1 shows the traceback)", 1)
    # standalone_mode=False returns typer.Exit's code (or the command's return value, always None here)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
