"""``rao sft``: warm start. Build scripted-expert demonstrations through the runtime, then SFT the model."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add ``rao sft`` to the top-level app."""

    @app.command("sft")
    def sft_cmd(
        env: str = typer.Option("textcraft-synth", "--env", help="Environment whose expert demonstrates."),
        n_tasks: int = typer.Option(None, "--n-tasks", help="Demonstration tasks (default: DemoConfig's)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the tasks and of the expert's variety."),
        model: Path = typer.Option(None, "--model", help="Checkpoint to fine-tune (default: SmolLM2-135M)."),
        out: Path = typer.Option(..., "--out", help="Checkpoint folder to write (replaced atomically)."),
        epochs: int = typer.Option(None, "--epochs", help="SFT epochs (default: the warm-start default)."),
        lr: float = typer.Option(None, "--lr", help="Learning rate (default: the warm-start default)."),
        difficulties: list[str] = typer.Option(None, "--difficulty", help="Repeat for several (default easy, medium)."),
        config: Path = typer.Option(None, "--config", help="YAML with `warm_start` (DemoConfig fields + `trainer`: SFT TrainerConfig fields) and `runtime`."),
        trees: Path = typer.Option(None, "--trees", help="Also write the demonstration trees (JSON lines) here."),
    ) -> None:
        """Build demonstrations with the expert and fine-tune MODEL on them (loss_type sft); prints stats."""
        import json

        from rao_core.config import read_yaml
        from rao_core.paths import default_model_path
        from rao_core.warmstart import (DemoConfig, default_sft_trainer_config, recommended_runtime_config,
                                        run_warm_start)

        raw = (read_yaml(config) or {}) if config else {}  # one error line: file, line, duplicate key
        demo = dict(raw.get("warm_start") or {})
        trainer = dict(demo.pop("trainer", None) or {})
        # a campaign config's warm_start section: its mode/checkpoint are the campaign's, options are DemoConfig's
        for key in ("mode", "checkpoint"):
            demo.pop(key, None)
        demo.update(demo.pop("options", None) or {})
        demo.update({k: v for k, v in (("n_tasks", n_tasks), ("difficulties", difficulties or None)) if v is not None})
        demo["seed"] = seed
        trainer.update({k: v for k, v in (("epochs", epochs), ("lr", lr)) if v is not None})
        try:
            dc = DemoConfig(**demo)
            tc = default_sft_trainer_config(**trainer)
            rc = recommended_runtime_config(**(raw.get("runtime") or {}))
        except ValueError as e:
            from rao_core.jsonl import one_line_error

            raise typer.BadParameter(one_line_error(e)) from e
        model_path = model or default_model_path()
        typer.echo(f"demonstrations: {dc.n_tasks} {env} tasks {dc.difficulties}; SFT {tc.epochs} epoch(s), "
                   f"lr {tc.lr} from {model_path}")

        def show(m: dict[str, float]) -> None:
            typer.echo(f"step {int(m['train/step'])} epoch {int(m['train/epoch'])} loss {m['train/loss']:.4f} "
                       f"({m['train/tokens_per_s']:.0f} tok/s)")

        res = run_warm_start(env, model_path, out, demo_config=dc, trainer_config=tc, runtime_config=rc,
                             trees_path=trees, on_step=show)
        typer.echo(json.dumps({"stats": res.stats, "samples": res.num_samples, "tokens": res.num_tokens,
                               "assistant_tokens": res.num_assistant_tokens,
                               "demo_wall_s": round(res.demo_wall_s, 1), "sft_wall_s": round(res.sft_wall_s, 1)},
                              indent=2, default=str))
        typer.echo(f"checkpoint: {res.checkpoint}")
