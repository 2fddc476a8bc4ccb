"""``rao train``: one policy update from a samples file to a new checkpoint folder."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add ``rao train`` to the top-level app."""

    @app.command("train")
    def train_cmd(
        samples: Path = typer.Option(..., "--samples", help="Training samples (.jsonl or .parquet)."),
        model: Path = typer.Option(..., "--model", help="Checkpoint folder to start from (full or LoRA)."),
        out: Path = typer.Option(..., "--out", help="Checkpoint folder to write (replaced atomically)."),
        config: Path | None = typer.Option(None, "--config", help="YAML/JSON file: TrainerConfig fields, or a campaign config (its `trainer:` section)."),
        iteration: int = typer.Option(0, "--iteration", help="RL iteration recorded in the manifest."),
        metrics_out: Path | None = typer.Option(
            None, "--metrics-out", help="Also append each step's metrics to this file as JSON lines "
            '{"step": {...}} and {"progress": {"done": D, "total": T}}, then {"end": {"peak_rss_mb": ...}} '
            "(main process; used by the campaign's subprocess train stage)."),
    ) -> None:
        """Train the policy on SAMPLES from MODEL and save the checkpoint at OUT (works under accelerate launch)."""
        import json
        import os
        import resource

        from rao_core.config import read_yaml
        from rao_core.train import TrainerConfig, train

        cfg = TrainerConfig()
        if config is not None:
            raw = read_yaml(config) or {}
            if isinstance(raw, dict):  # a campaign config's `trainer:` section, or TrainerConfig fields
                raw = raw.get("trainer", raw.get("train", raw))
            cfg = TrainerConfig.model_validate(raw)

        main_process = os.environ.get("RANK", "0") == "0"  # set by accelerate launch; absent in one process
        sink = metrics_out.open("a") if metrics_out is not None and main_process else None

        def record(obj: dict) -> None:
            if sink is not None:
                sink.write(json.dumps(obj) + "\n")
                sink.flush()

        def show(m: dict[str, float]) -> None:
            typer.echo(json.dumps({k: round(v, 6) for k, v in m.items()}))
            record({"step": m})

        try:
            res = train(samples, model, out, cfg, iteration=iteration, on_step=show,
                        on_progress=lambda done, total: record({"progress": {"done": done, "total": total}}))
            # ru_maxrss is in KiB on Linux
            record({"end": {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                            "steps": len(res.metrics)}})
        finally:
            if sink is not None:
                sink.close()
        typer.echo(f"checkpoint: {res.checkpoint}")
