"""``rao train``: one policy update from a samples file to a new checkpoint folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rao_cli import InputError, input_errors

if TYPE_CHECKING:
    from rao_core.config import CampaignConfig
    from rao_core.train import TrainerConfig


def check_out(out: Path) -> None:
    """:func:`rao_core.train.checkpoint.check_out_folder` for a command's ``--out``, before any work: a folder
    that is not empty and not a checkpoint is refused (exit 2, one line); a checkpoint may be replaced."""
    from rao_core.train.checkpoint import OutFolderError, check_out_folder

    try:
        check_out_folder(out)
    except OutFolderError as e:
        raise InputError(str(e)) from None


def load_campaign_file(path: Path, read_as: dict | None = None) -> CampaignConfig:
    """``--config`` checked whole, as ``rao run --config`` checks it: :func:`rao_core.config.load_config`
    (a typo anywhere is one ConfigError line naming file, key and value; the paths it names are not checked:
    these commands take their model from --model). ``read_as``: the file's content as the command reads it
    when that differs from the campaign's spelling (an older name of a section); it is validated in its
    place, and errors still name ``path``."""
    from rao_core.config import load_config

    return load_config(path, check_paths=False, data=read_as)


def check_model(model: Path | None) -> Path:
    """The checkpoint a command starts from (``rao sft``, ``rao train``): ``model``, else
    :func:`rao_core.paths.default_model_path`, checked before any work
    (:func:`rao_core.train.checkpoint.is_checkpoint`: full weights or a LoRA adapter).

    Raises:
        typer.BadParameter: one ``error:`` line, exit 2: the folder does not exist, or holds no ``config.json``
            / ``adapter_config.json``.
    """
    from rao_core.paths import default_model_path
    from rao_core.train.checkpoint import is_checkpoint

    path = model or default_model_path()
    if is_checkpoint(path):
        return path
    what = ("is not a checkpoint folder (no config.json or adapter_config.json)" if path.exists()
            else "does not exist")
    hint = "" if model else " (the default model; `make setup` installs it)"
    raise typer.BadParameter(f"{path} {what}{hint}", param_hint="'--model'")


def trainer_config(path: Path) -> TrainerConfig:
    """The TrainerConfig of ``rao train --config``: a file of TrainerConfig fields only (what the campaign's
    training child gets), else a campaign config, checked whole (:func:`load_campaign_file`), whose
    ``trainer`` section is taken (its older name ``train:`` is read as ``trainer:``)."""
    from pydantic import ValidationError

    from rao_core.config import ConfigError, read_yaml
    from rao_core.jsonl import one_line_error
    from rao_core.train import TrainerConfig

    raw = read_yaml(path)  # one error line: file, line, duplicate key, empty file
    if isinstance(raw, dict) and set(raw) <= set(TrainerConfig.model_fields):
        try:
            return TrainerConfig.model_validate(raw)
        except ValidationError as e:
            raise ConfigError(f"{path}: {one_line_error(e)}") from None
    if isinstance(raw, dict) and "train" in raw and "trainer" not in raw:
        return load_campaign_file(path, {"trainer" if k == "train" else k: v for k, v in raw.items()}).trainer
    return load_campaign_file(path, raw).trainer


def register(app: typer.Typer) -> None:
    """Add ``rao train`` to the top-level app."""

    @app.command("train")
    def train_cmd(
        samples: Path = typer.Option(..., "--samples", help="Training samples (.jsonl or .parquet)."),
        model: Path = typer.Option(..., "--model", help="Checkpoint folder to start from (full or LoRA)."),
        out: Path = typer.Option(..., "--out", help="Checkpoint folder to write (an existing checkpoint there is replaced atomically; a folder holding anything else is refused)."),
        config: Path | None = typer.Option(None, "--config", help="YAML/JSON file: TrainerConfig fields, or a campaign config (validated whole, as `rao run` does; its `trainer:` section is used)."),
        iteration: int = typer.Option(0, "--iteration", help="RL iteration recorded in the manifest."),
        max_staleness: int = typer.Option(
            0, "--max-staleness", min=0, help="Asynchronous RL: samples may come from checkpoints up to this many "
            "versions older than MODEL (version = --iteration - 1; a sample's policy_version); those are trained "
            "with the decoupled off-policy loss. Older samples are refused (docs/algorithm/async-rl.md)."),
        metrics_out: Path | None = typer.Option(
            None, "--metrics-out", help="Also append each step's metrics to this file as JSON lines "
            '{"step": {...}}, {"progress": {"done": D, "total": T}} and {"phase": "..."} (the phases before and '
            'after the steps), then {"end": {"peak_rss_mb": ...}} '
            "(main process; used by the campaign's subprocess train stage)."),
    ) -> None:
        """Train the policy on SAMPLES from MODEL and save the checkpoint at OUT (works under accelerate launch)."""
        import json
        import os
        import resource

        from rao_core.samples import read_samples
        from rao_core.train import TrainerConfig, train

        # every input checked before any work (exit 2, one line): --out, --model, --config, --samples
        check_out(out)  # nothing but a checkpoint is replaced at --out
        cfg = trainer_config(config) if config is not None else TrainerConfig()  # ConfigError: exit 2
        check_model(model)
        with input_errors():  # the readers name the file (and the line)
            rows = read_samples(samples).samples
        if not rows:
            raise InputError(f"{samples}: holds no training sample")

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
            record({"phase": f"started, {len(rows)} samples read"})
            res = train(rows, model, out, cfg, iteration=iteration, on_step=show, max_staleness=max_staleness,
                        on_progress=lambda done, total: record({"progress": {"done": done, "total": total}}),
                        on_phase=lambda line: record({"phase": line}))
            # ru_maxrss is in KiB on Linux
            record({"end": {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                            "steps": len(res.metrics)}})
        finally:
            if sink is not None:
                sink.close()
        typer.echo(f"checkpoint: {res.checkpoint}")
