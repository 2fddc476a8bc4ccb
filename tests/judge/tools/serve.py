"""Serve SmolLM2-135M-Instruct with vLLM until killed; writes the base URL to the file given.

    python -m tests.judge.tools.serve URLFILE   # then: kill <pid>
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from infra.serving import VLLMServer
from rao_core.paths import default_model_path

if __name__ == "__main__":
    srv = VLLMServer(default_model_path(), served_model_name="smollm2-135m-instruct", max_model_len=4096,
                     start_timeout_s=1500)
    signal.signal(signal.SIGTERM, lambda *a: (srv.stop(), sys.exit(0)))
    srv.start()
    Path(sys.argv[1]).write_text(f"{srv.base_url} {srv.model}\n")
    try:
        while srv.alive():
            time.sleep(2)
    finally:
        srv.stop()
