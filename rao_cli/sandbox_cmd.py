"""`rao sandbox run FILE.py`: run one cell in the node sandbox and print a JSON result."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="The REPL sandbox used for every node (bubblewrap + rlimits).", no_args_is_help=True)


def _kind(path: Path) -> str:
    """What ``path`` is when it is not a regular file: "a folder", "a character device" (``/dev/null``), ..."""
    import stat

    mode = path.stat().st_mode
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _read_cell(file: Path) -> str:
    """The code of ``rao sandbox run FILE``; typer.BadParameter (exit 2) saying what is wrong with FILE: not
    found, a folder or another thing that is not a regular file (``/dev/null``: a character device), not UTF-8
    text, or empty (nothing to run)."""
    if not file.exists():
        raise typer.BadParameter(f"file not found: {file}", param_hint="FILE")
    if not file.is_file():
        what = _kind(file)
        detail = "a folder, not a Python file" if what == "a folder" else f"{what}, not a regular file"
        raise typer.BadParameter(f"{file} is {detail}", param_hint="FILE")
    try:
        code = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise typer.BadParameter(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})", param_hint="FILE") from None
    if not code.strip():
        raise typer.BadParameter(f"{file} is empty: no code to run", param_hint="FILE")
    return code


@app.command("run")
def run(file: Path = typer.Argument(..., help="Python file to run as one cell (top-level await allowed)."),
        timeout: float = typer.Option(30.0, "--timeout", min=0.1, max=3600.0, help="Wall-clock limit, seconds."),
        memory_mb: int = typer.Option(1024, "--memory-mb", min=128, help="Address-space limit, MiB (the REPL "
                                      "itself dies below ~96)."),
        sandbox: str = typer.Option("bwrap", "--sandbox", help="bwrap | none (debugging only).")) -> None:
    """Print {"ok", "stdout", "error", "end_reason"}; exit 0 whether or not the cell failed."""
    import asyncio
    import json

    from rao_core.runtime.sandbox import SandboxError, SandboxLimits, run_cell_once

    if sandbox not in ("bwrap", "none"):
        raise typer.BadParameter(f"expected bwrap or none, got {sandbox!r}", param_hint="--sandbox")
    code = _read_cell(file)
    limits = SandboxLimits(cell_timeout_s=timeout, memory_mb=memory_mb, mode=sandbox)  # type: ignore[arg-type]
    try:
        res = asyncio.run(run_cell_once(code, limits))
    except SandboxError as e:
        detail = " ".join(str(e).split())[:500]
        typer.echo(f"error: sandbox could not run: {detail}", err=True)
        raise typer.Exit(1) from e
    typer.echo(json.dumps({"ok": res.status.value == "ok", "stdout": res.output, "error": res.error,
                           "end_reason": res.status.value}))
