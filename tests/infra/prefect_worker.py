"""The worker command that ``rao services up`` and ``rao deploy`` print, started as a user pastes it in a shell,
and a flow run followed to its final state."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.process import kill_group

#: The states a flow run ends in.
FINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


@contextmanager
def printed_worker(line: str, env: dict[str, str], cwd: Path) -> Iterator[Path]:
    """Run the printed worker command ``line`` with ``bash -c`` (the shell reads its ``$(cat FILE)``, as when the
    line is pasted), in ``cwd`` and a session of its own, with ``env`` less ``PREFECT_API_AUTH_STRING`` (the line
    brings its own credential). Yields the worker's log, ``cwd/worker.log``; stops the worker's process group on
    exit."""
    shell_env = {k: v for k, v in env.items() if k != "PREFECT_API_AUTH_STRING"}
    log = Path(cwd) / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen(["bash", "-c", line], env=shell_env, cwd=cwd, start_new_session=True, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        yield log
    finally:
        kill_group(worker.pid)
        worker.wait(timeout=30)


def wait_for_flow_run(client, flow_run_id: str, timeout_s: float = 300) -> dict:
    """The flow run ``flow_run_id`` once in a final state (:data:`FINAL_STATES`), asked of the Prefect API client
    ``client`` every 2 s; as last seen when ``timeout_s`` runs out first."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = client.get(f"flow_runs/{flow_run_id}").json()
        if run["state"]["type"] in FINAL_STATES or time.monotonic() > deadline:
            return run
        time.sleep(2)
