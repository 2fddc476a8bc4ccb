"""The ``rao`` command line (typer). Each area registers its commands in its own module.

One exit-code rule for every command (``rao_cli.main.main`` applies it): 2 for a usage or input error (an
option, an argument, or a file, folder, config or model reference the user named: :class:`InputError`,
click's usage errors, ``rao_core.config.ConfigError``, ``infra.models.ModelError``), 1 for a failure while
working (a service that does not answer, training, a rollout, a regression, a bug), 130 / 143 for an
interrupt (SIGINT / SIGTERM); every error is one ``error: ...`` line on stderr.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from typer._click.exceptions import ClickException  # typer >= 0.20 vendors click (as rao_cli.main uses it)

class InputError(ClickException):
    """A usage or input error a command found (a file an option names that is empty, of the wrong kind or
    not of the expected format, a reference to nothing): ``error: <message>`` on one line, exit 2."""

    exit_code = 2


@contextlib.contextmanager
def input_errors(prefix: str = "") -> Iterator[None]:
    """Within the block, which reads what the user named (a task, tree, samples or script file), a ValueError
    or OSError is that input's fault: :class:`InputError` (exit 2) with ``prefix`` and the error's one line
    (:func:`rao_core.jsonl.one_line_error`; the readers already name the file and the line)."""
    try:
        yield
    except (ValueError, OSError) as e:
        from rao_core.jsonl import one_line_error

        raise InputError(f"{prefix}{one_line_error(e)}") from None


def env_option(name: str, hint: str = "'--env'"):
    """``rao_core.envs.get_env(name)`` for an environment named by an option (``--env``): an unknown name is a
    usage error naming the option and the known environments (exit 2)."""
    import typer

    from rao_core.envs import get_env

    try:
        return get_env(name)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=hint) from None


#: Width of command output that goes to a pipe or a file (rich would cut tables to 80 columns there).
PIPED_WIDTH = 1000
#: Width of ``--help`` that goes to a pipe or a file (rich would wrap it in 80 columns, eliding option names).
PIPED_HELP_WIDTH = 160


def make_console(**kwargs: Any):
    """The rich ``Console`` of command output: the terminal's width on a terminal; when stdout is piped or
    redirected, :data:`PIPED_WIDTH` columns (unless ``COLUMNS`` is set), so tables keep every column whole."""
    import os
    import sys

    from rich.console import Console

    if "width" not in kwargs and not os.environ.get("COLUMNS") and not (sys.stdout and sys.stdout.isatty()):
        kwargs["width"] = PIPED_WIDTH
    return Console(**kwargs)


@contextlib.contextmanager
def piped_help_width() -> Iterator[None]:
    """Within the block, typer's rich ``--help`` is :data:`PIPED_HELP_WIDTH` columns wide when stdout is piped
    or redirected and the user set no width (``COLUMNS``, ``TERMINAL_WIDTH``); typer's own width
    (``typer.rich_utils.MAX_WIDTH``) is restored afterwards."""
    import os
    import sys

    from typer import rich_utils

    saved = rich_utils.MAX_WIDTH
    user_width = os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH")
    if not user_width and not (sys.stdout and sys.stdout.isatty()):
        rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH
    try:
        yield
    finally:
        rich_utils.MAX_WIDTH = saved
