"""The ``rao`` command line (typer). Each area registers its commands in its own module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

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
