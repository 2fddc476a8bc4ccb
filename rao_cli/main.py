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
    ("rao_cli.campaigns_cmd", "campaigns"),
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


def _disk_full_line(e: BaseException) -> str | None:
    """The one line of a full disk (``infra.disk``: the path, its free space, what to do) when ``e`` says a disk
    is full, else None; never raises."""
    try:
        from infra.disk import as_disk_full

        full = as_disk_full(e)
    except Exception:  # noqa: BLE001 - the error's own line is printed instead
        return None
    return None if full is None else str(full)


def _usage_line(e: BaseException) -> str:
    """One line for a click usage error: the message (whitespace collapsed) and the command's --help."""
    msg = " ".join(e.format_message().split())  # type: ignore[attr-defined]
    ctx = getattr(e, "ctx", None)
    return f"{msg} (see `{ctx.command_path} --help`)" if ctx is not None else msg


def main(argv: list[str] | None = None) -> None:
    """Console entry point: the exit-code rule of every command (:mod:`rao_cli`). Every error is ONE line
    ``error: ...`` on stderr:

    - exit 2, a usage or input error: bad option values, missing arguments, unknown commands (click),
      :class:`rao_cli.InputError` (a file, folder or reference the user named), ``ConfigError`` (a config
      file or ``--set``), ``ModelError`` (a model folder missing or incomplete);
    - exit 1, a failure while working: services that fail or do not answer (``ServiceError``, OSError), a
      full disk (``infra.disk``: the path, its free space, what to do),
      anything else a command raises (ValueError, ...); an exception no command expects (a bug) is named
      with its type;
    - exit 130 (Ctrl-C: ``error: interrupted (SIGINT)``) or 143 (SIGTERM: ``error: interrupted (SIGTERM)``);
      commands that stop services or children on an interrupt (``infra.process.run_interruptible``) say
      more on their own line.

    Everything the command and the services it starts write is owner-only (``infra.credentials.owner_only``:
    umask 077, and ``$RAO_HOME`` made ``go-rwx`` where an older installation left it readable).

    ``RAO_DEBUG=1`` re-raises instead, so the full traceback is shown. ``argv``: the arguments (default
    ``sys.argv[1:]``). ``rao`` with no arguments prints the help and exits 2. ``--help`` that goes to a pipe
    or a file is :data:`rao_cli.PIPED_HELP_WIDTH` columns wide (:func:`rao_cli.piped_help_width`).
    """
    import os
    import signal
    import sys

    from pydantic import ValidationError
    from typer import _click as click  # typer >= 0.20 vendors click: its exceptions live here
    from typer.exceptions import Abort

    from infra.models import ModelError
    from infra.process import ServiceError
    from rao_cli import piped_help_width
    from rao_core.config import ConfigError

    debug = bool(os.environ.get("RAO_DEBUG"))
    from infra.credentials import owner_only

    owner_only()  # umask 077 for this command and every service it starts; $RAO_HOME's modes mended once

    def fail(text: str, code: int) -> None:
        print(f"error: {text}", file=sys.stderr)
        sys.exit(code)

    def terminated(signum, frame) -> None:  # SIGTERM: unwind (finally blocks run), one line, 143
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the process at once
        fail("interrupted (SIGTERM)", 128 + signum)

    own_term = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if own_term:  # commands that handle it themselves (rao run, rao evaluate) replace this handler
        signal.signal(signal.SIGTERM, terminated)
    try:
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
        except click.exceptions.ClickException as e:  # usage errors, BadParameter and InputError raised in commands
            if debug:
                raise
            fail(_usage_line(e) if isinstance(e, click.exceptions.UsageError) else _one_line(e), e.exit_code)
        except KeyboardInterrupt:
            if debug:
                raise
            fail("interrupted (SIGINT)", 130)
        except (ConfigError, ModelError) as e:  # the config or the model the user named: input errors
            if debug:
                raise
            fail(_one_line(e), 2)
        except (ValueError, OSError, ServiceError, ValidationError, ImportError) as e:
            if debug:
                raise
            full = _disk_full_line(e)  # ENOSPC, a copy's list of errors holding one, a full embedded S3
            if full:
                fail(full, 1)
            if isinstance(e, ValidationError):
                from rao_core.jsonl import one_line_error

                fail(f"{e.title}: {one_line_error(e)}", 1)
            fail(_one_line(e), 1)
        except Exception as e:  # noqa: BLE001 - still one line; RAO_DEBUG=1 shows where
            if debug:
                raise
            full = _disk_full_line(e)  # e.g. boto3's S3UploadFailedError: InternalError of a full SeaweedFS
            if full:
                fail(full, 1)
            fail(f"{type(e).__name__}: {_one_line(e)} (unexpected; RAO_DEBUG=1 shows the traceback)", 1)
    finally:
        if own_term and signal.getsignal(signal.SIGTERM) == terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # standalone_mode=False returns typer.Exit's code (or the command's return value, always None here);
    # typer turns a KeyboardInterrupt inside a command into Exit(130), silently: no command exits 130 itself
    if rv == 130:
        fail("interrupted (SIGINT)", 130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
