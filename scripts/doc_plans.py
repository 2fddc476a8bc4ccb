"""The ``rao run --plan`` blocks of the docs, printed again from the code: check them (default) or rewrite them.

A block is a fenced code block that follows a backticked ``rao run ... --plan ...`` command with only plain text
(no backtick) between them. A block whose first line is the plan's ``plan of ...`` line holds the whole plan;
any other block holds the plan's sections (separated by blank lines) whose first lines it shows, in the plan's
order. Paths under the repository are printed relative to it, ``RAO_HOME`` and ``RAO_VLLM_PYTHON`` at their
defaults, so that a block reads the same on every machine.

    python scripts/doc_plans.py            # exit 1 naming each stale block
    python scripts/doc_plans.py --write    # rewrite the stale blocks in place
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Pages that hold plan blocks.
PAGES = ("docs/pipeline/gpu.md", "docs/pipeline/ray.md")
BLOCK = re.compile(r"`(rao run [^`]*?--plan[^`]*)`[^`]*?\n```\n(.*?)\n```", re.S)


def plan_text(command: str) -> str:
    """What ``command`` (a ``rao run ... --plan ...`` line as written in a page, line breaks allowed) prints,
    run through the CLI itself in this process, with the repository's path removed. Raises ValueError naming
    the command when it exits non-zero (a usage error, or a plan that cannot run)."""
    os.environ.pop("RAO_HOME", None)
    os.environ.pop("RAO_VLLM_PYTHON", None)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from typer.testing import CliRunner

    from rao_cli.main import app

    r = CliRunner().invoke(app, shlex.split(command)[1:])
    if r.exit_code:
        raise ValueError(f"{' '.join(command.split())!r} exited {r.exit_code}: {r.output.strip()[-500:]}")
    return r.stdout.rstrip("\n").replace(f"{ROOT}/", "")


def block_text(command: str, shown: str) -> str:
    """The block ``shown`` after ``command`` should be: the whole plan, or the plan's sections it shows."""
    text = plan_text(command)
    if shown.startswith("plan of "):
        return text
    heads = {line for line in shown.splitlines() if line and not line.startswith(" ")}
    sections = text.split("\n\n")
    return "\n\n".join(s for s in sections if s.splitlines()[0] in heads)


def stale_blocks(page: Path) -> tuple[str, list[str]]:
    """The page's text with every plan block as the code prints it, and the commands of the blocks that
    differed."""
    text, stale = page.read_text(), []

    def fresh(m: re.Match) -> str:
        new = block_text(m.group(1), m.group(2))
        if new != m.group(2):
            stale.append(" ".join(m.group(1).split()))
        return m.group(0).replace(m.group(2), new)

    return BLOCK.sub(fresh, text), stale


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the stale blocks")
    write = ap.parse_args().write
    bad = 0
    for rel in PAGES:
        page = ROOT / rel
        text, stale = stale_blocks(page)
        for cmd in stale:
            print(f"{'rewrote' if write else 'error: stale plan block'} in {rel}: {cmd}")
        bad += len(stale)
        if write and stale:
            page.write_text(text)
    return 1 if bad and not write else 0


if __name__ == "__main__":
    sys.exit(main())
