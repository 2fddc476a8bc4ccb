"""Bytes a tiny-model campaign leaves (checkpoints iter-0..3, champion iter-1), retention off vs the default.

The campaign's train stage on the tiny model with a real SeaweedFS, retention after each iteration as the
campaign runs it (no vLLM: samples are fixed). ``.venv/bin/python scripts/measure_retention.py`` (~3 min on
2 cores); prints local, S3 and on-disk bytes for each policy (docs/pipeline/gpu.md, retention).
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "infra"))
from test_retention_policy import _samples  # noqa: E402
import infra.retention as R  # noqa: E402
from infra.storage import SeaweedFSServer
from rao_core.config import CampaignConfig, CheckpointSettings
from rao_core.paths import tiny_model_path
from rao_core.samples import write_samples
from rao_core.train import TrainerConfig

TINY = str(tiny_model_path())
def du(p): return int(subprocess.check_output(["du", "-sb", str(p)]).split()[0]) if Path(p).exists() else 0

for label, policy in [("off (keep all, as before)", CheckpointSettings(keep_last=None, optimizer_state="all", local_copies="all")),
                      ("default", CheckpointSettings())]:
    d = Path(tempfile.mkdtemp(prefix="meas-"))
    os.environ["RAO_HOME"] = str(d / "home")
    from tasks import stages
    from infra.stage_io import RunContext
    from infra.stage_records import Checkpoint
    srv = SeaweedFSServer(data_dir=d / "s3", log_dir=d / "logs").start()
    try:
        cfg = CampaignConfig(name="meas", checkpoints=policy, trainer=TrainerConfig(loss_type="reinforce", lr=1e-3, micro_batch_size=1, process="inline"))
        ctx = RunContext(config=cfg, s3=srv.settings().__dict__, mlflow_uri="")
        store = ctx.store()
        R.registry_sources = lambda model: {store.uri("iter-1/checkpoint")}  # champion: iteration 1
        parent = Checkpoint(name="base", local=TINY)
        t0 = time.time()
        for k in (0, 1, 2, 3):  # iter-0 plays the warm start
            write_samples(ctx.local(f"iter-{k}/samples.jsonl"), _samples())
            parent = stages.train_policy.fn(ctx, k, f"s3://x/iter-{k}/samples.jsonl", parent).checkpoint
            if k:
                R.prune_campaign(store, policy, "m", ctx.local("checkpoints"))
        s3_logical = R._object_bytes(store, "")
    finally:
        srv.stop()
    print(f"{label}: local {du(d / 'home' / 'campaigns') / 1e6:.1f} MB, S3 objects {s3_logical / 1e6:.1f} MB, "
          f"SeaweedFS on disk {du(d / 's3') / 1e6:.1f} MB; total {(du(d / 'home') + du(d / 's3')) / 1e6:.1f} MB "
          f"({time.time() - t0:.0f} s)", flush=True)
    subprocess.run(["rm", "-rf", str(d)])
