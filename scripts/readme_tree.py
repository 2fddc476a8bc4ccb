"""Print the repository's file tree with one line per file (its module docstring's first line).

Used to keep the README's file tree true: ``.venv/bin/python scripts/readme_tree.py``.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_PREFIXES = ("tests/envs/fixtures/", "tests/judge/fixtures/")
NOTES = {
    "Makefile": "`make run` / `make test` / `make setup`",
    "pyproject.toml": "package metadata, `rao` console script, pytest settings",
    "prefect.yaml": "Prefect deployments: campaign (on demand) and nightly evaluation (cron)",
    ".ci/run": "CI entry point: runs the README's test command",
    "README.md": "this file",
    ".gitignore": "ignored: virtual environments, var/ (models, runs, services)",
}


def describe(path: Path) -> str:
    rel = path.relative_to(ROOT).as_posix()
    if rel in NOTES:
        return NOTES[rel]
    if rel.startswith("rao_core/judge/prompts/") or path.name == "judge.md":  # envs may ship judge.md
        name = path.parent.name if path.name == "judge.md" else path.stem
        return f"LLM-judge prompt for {name} (versioned front matter)"
    if path.suffix == ".py":
        try:
            doc = ast.get_docstring(ast.parse(path.read_text()))
        except SyntaxError:
            doc = None
        if doc:
            return doc.strip().splitlines()[0].rstrip(".")
        return "(package marker)" if path.name == "__init__.py" else ""
    if path.suffix in (".md", ".yaml", ".yml", ".in", ".lock", ".sh", ".txt", ".jinja"):
        for line in path.read_text(errors="replace").splitlines():
            line = line.strip().lstrip("#").strip()
            if line:
                return line[:110]
    return ""


def main() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in sorted(files):
        if f.startswith(SKIP_PREFIXES) or f.endswith("__init__.py") and f.startswith("tests/"):
            continue
        d = describe(ROOT / f)
        print(f"{f:<48} {d}" if d else f)


if __name__ == "__main__":
    main()
