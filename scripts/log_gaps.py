"""Silent stretches of a long command: stamps each line of its output with the time it arrived, then reports
the longest gaps between two lines.

``rao run`` (or ``make run``) piped through it keeps its output in a file with an arrival time per line
(seconds since the first line), and the summary names the N longest silences with the lines before and
after them: the check that no stretch of ``make run`` is silent for more than 30 s, piped to a file.

Usage:
    make run 2>&1 | python scripts/log_gaps.py --out var/make-run.log
    python scripts/log_gaps.py --read var/make-run.log        # the summary of a stamped log again
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def gaps(stamped: list[tuple[float, str]], top: int = 5) -> list[tuple[float, str, str]]:
    """The ``top`` longest gaps of ``stamped`` ([(seconds, line)], in arrival order) as (gap s, line before,
    line after), longest first."""
    out = [(b[0] - a[0], a[1], b[1]) for a, b in zip(stamped, stamped[1:])]
    return sorted(out, key=lambda g: -g[0])[:top]


def read(path: Path) -> list[tuple[float, str]]:
    """The ``(seconds, line)`` pairs of a log written by this script (``<seconds>\\t<line>`` per line)."""
    rows = []
    for raw in path.read_text(errors="replace").splitlines():
        t, _, line = raw.partition("\t")
        try:
            rows.append((float(t), line))
        except ValueError:
            continue
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="stamped log to write while passing stdin through")
    ap.add_argument("--read", type=Path, help="summarise a stamped log instead of reading stdin")
    ap.add_argument("--top", type=int, default=5)
    a = ap.parse_args()
    if a.read:
        rows = read(a.read)
    else:
        if a.out is None:
            ap.error("--out is needed when reading stdin")
        rows, t0 = [], None
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with a.out.open("w") as f:
            for line in sys.stdin:
                now = time.monotonic()
                t0 = now if t0 is None else t0
                line = line.rstrip("\n")
                rows.append((now - t0, line))
                f.write(f"{now - t0:.2f}\t{line}\n")
                f.flush()
                print(line, flush=True)
    if len(rows) < 2:
        print("log gaps: fewer than two lines")
        return
    print(f"log gaps: {len(rows)} lines over {rows[-1][0]:.0f} s; longest silences:")
    for g, before, after in gaps(rows, a.top):
        print(f"  {g:6.1f} s  after: {before[:100]!r}\n            next:  {after[:100]!r}")


if __name__ == "__main__":
    main()
