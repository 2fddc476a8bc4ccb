"""A flow that serves a checkpoint with the campaign's own serving task and hooks, for the cancel drill
(``tests/pipeline/test_cancel_during_start.py``): run as ``python -m tests.pipeline.cancel_drill_flow``, it serves
the flow as a Prefect deployment ``rao-cancel-drill/drill`` (a runner, as a worker runs flows: a cancelled run's
process is stopped by the runner and its hooks run there)."""

from __future__ import annotations

from prefect import flow

from tasks.serve import STOP_SERVER_HOOKS


@flow(name="rao-cancel-drill", **STOP_SERVER_HOOKS)
def serve_drill(model: str) -> str:
    """Serve checkpoint folder ``model`` on the flow's policy server (``tasks.serve.serve_checkpoint``)."""
    from infra.stage_io import RunContext
    from infra.stage_records import Checkpoint
    from rao_core.config import load_config
    from tasks.serve import serve_checkpoint  # here: the runner pickles the function with the globals it uses

    cfg = load_config("configs/cpu-smoke.yaml", {"name": "drill"})
    ctx = RunContext(config=cfg, s3={}, mlflow_uri="")
    return serve_checkpoint(ctx, Checkpoint(name="iter-0", local=model)).base_url


if __name__ == "__main__":  # the flow by its module's name: the runner pickles it by reference
    from tests.pipeline.cancel_drill_flow import serve_drill as drill

    drill.serve(name="drill")
