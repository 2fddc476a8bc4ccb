"""`rao sandbox run FILE.py`: run one cell in the node sandbox and print a JSON result."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="The REPL sandbox used for every node (bubblewrap + rlimits).", no_args_is_help=True)


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

    if file.is_dir():
        raise typer.BadParameter(f"{file} is a folder, not a Python file", param_hint="FILE")
    if not file.is_file():
        raise typer.BadParameter(f"file not found: {file}", param_hint="FILE")
    if sandbox not in ("bwrap", "none"):
        raise typer.BadParameter(f"expected bwrap or none, got {sandbox!r}", param_hint="--sandbox")
    try:
        code = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise typer.BadParameter(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})", param_hint="FILE") from None
    limits = SandboxLimits(cell_timeout_s=timeout, memory_mb=memory_mb, mode=sandbox)  # type: ignore[arg-type]
    try:
        res = asyncio.run(run_cell_once(code, limits))
    except SandboxError as e:
        detail = " ".join(str(e).split())[:500]
        typer.echo(f"error: sandbox could not run: {detail}", err=True)
        raise typer.Exit(1) from e
    typer.echo(json.dumps({"ok": res.status.value == "ok", "stdout": res.output, "error": res.error,
                           "end_reason": res.status.value}))
