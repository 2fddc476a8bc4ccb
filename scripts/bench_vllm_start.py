"""Where a vLLM start's time goes on this machine, by phase (results in docs/notebook/benchmarks.md "Silences,
CPU and disk of a fresh `make run`").

Starts the CPU policy server (``make run``'s settings, ``infra.serving.server_from_config`` of
configs/cpu-smoke.yaml) ``--repeats`` times with an EMPTY compile cache (a fresh machine's first start), then
``--repeats`` times with the cache the first start filled (every later start: ``$RAO_HOME/cache/vllm``), and
prints the seconds at which each phase of ``infra.serving.VLLM_START_PHASES`` was reached, per start, and the
min / median / max of the total; after each start, one stream of 256 greedy tokens and its tokens per second
(a faster start must not cost generation speed).

Usage: .venv/bin/python scripts/bench_vllm_start.py [--repeats 2] [--config configs/cpu-smoke.yaml] [--env K=V ...]
(``--env``: a variable for the servers, e.g. ``VLLM_USE_AOT_COMPILE=0``, to compare compile settings)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--config", default="configs/cpu-smoke.yaml")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="a variable for the servers")
    ap.add_argument("--log-dir", default=None, help="keep the servers' logs there (default: removed with the rest)")
    args = ap.parse_args()
    for kv in args.env:
        k, _, v = kv.partition("=")
        os.environ[k] = v

    import httpx

    from infra.serving import server_from_config
    from rao_core.config import load_config

    cfg = load_config(args.config, [])
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-start-"))
    cache = work / "cache"
    rows: list[tuple[str, dict[str, float], float]] = []  # (cold|warm, phase times, tok/s)
    try:
        for label in ["cold"] * args.repeats + ["warm"] * args.repeats:
            if label == "cold" and cache.exists():
                shutil.rmtree(cache)
            os.environ["VLLM_CACHE_ROOT"] = str(cache)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")  # inductor's own cache: cold means cold
            logs = Path(args.log_dir) if args.log_dir else work / "logs"
            server = server_from_config(cfg, Path(cfg.model.path), log_dir=logs, switching=False)
            server.on_progress = lambda line: print(f"  {line}", flush=True)
            print(f"{label} start {sum(1 for r in rows if r[0] == label) + 1}/{args.repeats}", flush=True)
            try:
                server.start()
            except BaseException:
                server.stop()
                raise
            body = {"model": server.model, "prompt": "Count from one to fifty in words:", "max_tokens": 256,
                    "temperature": 0.0, "ignore_eos": True}
            try:
                t0 = time.monotonic()
                r = httpx.post(f"{server.base_url}/completions", json=body, timeout=300,
                               headers=server.headers).json()
                rows.append((label, dict(server.start_phases),
                             r["usage"]["completion_tokens"] / (time.monotonic() - t0)))
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    phases = list(dict.fromkeys(p for _, ph, _ in rows for p in ph))
    print("\nseconds after the start at which each phase was reached")
    print(f"{'phase':48s} " + " ".join(f"{label:>8s}" for label, _, _ in rows))
    for p in phases:
        print(f"{p:48s} " + " ".join(f"{ph.get(p, float('nan')):8.1f}" for _, ph, _ in rows))
    for label in ("cold", "warm"):
        tot = [ph.get("ready", float("nan")) for lab, ph, _ in rows if lab == label]
        tok = [s for lab, _, s in rows if lab == label]
        print(f"{label}: ready after min {min(tot):.1f} / median {statistics.median(tot):.1f} / max {max(tot):.1f} s; "
              f"then one stream of 256 greedy tokens at {statistics.median(tok):.1f} tok/s median (n = {len(tot)})")


if __name__ == "__main__":
    main()
