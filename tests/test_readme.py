"""The README stays true and short: its first lines are the two commands, CI runs the test command, it fits a
front page (<= 15,000 characters, the picture and the claims table near the top), its links resolve, its map
names every folder, and the site's file map (docs/files.md) lists every tracked file (regenerate both with
`scripts/readme_tree.py --short` / `--page`). The claims table's figures: tests/test_claims_table.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_MAX_CHARS = 15_000  # a front page read in five minutes


def tree(*args: str) -> list[str]:
    """The first column (a path) of each line ``scripts/readme_tree.py`` prints."""
    out = subprocess.run(["python3", "scripts/readme_tree.py", *args], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return [ln.split()[0] for ln in out.stdout.splitlines() if ln.strip()]


def test_the_first_code_block_is_the_two_commands_and_ci_runs_the_test_command():
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("```"))
    assert start <= 3, "the two commands come right after the title"
    assert lines[start + 1].split("#")[0].strip() == "make run"
    assert lines[start + 2].split("#")[0].strip() == "make test"
    assert lines[start + 3] == "```"
    ci = (ROOT / ".ci/run").read_text()
    assert "make test" in ci
    make = (ROOT / "Makefile").read_text()
    assert "\nrun: setup" in make and "\ntest: setup" in make


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text) <= README_MAX_CHARS, f"README.md has {len(text)} characters (at most {README_MAX_CHARS})"
    lines = text.splitlines()
    picture = next(i for i, ln in enumerate(lines) if ln.startswith("!["))
    claims = lines.index("<!-- claims:start -->")
    assert picture < 15 and claims < 45, f"picture at line {picture + 1}, claims table at line {claims + 1}"
    for section in ("## Commands", "## Files"):
        assert section in lines


def test_the_readmes_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)(?: \"[^\"]*\")?\)", text)
    local = [t.split("#")[0] for t in targets if "://" not in t]
    assert len(local) >= 10
    assert not [t for t in local if not (ROOT / t).exists()]


def test_the_readmes_map_names_every_folder():
    readme = (ROOT / "README.md").read_text()
    missing = [f for f in tree("--short") if f"\n{f} " not in readme and f"\n{f}\n" not in readme]
    assert not missing, f"README map is stale; missing {missing[:10]} (run scripts/readme_tree.py --short)"


def test_file_map_page_lists_every_tracked_file():
    page = (ROOT / "docs/files.md").read_text()
    missing = [f for f in tree() if f"\n{f} " not in page and f"\n{f}\n" not in page]
    assert not missing, (f"docs/files.md is stale; missing {missing[:10]} "
                         "(run python3 scripts/readme_tree.py --page > docs/files.md)")
