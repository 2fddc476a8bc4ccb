"""Ray's overhead on the generate stage (results go to docs/benchmarks/pipeline.md "Rollouts on Ray").

The same trees (``--tasks`` RL tasks x ``--G`` rollouts: 32 by default) are grown by the generate stage
(``tasks.stages.generate_trees``, trees written to S3 as in a campaign) with ``execution.backend: local``, then
``ray`` with 1 shard (one worker) and 2 shards (two workers), against ONE vLLM server, in one run, repeated
``--repeats`` times in a rotating order (local, ray-1, ray-2; then ray-1, ray-2, local; ...), the server's
prefix cache emptied before every run. Printed: each mode's stage wall time (min / median / max), its trees'
mean wall time, and the Ray overhead = median(ray) - median(local) per stage, per tree, and as a share of
the local stage's wall time and of a tree's wall time. On 2 cores no speed-up is expected: the figure that
matters is the overhead (target: <= 5% of tree wall time).

Everything runs here: SeaweedFS (embedded), one vLLM server (``--model``: the tiny model by default, or the
CPU policy SmolLM2-135M), a local Ray cluster (``--ray-cpus`` CPUs).

Usage: .venv/bin/python scripts/bench_ray_rollouts.py [--model tiny|smollm2] [--repeats 3] [--tasks 16 --G 2]
       [--max-new-tokens 64] [--max-steps 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--G", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--ray-cpus", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the work folder (server logs) after the run")
    args = ap.parse_args()

    import httpx
    import ray

    from infra.serving import VLLMServer, has_cuda_gpu
    from infra.storage import SeaweedFSServer
    from rao_core.config import load_config
    from rao_core.paths import rao_home, tiny_model_path
    from rao_core.tree import read_trees
    from infra.stage_io import RunContext
    from infra.stage_records import ServedEndpoint
    from infra.ray_rollouts import worker_runtime_env
    from tasks.stages import fetch, generate_trees

    model = tiny_model_path() if args.model == "tiny" else rao_home() / "models" / "smollm2-135m-instruct"
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    s3 = SeaweedFSServer(data_dir=work / "s3", log_dir=work / "logs")
    server = VLLMServer(model, served_model_name="policy", max_model_len=2048, log_dir=work / "logs")
    modes = {"local": {}, "ray-1": {"execution.backend": "ray", "execution.shards": 1},
             "ray-2": {"execution.backend": "ray", "execution.shards": 2}}
    order = list(modes)
    walls: dict[str, list[float]] = {m: [] for m in modes}
    tree_walls: dict[str, list[float]] = {m: [] for m in modes}
    identity: dict[str, list[tuple]] = {}
    try:  # everything started is stopped, also when a start fails
        s3.start()
        print(f"starting vLLM on {model.name} and a local Ray cluster ({args.ray_cpus} CPUs) ...", flush=True)
        server.start()
        ray.init(address="local", num_cpus=args.ray_cpus, object_store_memory=300 * 1024 ** 2,
                 include_dashboard=False, log_to_driver=False, runtime_env=worker_runtime_env(),
                 logging_level="WARNING")
        served = ServedEndpoint(base_url=server.base_url, model=server.model, seeded=has_cuda_gpu())  # as the serve stage
        for r in range(args.repeats):
            for mode in order[r % 3:] + order[:r % 3]:
                cfg = load_config(None, {"name": f"bench-{mode}-{r}", "tasks.tasks_per_iteration": args.tasks,
                                         "algo.G": args.G, "runtime.max_new_tokens": args.max_new_tokens,
                                         "runtime.max_steps_per_node": args.max_steps,
                                         "runtime.context_window": 2048, "serving.max_model_len": 2048,
                                         "runtime.max_infra_failure_share": 1.0, **modes[mode]})
                ctx = RunContext(config=cfg, s3=s3.settings().__dict__, mlflow_uri="")
                httpx.post(f"{server.url}/reset_prefix_cache", timeout=30)
                t0 = time.monotonic()
                out = generate_trees.fn(ctx, 1, served, str(model))
                wall = time.monotonic() - t0
                trees = read_trees(fetch(ctx, out.trees_uri, "iter-1/bench.jsonl"))
                walls[mode].append(wall)
                tree_walls[mode] += [t.wall_s for t in trees]
                identity.setdefault(mode, sorted((t.task_id, t.rollout_index, t.seed) for t in trees))
                print(f"repeat {r + 1}/{args.repeats} {mode:6s} {out.num_trees} trees in {wall:6.1f} s "
                      f"(generation {out.generation_s or 0:.1f} s, crashed {out.crashed}, "
                      f"infra {out.infra_failures or 'none'})", flush=True)
    finally:
        ray.shutdown()
        server.stop()
        s3.stop()
        if args.keep:
            print(f"kept {work} (server and storage logs under logs/)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    same = all(identity[m] == identity["local"] for m in modes)
    n = args.tasks * args.G
    print(f"\n{n} trees per run ({args.tasks} tasks x G {args.G}), {args.model}, {args.repeats} repeats; the same "
          f"trees (task, rollout, seed) in every mode: {same}")
    print(f"{'mode':8s} {'stage wall s min / median / max':32s} {'tree wall s (mean)':>18s}")
    for m in modes:
        w = walls[m]
        print(f"{m:8s} {min(w):8.1f} / {statistics.median(w):6.1f} / {max(w):6.1f}        "
              f"{statistics.mean(tree_walls[m]):18.2f}")
    base = statistics.median(walls["local"])
    tree_s = statistics.mean(tree_walls["local"])
    for m in ("ray-1", "ray-2"):
        over = statistics.median(walls[m]) - base
        print(f"overhead {m}: {over:+.1f} s per stage = {over / base:+.1%} of the local stage, {over / n:+.3f} s "
              f"per tree = {over / n / tree_s:+.1%} of a tree's wall time ({tree_s:.2f} s)")


if __name__ == "__main__":
    main()
