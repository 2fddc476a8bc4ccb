"""The nightly regression's false-alarm rate, measured (results in docs/pipeline/nightly.md "Nightly
regression").

Runs the nightly (``flows.evaluate.rao_evaluate``, the deployment's code path) ``--runs`` times on one checkpoint
against itself: ``--model`` (default ``champion``) of campaign ``--campaign``'s registered model, with
``fresh_champion`` so that every run evaluates the checkpoint twice on the same tasks (the config's training
benchmark at ``eval.regression_n_tasks`` tasks, or ``--n-tasks``; with ``--whole-suite`` the config's whole
benchmark suite, the nightly's default, its metrics Holm-corrected together), and decides as a night does. Every
failure is a false alarm. Prints one line per run (successes of both evaluations, losses/wins, p, decision, wall time), then the
false alarms / runs with their Wilson 95% interval, the smallest drop the settings catch with 80% power
(``rao_core.regression.detectable_drop``) and the min / median / max wall time of a run. ``--out`` writes it all
as JSON, the runs so far and their summary after each run: a re-run with the same settings and ``--out`` resumes
after them, so the measurement can be spread over several sittings, and ``--report`` prints the summary of the
runs in ``--out`` without running anything (what docs/pipeline/nightly.md is written from after a partial sitting). Each
run records its commit, its date and its host: the checkpoint is the campaign's alias on that machine
(``same_checkpoint`` names its version), so sittings on different machines check different ``make run``
checkpoints, each against itself, which is what a false-alarm rate of unchanged models asks. The documented
``--out`` is ``docs/results/nightly-false-alarms.json``, committed after each sitting, since a machine's
campaigns are not kept from one session to the next.

Needs a registered champion (``make run`` registers campaign ``smoke``'s) and the services of a campaign. On the
CPU defaults a run is two evaluations of 100 tasks plus a vLLM start (measured 388-450 s on 2 cores, 20 runs),
so 20 runs take about 2.5 hours. Run it on an otherwise quiet machine.

Usage: .venv/bin/python scripts/bench_nightly_false_alarms.py [--runs 20] [--config configs/cpu-smoke.yaml]
       [--campaign smoke] [--model champion] [--n-tasks N] [--whole-suite]
       [--out docs/results/nightly-false-alarms.json] [--report]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from pathlib import Path


def _comparison(name: str) -> list[dict]:
    """The comparison rows of the newest evaluation run named ``<name>-...`` (its evaluation.json)."""
    import mlflow

    runs = mlflow.search_runs(search_all_experiments=True, output_format="list", max_results=1,
                              filter_string=f"tags.`rao.kind` = 'evaluation' and attributes.run_name LIKE '{name}-%'",
                              order_by=["attributes.start_time DESC"])
    if not runs:
        return []
    return mlflow.artifacts.load_dict(f"runs:/{runs[0].info.run_id}/evaluation.json").get("comparison", [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--config", default="configs/cpu-smoke.yaml")
    ap.add_argument("--campaign", default="", help="Campaign whose registered model is used (default: the config's).")
    ap.add_argument("--model", default="champion", help="Alias or version checked against itself.")
    ap.add_argument("--n-tasks", type=int, default=None, help="Tasks per difficulty (default eval.regression_n_tasks).")
    ap.add_argument("--whole-suite", action="store_true",
                    help="Evaluate the config's whole benchmark suite each run (the nightly's default: every benchmark "
                         "with its paired test, Holm-corrected together), not the training benchmark alone.")
    ap.add_argument("--out", default="", help="Write the runs and the summary as JSON here.")
    ap.add_argument("--report", action="store_true",
                    help="Print the summary of the runs already in --out and exit (runs nothing, writes nothing).")
    args = ap.parse_args()
    if args.runs < 1:
        raise SystemExit(f"error: --runs {args.runs}: needs at least 1 run")
    if args.report and not args.out:
        raise SystemExit("error: --report needs --out, the record to summarise")

    from rao_cli.pipeline_cmd import _prefect_env

    _prefect_env()
    from flows.campaign import CampaignParams
    from flows.evaluate import EvaluateParams, RegressionError, champion_suite, default_suite, rao_evaluate
    from research.designs import git_output
    from rao_core.paths import REPO_ROOT

    base = CampaignParams(config=args.config).resolve()
    entry = champion_suite(base, args.n_tasks)
    suite = default_suite(base, args.n_tasks) if args.whole_suite else [entry]
    tol, alpha = base.eval.tolerance, base.eval.regression_alpha
    label = {"config": args.config, "model": args.model, "campaign": args.campaign or base.name}
    runs: list[dict] = _done_runs(args.out, args)
    if args.report:
        if not runs:
            raise SystemExit(f"error: --report: {args.out} holds no runs of these settings")
        print(f"{args.out}: {len(runs)} of {args.runs} runs")
        print(summary_text(summarise(runs, entry, tol, alpha, label)))
        return
    if runs:
        print(f"resuming {args.out}: runs 1-{len(runs)} already done", flush=True)
    for i in range(len(runs) + 1, args.runs + 1):
        name = f"bench-fa-{i}"
        params = EvaluateParams(config=args.config, model=args.model, campaign=args.campaign, suite=suite,
                                name=name, fresh_champion=True)
        t0 = time.monotonic()
        try:
            rao_evaluate(params)
            alarm = False
        except RegressionError:
            alarm = True
        wall = time.monotonic() - t0
        rows = _comparison(name)
        runs.append({"run": i, "false_alarm": alarm, "wall_s": round(wall, 1), "comparison": rows,
                     "commit": git_output("-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"), "host": socket.gethostname(),
                     "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        detail = "; ".join(f"{r['metric']}: champion {r['champion']}, candidate {r['candidate']}, losses/wins "
                           f"{r['losses/wins']}, p {r['p']}, {r['status']}, {r['same_checkpoint']}" for r in rows)
        print(f"run {i}/{args.runs}: {'FALSE ALARM' if alarm else 'ok'} in {wall:.0f} s  {detail}", flush=True)
        if args.out:  # after every run, so that an interrupted measurement resumes here
            _write(args.out, {"settings": _settings(args), "complete": False,
                              "summary": summarise(runs, entry, tol, alpha, label), "runs": runs})

    summary = summarise(runs, entry, tol, alpha, label)
    print(summary_text(summary))
    if args.out:
        _write(args.out, {"settings": _settings(args), "complete": len(runs) >= args.runs, "summary": summary,
                          "runs": runs})


def summarise(runs: list[dict], entry, tol: float, alpha: float, label: dict) -> dict:
    """The record's ``summary`` of ``runs`` so far (also of a partial sitting, so that docs/pipeline/nightly.md is
    written from it): false alarms with their Wilson 95% interval (``rao_core.evaluation.wilson_interval``), the drop
    caught with 80% power at ``entry.n_tasks`` tasks (``rao_core.regression.detectable_drop``), the wall seconds of
    a run (min / median / max), each evaluation's successes and each comparison's drop (min / max over every run),
    the smallest p and whether every comparison was ``ok``. Beside the measured rate: the test's own false-alarm
    rate for an unchanged checkpoint (``rao_core.regression.power`` at drop 0, the champion's success rate set to
    the mean of every evaluation, rounded to 0.1) and how many runs without an alarm would put the Wilson upper
    bound under 0.05 (20 runs cannot: 0/20 gives 0.16).

    Raises ValueError when ``runs`` is empty."""
    from rao_core.evaluation import wilson_interval
    from rao_core.regression import detectable_drop, power

    if not runs:
        raise ValueError("no runs to summarise")
    alarms = sum(r["false_alarm"] for r in runs)
    lo, hi = wilson_interval(alarms, len(runs))
    walls = [r["wall_s"] for r in runs]
    rows = [r for run in runs for r in run["comparison"]]
    scores = [n for r in rows for k in ("champion", "candidate") if (n := _successes(r.get(k))) is not None]
    ps = [float(r["p"]) for r in rows if isinstance(r.get("p"), (int, float))]
    drops = [float(r["drop"]) for r in rows if isinstance(r.get("drop"), (int, float))]
    p_champion = round(statistics.mean(scores) / entry.n_tasks, 1) if scores else 0.5
    design = power(entry.n_tasks, 0.0, tolerance=tol, alpha=alpha, p_champion=p_champion)
    clean_runs = next(n for n in range(1, 1000) if wilson_interval(0, n)[1] <= 0.05)
    return {"runs": len(runs), "false_alarms": alarms, "false_alarm_ci95": [round(lo, 3), round(hi, 3)],
            "false_alarm_design": round(design, 4), "design_p_champion": p_champion,
            "runs_for_upper_below_005": clean_runs,
            "n_tasks": entry.n_tasks, "difficulties": entry.difficulties, "modes": entry.modes,
            "tolerance": tol, "alpha": alpha,
            "detectable_drop_80": detectable_drop(entry.n_tasks, tolerance=tol, alpha=alpha),
            "wall_s": {"min": min(walls), "median": statistics.median(walls), "max": max(walls)},
            "evaluation_range": [min(scores), max(scores)] if scores else None,
            "drop_range": [min(drops), max(drops)] if drops else None, "min_p": min(ps) if ps else None,
            "all_ok": all(r.get("status") == "ok" for r in rows), **label}


def _successes(cell) -> int | None:
    """The successes of a comparison cell such as ``"29/100 = 0.290 [0.21, 0.39]"`` (None when it has none)."""
    head = str(cell).split("/")[0].strip()
    return int(head) if "/" in str(cell) and head.isdigit() else None


def summary_text(s: dict) -> str:
    """The printed lines of a :func:`summarise` record."""
    lo, hi = s["false_alarm_ci95"]
    drop = s["detectable_drop_80"]
    lines = [f"false alarms: {s['false_alarms']}/{s['runs']} (95% CI [{lo:.2f}, {hi:.2f}]); n = {s['n_tasks']} tasks "
             f"per difficulty, tolerance {s['tolerance']:g}, alpha {s['alpha']:g}",
             "detectable drop at 80% power: " + (f"{drop:.3f}" if drop is not None else "none (too few tasks)")
             + " (independent evaluations, champion success 0.5: a conservative bound)",
             f"the test's own false-alarm rate for an unchanged checkpoint: {s['false_alarm_design']:.4f} (champion "
             f"success {s['design_p_champion']:g}); a Wilson upper bound under 0.05 takes "
             f"{s['runs_for_upper_below_005']} runs without an alarm",
             f"wall time per run: min {s['wall_s']['min']:.0f} s, median {s['wall_s']['median']:.0f} s, "
             f"max {s['wall_s']['max']:.0f} s"]
    if s.get("evaluation_range") and s.get("drop_range"):
        lines.append(f"successes per evaluation: {s['evaluation_range'][0]} to {s['evaluation_range'][1]} of "
                     f"{s['n_tasks']}; drops {s['drop_range'][0]:+.2f} to {s['drop_range'][1]:+.2f}; smallest p "
                     f"{s['min_p']}; every comparison ok: {'yes' if s['all_ok'] else 'no'}")
    return "\n".join(lines)


def _settings(args: argparse.Namespace) -> dict:
    whole = {"whole_suite": True} if getattr(args, "whole_suite", False) else {}  # records of one benchmark lack it
    return {"config": args.config, "campaign": args.campaign, "model": args.model, "n_tasks": args.n_tasks, **whole}


def _done_runs(out: str, args: argparse.Namespace) -> list[dict]:
    """The runs an earlier, interrupted measurement with the same settings wrote to ``out`` (none without
    ``out`` or when the file is missing); exits with one ``error:`` line when ``out`` holds other settings."""
    if not out or not Path(out).exists():
        return []
    try:
        old = json.loads(Path(out).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: --out {out}: not a JSON record of this script ({e}); name another file")
    if old.get("settings") != _settings(args):
        raise SystemExit(f"error: --out {out} holds runs with other settings ({old.get('settings')}); name another file")
    return [r for r in old.get("runs", []) if r.get("run", 0) <= args.runs]


def _write(out: str, data: dict) -> None:
    """``data`` to ``out`` through ``rao_core.jsonl.atomic_path`` (an interrupted write leaves the last record)."""
    from rao_core.jsonl import atomic_path

    with atomic_path(out) as tmp:
        Path(tmp).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
