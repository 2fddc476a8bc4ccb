"""Regression: a checkout and a virtual environment under /tmp (hidden by the sandbox's private /tmp) must
still start REPLs; bubblewrap binds them back read-only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                reason="needs bubblewrap and root (as on CI)")


def test_repl_starts_from_a_checkout_and_venv_under_tmp():
    root = Path(tempfile.mkdtemp(prefix="rao-tmpcheckout-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        shutil.copytree(REPO / "rao_core", root / "rao_core", ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(root / "venv")],
                       check=True)
        site = [p for p in sys.path if p.endswith("site-packages")]
        code = ("import sys, asyncio, json; sys.path[:0] = " + repr([str(root)] + site) + "\n"
                "from rao_core.runtime.sandbox import SandboxLimits, run_cell_once\n"
                "r = asyncio.run(run_cell_once('print(6 * 7)', SandboxLimits()))\n"
                "print(json.dumps({'prefix': sys.prefix, 'out': r.output, 'status': str(r.status.value)}))\n")
        out = subprocess.run([str(root / "venv/bin/python"), "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        res = json.loads(out.stdout.strip().splitlines()[-1])
        assert res["prefix"].startswith("/tmp/")  # the orchestrator really ran from a venv under /tmp
        assert res["out"].strip() == "42" and res["status"] == "ok"
    finally:
        shutil.rmtree(root, ignore_errors=True)
