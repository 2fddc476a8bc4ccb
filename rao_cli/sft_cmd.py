"""``rao sft``: warm start. Build scripted-expert demonstrations through the runtime, then SFT the model."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer


def demo_difficulties(env: str, given: list[str] | None) -> list[str]:
    """The demonstrations' difficulties: ``given`` (each checked against ``env``), else DemoConfig's default
    (easy, medium) where ``env`` has them, else its first declared difficulty. BadParameter for an
    environment with no expert to demonstrate (oolong) and for a difficulty it does not know."""
    import importlib

    from rao_cli import env_option
    from rao_core.envs import REGISTRY, canonical_name
    from rao_core.warmstart import DemoConfig

    entry = REGISTRY.get(canonical_name(env))
    if entry is None:
        env_option(env)  # a usage error naming the known environments
    if entry.expert is None:
        known = sorted(n for n, e in REGISTRY.items() if e.expert)
        raise typer.BadParameter(f"environment {env!r} has no expert to demonstrate with; one of {known}",
                                 param_hint="'--env'")
    module, name = entry.env.split(":")
    cls = getattr(importlib.import_module(module), name)  # the class: its difficulties, without building it
    for d in given or []:
        try:
            cls.check_difficulty(d)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="'--difficulty' / warm_start.difficulties") from None
    if given:
        return list(given)
    ours = [d for d in DemoConfig.model_fields["difficulties"].default_factory() if d in cls.difficulties]
    return ours or list(cls.difficulties[:1])


def temporaries(out: Path) -> list[Path]:
    """What training ``out`` leaves beside it while it runs: the samples file, the child's I/O folder and
    half-saved checkpoint folders (``rao_core.train.launch``, ``rao_core.train.checkpoint``)."""
    out = out.resolve()
    return [out.with_name(out.name + ".samples.jsonl"), out.with_name(out.name + ".train-io"),
            *sorted(out.parent.glob(f".{out.name}.tmp-*"))]


def remove_temporaries(out: Path) -> str:
    """Remove :func:`temporaries` of ``out``; returns where the training log is kept ("" when there is none)."""
    for p in temporaries(out):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    log = out.resolve().with_name(out.resolve().name + ".train.log")
    return str(log) if log.exists() else ""


def check_campaign_file(path: Path, raw: object) -> None:
    """``rao sft --config`` checked whole, as ``rao run`` checks it (:func:`rao_cli.train_cmd.load_campaign_file`:
    one ConfigError line for a typo anywhere). DemoConfig fields written directly in ``warm_start`` (this
    command's shorter spelling of ``warm_start.options``) are checked as options; DemoConfig checks them."""
    from rao_cli.train_cmd import load_campaign_file
    from rao_core.config import WarmStartSettings
    from rao_core.warmstart import DemoConfig

    ws = raw.get("warm_start") if isinstance(raw, dict) else None
    direct = set(DemoConfig.model_fields) - set(WarmStartSettings.model_fields)
    if not (isinstance(ws, dict) and direct & set(ws)):
        load_campaign_file(path, raw)
        return
    options = ws.get("options") if isinstance(ws.get("options"), dict) else {}
    ws = {k: v for k, v in ws.items() if k not in direct} | {"options": {k: ws[k] for k in ws if k in direct} | options}
    load_campaign_file(path, raw | {"warm_start": ws})


def register(app: typer.Typer) -> None:
    """Add ``rao sft`` to the top-level app."""

    @app.command("sft")
    def sft_cmd(
        env: str = typer.Option("textcraft-synth", "--env", help="Environment whose expert demonstrates."),
        n_tasks: int = typer.Option(None, "--n-tasks", help="Demonstration tasks (default: DemoConfig's)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the tasks and of the expert's variety."),
        model: Path = typer.Option(None, "--model", help="Checkpoint to fine-tune (default: SmolLM2-135M)."),
        out: Path = typer.Option(..., "--out", help="Checkpoint folder to write (an existing checkpoint there is replaced atomically; a folder holding anything else is refused)."),
        epochs: int = typer.Option(None, "--epochs", help="SFT epochs (default: the warm-start default)."),
        lr: float = typer.Option(None, "--lr", help="Learning rate (default: the warm-start default)."),
        difficulties: list[str] = typer.Option(None, "--difficulty", help="Repeat for several (default: easy, "
                                               "medium where the environment has them, else its first)."),
        config: Path = typer.Option(None, "--config", help="Campaign config (validated whole, as `rao run` does): its `warm_start` (DemoConfig fields + `trainer`: SFT TrainerConfig fields) and `runtime`."),
        trees: Path = typer.Option(None, "--trees", help="Also write the demonstration trees (JSON lines) here."),
        single_agent: bool = typer.Option(False, "--single-agent", help="Single-agent demonstrations (delegation "
                                          "off, single_agent_fraction 1.0), each node allowed a whole recursive "
                                          "tree's steps: the single-agent arm's warm start."),
    ) -> None:
        """Build demonstrations with the expert and fine-tune MODEL on them (loss_type sft); prints stats."""
        import json

        from rao_cli.train_cmd import check_model, check_out
        from rao_core.config import read_yaml
        from rao_core.warmstart import (DemoConfig, default_sft_trainer_config, recommended_runtime_config,
                                        run_warm_start)

        check_out(out)  # before the demonstrations: nothing but a checkpoint is replaced at --out
        raw = (read_yaml(config) or {}) if config else {}  # one error line: file, line, duplicate key
        if config:
            check_campaign_file(config, raw)
        model_path = check_model(model)  # after the config: the options the user typed are named first
        demo = dict(raw.get("warm_start") or {})
        trainer = dict(demo.pop("trainer", None) or {})
        # a campaign config's warm_start section: its mode/checkpoint are the campaign's, options are DemoConfig's
        for key in ("mode", "checkpoint"):
            demo.pop(key, None)
        demo.update(demo.pop("options", None) or {})
        demo.update({k: v for k, v in (("n_tasks", n_tasks), ("difficulties", difficulties or None)) if v is not None})
        demo["difficulties"] = demo_difficulties(env, demo.get("difficulties"))  # the env's, not TextCraft's
        demo["seed"] = seed
        # the campaign's task generator (e.g. a larger TextCraft recipe graph): demonstrations from its problems
        gen = (raw.get("tasks") or {}).get("generator_options") if isinstance(raw.get("tasks"), dict) else None
        if gen and "generator_options" not in demo:
            demo["generator_options"] = dict(gen)
        trainer.update({k: v for k, v in (("epochs", epochs), ("lr", lr)) if v is not None})
        if single_agent:
            demo["single_agent_fraction"] = 1.0
        try:
            dc = DemoConfig(**demo)
            tc = default_sft_trainer_config(**trainer)
            rc = recommended_runtime_config(**(raw.get("runtime") or {}))
            if single_agent:
                rc = rc.model_copy(update={"max_steps_per_node": rc.whole_tree_steps})
        except ValueError as e:
            from rao_core.jsonl import one_line_error

            raise typer.BadParameter(one_line_error(e)) from e
        typer.echo(f"demonstrations: {dc.n_tasks} {env} tasks {dc.difficulties}; SFT {tc.epochs} epoch(s), "
                   f"lr {tc.lr} from {model_path}")

        def show(m: dict[str, float]) -> None:
            typer.echo(f"step {int(m['train/step'])} epoch {int(m['train/epoch'])} loss {m['train/loss']:.4f} "
                       f"({m['train/tokens_per_s']:.0f} tok/s)")

        from rao_core.progress import bar_enabled, every_tenth

        # no bar drawn (a pipe, a log file): a line every tenth of the demonstration trees instead
        demo_lines = None if bar_enabled() else every_tenth(lambda d, t: typer.echo(f"demonstration trees {d}/{t}"))

        from infra.process import run_interruptible, stop_descendants

        def on_interrupt(signum: int) -> str:
            stop_descendants()  # the SFT child first: it writes into the temporaries
            log = remove_temporaries(out)
            return ("interrupted; rao sft stopped and its temporary files removed"
                    + (f" (training log kept: {log})" if log else "") + "; re-run the command to start again")

        try:  # Ctrl-C / SIGTERM: children stopped, temporaries removed, one line, exit 130 / 143
            res = run_interruptible(lambda: run_warm_start(env, model_path, out, demo_config=dc, trainer_config=tc,
                                                           runtime_config=rc, trees_path=trees, on_step=show,
                                                           on_demo_progress=demo_lines),
                                    on_interrupt)
        except Exception:
            remove_temporaries(out)  # a failed training names its log in its own message
            raise
        typer.echo(json.dumps({"stats": res.stats, "samples": res.num_samples, "tokens": res.num_tokens,
                               "assistant_tokens": res.num_assistant_tokens,
                               "demo_wall_s": round(res.demo_wall_s, 1), "sft_wall_s": round(res.sft_wall_s, 1)},
                              indent=2, default=str))
        typer.echo(f"checkpoint: {res.checkpoint}")
