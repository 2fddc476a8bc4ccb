"""The ``rao`` command line (typer). Each area registers its commands in its own module."""

from __future__ import annotations

from typing import Any

#: Width of command output that goes to a pipe or a file (rich would cut tables to 80 columns there).
PIPED_WIDTH = 1000


def make_console(**kwargs: Any):
    """The rich ``Console`` of command output: the terminal's width on a terminal; when stdout is piped or
    redirected, :data:`PIPED_WIDTH` columns (unless ``COLUMNS`` is set), so tables keep every column whole."""
    import os
    import sys

    from rich.console import Console

    if "width" not in kwargs and not os.environ.get("COLUMNS") and not (sys.stdout and sys.stdout.isatty()):
        kwargs["width"] = PIPED_WIDTH
    return Console(**kwargs)
