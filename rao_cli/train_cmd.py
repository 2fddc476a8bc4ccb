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
        config: Path | None = typer.Option(None, "--config", help="YAML/JSON file of TrainerConfig fields."),
        iteration: int = typer.Option(0, "--iteration", help="RL iteration recorded in the manifest."),
    ) -> None:
        """Train the policy on SAMPLES from MODEL and save the checkpoint at OUT (works under accelerate launch)."""
        import json

        import yaml

        from rao_core.train import TrainerConfig, train

        cfg = TrainerConfig()
        if config is not None:
            raw = yaml.safe_load(config.read_text()) or {}
            cfg = TrainerConfig.model_validate(raw.get("train", raw) if isinstance(raw, dict) else raw)

        def show(m: dict[str, float]) -> None:
            typer.echo(json.dumps({k: round(v, 6) for k, v in m.items()}))

        res = train(samples, model, out, cfg, iteration=iteration, on_step=show)
        typer.echo(f"checkpoint: {res.checkpoint}")
