"""``rao services up|down|status``."""

from __future__ import annotations

import typer
from rich.table import Table

from rao_cli import make_console

app = typer.Typer(help="Start, stop and list the embedded services (S3, MLflow, Prefect, vLLM, Ray).",
                  no_args_is_help=True)
console = make_console()


def _table() -> Table:
    from infra.services import status

    t = Table(title="RAO services")
    for col in ("service", "state", "url", "pid", "log"):
        t.add_column(col)
    for r in status():
        t.add_row(r["name"], r["state"], r["url"], str(r["pid"] or ""), r["log"])
    return t


@app.command()
def up(
    s3: bool = typer.Option(True, help="SeaweedFS S3 server (skipped when RAO_S3_ENDPOINT is set)"),
    mlflow_server: bool = typer.Option(False, help="an `mlflow server` instead of the SQLite file"),
    prefect_server: bool = typer.Option(False, help="`prefect server start` with the UI"),
    prefect_port: int = typer.Option(0, min=0, max=65535, help="fixed port of the Prefect server (0: a free "
                                     "port)"),
    model: str = typer.Option(None, help="checkpoint folder to serve with vLLM"),
    max_model_len: int = typer.Option(4096, min=1, help="vLLM context length (tokens)"),
    vllm_dev_routes: bool = typer.Option(False, "--vllm-dev-routes", help="with --model: vLLM's development "
                                         "routes (/collective_rpc, /sleep, /reset_prefix_cache, ...; off by "
                                         "default, they reload or free the served weights)"),
    ray: bool = typer.Option(False, "--ray", help="a local Ray head node for execution.backend ray "
                             "(execution.ray_address auto finds it)"),
    ray_cpus: int = typer.Option(None, min=1, help="CPUs the Ray head offers to rollout shards (default: all)"),
    ray_object_store_gib: float = typer.Option(1.0, min=0.1, help="Ray object store size, GiB (shards exchange "
                                               "small records; their trees go through S3)"),
) -> None:
    """Start services (idempotent) and show where they run. A service that fails to start is one `error:`
    line naming its log."""
    from infra.services import up as _up

    if model:  # before any service starts: a folder that is not a checkpoint is a usage error (exit 2)
        from pathlib import Path

        from rao_cli.train_cmd import check_model

        check_model(Path(model))
    _up(s3=s3, mlflow_server=mlflow_server, prefect_server=prefect_server, prefect_port=prefect_port,
        model=model, max_model_len=max_model_len, ray=ray, ray_cpus=ray_cpus,
        ray_object_store_gib=ray_object_store_gib, vllm_dev_mode=vllm_dev_routes)
    console.print(_table())
    from infra.services import mlflow_instructions, prefect_instructions

    for line in mlflow_instructions() + prefect_instructions():
        console.print(line, soft_wrap=True, highlight=False)


@app.command()
def down() -> None:
    """Stop every service started by `rao services up` (no process is left behind)."""
    from infra.services import down as _down

    stopped = _down()
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@app.command()
def status() -> None:
    """Show services, URLs and pids."""
    console.print(_table())
