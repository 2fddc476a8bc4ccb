"""Warm-start sizing on CPU: build demonstrations, SFT SmolLM2-135M, evaluate the checkpoint via vLLM.

    .venv/bin/python scripts/warmstart_sizing.py sft --n-tasks 24 --epochs 2 --lr 1e-4 --out var/sizing/sft-24
    .venv/bin/python scripts/warmstart_sizing.py eval --model var/sizing/sft-24 --n 10 --difficulties easy medium hard

``sft`` prints the demonstration statistics, SFT wall time, tokens and per-step loss; ``eval`` serves the
checkpoint with vLLM and prints the evaluation table (recursive mode; ``--single`` adds the single-agent
baseline). Results are written as JSON next to the checkpoint (``sizing-sft.json``, ``sizing-eval-*.json``).
Numbers measured with it are in docs/results.md ("Warm start sizing").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cmd_sft(a: argparse.Namespace) -> None:
    from rao_core.paths import default_model_path
    from rao_core.warmstart import DemoConfig, default_sft_trainer_config, recommended_runtime_config, run_warm_start

    model = Path(a.model or default_model_path())
    dc = DemoConfig(n_tasks=a.n_tasks, seed=a.seed, difficulties=a.difficulties,
                    single_agent_fraction=a.single_fraction)
    tc = default_sft_trainer_config(epochs=a.epochs, lr=a.lr, grad_accum=a.grad_accum,
                                    gradient_checkpointing=not a.no_checkpointing)
    t0 = time.perf_counter()
    res = run_warm_start("textcraft-synth", model, a.out, demo_config=dc, trainer_config=tc,
                         runtime_config=recommended_runtime_config(),
                         trees_path=Path(a.out).parent / f"{Path(a.out).name}-demos.jsonl",
                         on_step=lambda m: print(json.dumps({k: round(m[k], 4) for k in
                                                             ("train/step", "train/epoch", "train/loss",
                                                              "train/tokens_per_s", "train/step_s")}), flush=True))
    out = {"demo_config": dc.model_dump(), "trainer_config": tc.model_dump(mode="json"), "stats": res.stats,
           "demo_wall_s": res.demo_wall_s, "sft_wall_s": res.sft_wall_s, "num_samples": res.num_samples,
           "num_tokens": res.num_tokens, "num_assistant_tokens": res.num_assistant_tokens,
           "total_wall_s": time.perf_counter() - t0,
           "first_loss": res.train_metrics[0]["train/loss"], "last_loss": res.train_metrics[-1]["train/loss"],
           "steps": len(res.train_metrics)}
    (Path(a.out) / "sizing-sft.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


def cmd_eval(a: argparse.Namespace) -> None:
    from infra.serving import VLLMServer
    from rao_core.evaluation import EvalConfig, evaluate_suite, render_report
    from rao_core.warmstart import recommended_runtime_config

    modes = ["recursive", "single"] if a.single else ["recursive"]
    cfg = EvalConfig(difficulties=a.difficulties, n_tasks=a.n, seed=a.seed, modes=modes)
    t0 = time.perf_counter()
    with VLLMServer(a.model, served_model_name="policy", max_model_len=4096, kv_cache_gib=a.kv_cache_gib) as srv:
        start_s = time.perf_counter() - t0
        report = asyncio.run(evaluate_suite(cfg, env="textcraft-synth", base_url=srv.base_url, model="policy",
                                            runtime=recommended_runtime_config(temperature=a.temperature),
                                            tokenizer=a.model))
    render_report(report)
    out = {"server_start_s": start_s, "metrics": report.metrics(), "rows": [r.model_dump() for r in report.rows]}
    name = f"sizing-eval-{a.tag or '-'.join(a.difficulties)}.json"
    (Path(a.model) / name).write_text(json.dumps(out, indent=2))
    print(json.dumps(out["metrics"], indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sft")
    s.add_argument("--n-tasks", type=int, default=24)
    s.add_argument("--epochs", type=int, default=2)
    s.add_argument("--lr", type=float, default=1e-4)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--difficulties", nargs="+", default=["easy", "medium"])
    s.add_argument("--model", default=None)
    s.add_argument("--single-fraction", type=float, default=0.0, help="DemoConfig.single_agent_fraction")
    s.add_argument("--grad-accum", type=int, default=4)
    s.add_argument("--no-checkpointing", action="store_true", help="no gradient checkpointing (faster, more memory)")
    s.add_argument("--out", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--n", type=int, default=10)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (the experiment's 0.7)")
    e.add_argument("--kv-cache-gib", type=int, default=6, help="vLLM CPU KV cache; 2 GiB (46K fp32 tokens) "
                   "cannot hold 30 concurrent trees' contexts")
    e.add_argument("--difficulties", nargs="+", default=["easy", "medium", "hard"])
    e.add_argument("--single", action="store_true")
    e.add_argument("--tag", default="")
    a = p.parse_args()
    {"sft": cmd_sft, "eval": cmd_eval}[a.cmd](a)


if __name__ == "__main__":
    main()
