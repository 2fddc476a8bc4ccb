"""scripts/log_gaps.py: the stamped log it writes, and the longest silences it reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_stamps_lines_passes_them_through_and_reports_the_longest_silence(tmp_path):
    feed = "import sys, time\nprint('a', flush=True); time.sleep(0.6); print('b', flush=True); print('c', flush=True)"
    src = subprocess.Popen([sys.executable, "-c", feed], stdout=subprocess.PIPE)
    out = subprocess.run([sys.executable, "scripts/log_gaps.py", "--out", str(tmp_path / "s.log"), "--top", "1"],
                         cwd=ROOT, stdin=src.stdout, capture_output=True, text=True, check=True).stdout
    src.wait()
    assert out.splitlines()[:3] == ["a", "b", "c"]  # passed through unchanged
    rows = [ln.split("\t") for ln in (tmp_path / "s.log").read_text().splitlines()]
    assert [r[1] for r in rows] == ["a", "b", "c"] and float(rows[0][0]) == 0.0
    assert float(rows[1][0]) >= 0.5 and float(rows[2][0]) - float(rows[1][0]) < 0.5
    assert "log gaps: 3 lines" in out and "after: 'a'" in out and "next:  'b'" in out and "'c'" not in out
    again = subprocess.run([sys.executable, "scripts/log_gaps.py", "--read", str(tmp_path / "s.log"), "--top", "1"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert again == out[out.index("log gaps:"):]
