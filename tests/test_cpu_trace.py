"""scripts/cpu_trace.py: a process that leaves the command's tree (reparented when its parent exits) is still
counted, and named as one that ``/usr/bin/time`` would miss."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The command: a middle process starts a burner (~2 s of CPU) in its own session, and exits 0.6 s later, so the
# burner is reparented to init (as vLLM's engine core when its API server dies first) while the command sleeps on.
MIDDLE = ("import subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
          "while time.process_time() - t < 2: pass'], start_new_session=True)\n"
          "time.sleep(0.6)")
COMMAND = f"import subprocess, sys, time\nsubprocess.run([sys.executable, '-c', {MIDDLE!r}])\ntime.sleep(3)"


def test_a_reparented_process_is_still_counted_and_named_as_left_the_tree(tmp_path):
    out = subprocess.run([sys.executable, "scripts/cpu_trace.py", "--csv", str(tmp_path / "c.csv"), "--interval",
                          "0.2", "--plot", str(tmp_path / "c.png"), "--", sys.executable, "-c", COMMAND],
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
    m = re.search(r"the command's processes ([\d.]+)", out)
    assert m and float(m.group(1)) > 0.4, out  # ~2 s of CPU over ~3.7 s
    left = re.search(r"cpu_trace: (\d+) s of CPU in processes that left", out)
    assert left and int(left.group(1)) >= 1, out  # the burner, after its parent died
    assert f"{Path(sys.executable).name} -c import time t = time.process_time()" in out.split("left the command's tree")[1], out
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    assert list(rows[0]) == ["t_s", "machine_cores", "tree_cores", "processes"] and len(rows) >= 10
    assert f"cpu_trace: plot {tmp_path / 'c.png'}" in out and (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_command_is_a_usage_error():
    r = subprocess.run([sys.executable, "scripts/cpu_trace.py", "--csv", "/dev/null"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: no command given")
