"""Running the ``rao`` CLI in-process from a test: one helper for every CLI test file.

``rao_cli.main.main`` always ends with ``SystemExit`` (typer's standalone mode), so a call is wrapped in
``pytest.raises`` and the exit code, stdout and stderr come back together.
"""

from __future__ import annotations

import pytest

from rao_cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``rao *argv`` in this process; returns (exit code, stdout, stderr) as captured by ``capsys``.

    Raises ``pytest.fail`` (through ``pytest.raises``) when the command returns without ``SystemExit``.
    """
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    got = capsys.readouterr()
    return e.value.code, got.out, got.err


def one_error_line(err: str) -> str:
    """The single ``error: ...`` line of ``err``; fails the test when stderr holds anything else."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]
