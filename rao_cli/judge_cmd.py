"""`rao judge ...`: score execution-tree files (verifier / LLM judge / proxy) and calibrate the judge.

    rao judge trees --in trees.jsonl --out scored.jsonl [--env oolong] [--base-url URL --model NAME]
    rao judge calibrate --env textcraft-synth --trees oracle.jsonl [--base-url URL --model NAME]

Judge settings come from ``--config FILE.yaml`` (fields of ``rao_core.judge.JudgeConfig``) with the flags
on top. Without ``--base-url`` the endpoint of a running `rao services up` vLLM service is used.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from rao_cli import InputError, env_option, input_errors, make_console

app = typer.Typer(help="Score execution trees (verifier, LLM judge, proxy) and calibrate the judge.",
                  no_args_is_help=True)


def _config(config_file: Path | None, **overrides: Any):
    """Build a JudgeConfig from an optional YAML file plus non-None flag overrides (clear errors)."""
    from pydantic import ValidationError

    from rao_core.config import read_yaml
    from rao_core.judge import JudgeConfig

    try:
        from infra.services import apply_service_env

        apply_service_env()  # the local vLLM service's endpoint, unless the environment already says
    except Exception:  # noqa: BLE001 - services are optional for judging
        pass
    data: dict[str, Any] = {}
    if config_file is not None:
        if not config_file.is_file():
            raise typer.BadParameter(f"config file not found: {config_file}", param_hint="--config")
        data = read_yaml(config_file) or {}
        if not isinstance(data, dict):
            raise typer.BadParameter(f"{config_file}: expected a mapping of JudgeConfig fields",
                                     param_hint="--config")
        data = data.get("judge", data)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return JudgeConfig.model_validate(data)
    except ValidationError as e:
        raise typer.BadParameter(f"invalid judge config: {e}") from None


def _fmt(x: float, pct: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.4g}"


@app.command("trees")
def trees_cmd(
    inp: Path = typer.Option(..., "--in", help="Execution-tree file (JSON lines)."),
    out: Path = typer.Option(..., "--out", help="Where to write the scored trees (JSON lines)."),
    env: str | None = typer.Option(None, help="Environment (prompt choice); default: each tree's own env."),
    base_url: str | None = typer.Option(None, help="OpenAI-compatible judge endpoint."),
    model: str | None = typer.Option(None, help="Judge model name."),
    config: Path | None = typer.Option(None, help="YAML file with JudgeConfig fields."),
    no_judge: bool = typer.Option(False, "--no-judge", help="Verifier and proxy only; send no request."),
    cache: Path | None = typer.Option(None, help="Judge cache file (SQLite)."),
    max_requests: int | None = typer.Option(None, help="Budget: max judge requests."),
    max_cost_usd: float | None = typer.Option(None, help="Budget: max dollars."),
) -> None:
    """Fill success / success_source / judge on every node and print the judging statistics."""
    from rich.table import Table

    from rao_core.judge import JudgeEndpointError, judge_trees_sync
    from rao_core.tree import read_trees, write_trees

    if env is not None:
        env_option(env)  # an unknown name: exit 2, before the file is read
    cfg = _config(config, base_url=base_url, model=model, cache_path=cache, max_requests=max_requests,
                  max_cost_usd=max_cost_usd, enabled=False if no_judge else None)
    if not inp.is_file():
        raise typer.BadParameter(f"tree file not found: {inp}", param_hint="--in")
    with input_errors():  # the reader names the file and the line
        trees = read_trees(inp)
    try:
        scored, stats = judge_trees_sync(trees, env, cfg)
    except JudgeEndpointError as e:  # the endpoint refused the configuration (key, model, URL): exit 2
        raise InputError(str(e)) from None
    write_trees(out, scored)
    table = Table(title=f"judging {len(trees)} trees -> {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in stats.as_metrics().items():
        table.add_row(k, f"{v:.6g}")
    make_console().print(table)


@app.command("calibrate")
def calibrate_cmd(
    trees: Path = typer.Option(..., "--trees", help="Tree file whose nodes carry exact verifier values."),
    env: str = typer.Option("textcraft-synth", help="Environment whose prompt is calibrated."),
    base_url: str | None = typer.Option(None, help="OpenAI-compatible judge endpoint."),
    model: str | None = typer.Option(None, help="Judge model name."),
    config: Path | None = typer.Option(None, help="YAML file with JudgeConfig fields."),
    cache: Path | None = typer.Option(None, help="Judge cache file (SQLite)."),
    json_out: Path | None = typer.Option(None, "--json-out", help="Also write the report as JSON."),
) -> None:
    """Report the judge's agreement with the exact verifier (accuracy, FPR, FNR, n)."""
    from rich.table import Table

    from rao_core.judge import JudgeEndpointError, calibrate_sync
    from rao_core.tree import read_trees

    env_option(env)  # an unknown name: exit 2, before the file is read
    cfg = _config(config, base_url=base_url, model=model, cache_path=cache)
    if not trees.is_file():
        raise typer.BadParameter(f"tree file not found: {trees}", param_hint="--trees")
    with input_errors():  # the file first: a bad one is its own error, before any server is contacted
        tree_list = read_trees(trees)
    if not tree_list:
        raise InputError(f"{trees}: holds no execution tree (nothing to calibrate)")
    from infra.process import ServiceError
    from infra.serving import wait_for_server
    from rao_core.policies.openai_policy import policy_client_key

    if cfg.base_url is None:  # no endpoint set: no default port is tried
        raise InputError(cfg.off_line() or "judge: no endpoint is set")
    try:  # a server that does not answer is a failure while working (exit 1), as in `rao eval` and `rao solve`
        wait_for_server(cfg.base_url, timeout_s=5,
                        api_key=policy_client_key(cfg.base_url, key_env=cfg.api_key_env))
    except ServiceError:
        typer.echo(f"error: no judge server answers at {cfg.base_url} (start one, or pass --base-url / set "
                   "RAO_JUDGE_BASE_URL)", err=True)
        raise typer.Exit(1) from None
    try:
        rep = calibrate_sync(tree_list, cfg, env_name=env)
    except (ValueError, JudgeEndpointError) as e:  # trees without verifier truth; a refused configuration
        raise InputError(str(e)) from None
    table = Table(title=f"judge calibration: {rep.model} on {env} ({rep.prompt_version})")
    for col in ("nodes", "n", "accuracy", "false-pos rate", "false-neg rate", "TP", "FP", "TN", "FN"):
        table.add_column(col, justify="right" if col != "nodes" else "left")
    rows = [("all", rep.overall)] + [(f"depth {d}", c) for d, c in sorted(rep.by_depth.items())]
    for name, c in rows:
        table.add_row(name, str(c.n), _fmt(c.accuracy), _fmt(c.false_positive_rate), _fmt(c.false_negative_rate),
                      str(c.tp), str(c.fp), str(c.tn), str(c.fn))
    console = make_console()
    console.print(table)
    s = rep.stats
    console.print(f"nodes with verifier truth: {rep.nodes_with_truth}; judge failures (NaN, not in n): "
                  f"{rep.failures}; unfinished nodes settled by rule (not in n): {rep.unfinished_rule}; "
                  f"requests {s.requests}, cache hits {s.cache_hits}, tokens {s.prompt_tokens}+"
                  f"{s.completion_tokens}, cost ${s.cost_usd:.4f}, {s.wall_s:.1f} s")
    if json_out is not None:
        import json

        payload = rep.model_dump(mode="json")
        payload["summary"] = {"n": rep.overall.n, "accuracy": rep.overall.accuracy,
                              "false_positive_rate": rep.overall.false_positive_rate,
                              "false_negative_rate": rep.overall.false_negative_rate}
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(payload, indent=2, default=str))
