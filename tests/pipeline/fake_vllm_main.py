"""A fake vLLM server process for tests that start servers in another process (a Ray actor's): run as
``python -m tests.pipeline.fake_vllm_main -m vllm.entrypoints.openai.api_server --model M --host H --port P
--served-model-name N ...`` (the command ``infra.serving.VLLMServer`` builds, behind a stand-in python). It serves
``tests.pipeline.test_policy_pool.FakeVLLM`` on H:P and writes ``<M>/../fake-<P>.json`` (its pid, parent pid,
host, argv, ``VLLM_CPU_OMP_THREADS_BIND`` and the pid of a child it starts in its process group, as vLLM's
engine process is) for the test to read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    def arg(name: str, default: str = "") -> str:
        return argv[argv.index(name) + 1] if name in argv else default

    from tests.pipeline.test_policy_pool import FakeVLLM

    host, port = arg("--host", "127.0.0.1"), int(arg("--port", "0"))
    fake = FakeVLLM(arg("--served-model-name", "policy"), host=host, port=port)
    child = subprocess.Popen(["sleep", "3600"])  # as vLLM's engine process: in the server's process group
    record = {"pid": os.getpid(), "ppid": os.getppid(), "child": child.pid, "host": host, "port": fake.port,
              "argv": argv, "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")}
    (Path(arg("--model")).parent / f"fake-{fake.port}.json").write_text(json.dumps(record))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
