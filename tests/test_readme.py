"""The README stays true: its first lines are the two commands, CI runs the test command, and the file
tree lists every tracked file (regenerate with `.venv/bin/python scripts/readme_tree.py`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_first_lines_are_the_two_commands_and_ci_runs_the_test_command():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[0].split("#")[0].strip() == "make run"
    assert lines[1].split("#")[0].strip() == "make test"
    ci = (ROOT / ".ci/run").read_text()
    assert "make test" in ci
    make = (ROOT / "Makefile").read_text()
    assert "\nrun: setup" in make and "\ntest: setup" in make


def test_file_tree_lists_every_tracked_file():
    readme = (ROOT / "README.md").read_text()
    out = subprocess.run(["python3", "scripts/readme_tree.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    listed = [ln.split()[0] for ln in out.stdout.splitlines() if ln.strip()]
    missing = [f for f in listed if f"\n{f} " not in readme and f"\n{f}\n" not in readme]
    assert not missing, f"README file tree is stale; missing {missing[:10]} (run scripts/readme_tree.py)"
