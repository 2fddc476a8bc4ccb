"""docs/tutorial.md is this test's input: every file it shows is written, every ``bash`` block and every
untitled ``python`` block is run, in the page's order, in an empty folder (the tutorial and the code
cannot drift apart). ``text`` blocks are shown output, not run.

The page's ``rao run`` is a real campaign (SmolLM2-135M served by vLLM on CPU, the embedded SeaweedFS, MLflow
and Prefect) under a ``RAO_HOME`` of its own whose ``models/`` is the project's: about 10 minutes here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rao_core.paths import REPO_ROOT, models_dir

PAGE = REPO_ROOT / "docs" / "tutorial.md"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.S | re.M)


def blocks(text: str) -> list[tuple[str, str | None, str]]:
    """The page's fenced blocks as ``(language, title or None, body)``, in order (the nested fence of the
    expert's cell inside a Python string is not a block: only fences at the start of a line count, and the
    expert module's body keeps its inner fences inside quotes)."""
    out = []
    for lang, info, body in FENCE.findall(text):
        title = re.search(r'title="([^"]+)"', info)
        out.append((lang, title.group(1) if title else None, body))
    return out


def test_the_page_parses_into_the_blocks_it_shows():
    """The parser finds what a reader sees: two files, the commands, the Python read-back (a test of the
    test: a fence the regex missed would silently not run)."""
    found = blocks(PAGE.read_text())
    assert [(lang, title) for lang, title, _ in found if title] == [("python", "pagecount.py"),
                                                                   ("yaml", "pagecount.yaml")]
    runs = [body for lang, title, body in found if lang == "bash"]
    assert any("rao run --config pagecount.yaml" in b for b in runs)
    assert any("rao solve --env pagecount:PageCountEnv" in b for b in runs)
    assert sum(1 for lang, title, _ in found if lang == "python" and not title) == 1
    module = next(body for _, title, body in found if title == "pagecount.py")
    compile(module, "pagecount.py", "exec")  # the whole module, not cut at its inner fence
    assert "class PageCountExpert" in module


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(models_dir())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAO_S3", "AWS_", "MLFLOW_", "PREFECT_API"))}
    env.update(RAO_HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(REPO_ROOT))
    return env


@pytest.mark.slow
@pytest.mark.vllm
def test_the_tutorial_runs_as_written(tmp_path):
    if not (models_dir() / "smollm2-135m-instruct" / "config.json").exists():
        pytest.skip("SmolLM2-135M-Instruct missing (run `make setup`)")
    work = tmp_path / "work"
    work.mkdir()
    env = _env(tmp_path)
    for i, (lang, title, body) in enumerate(blocks(PAGE.read_text())):
        if title:
            (work / title).write_text(body)
            continue
        if lang == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", body]
        elif lang == "python":
            cmd = [sys.executable, "-c", body]
        else:
            continue
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
        assert p.returncode == 0, f"block {i} ({lang}) failed, exit {p.returncode}:\n{body}\n--- stdout\n" \
                                  f"{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
        if "rao solve" in body:  # the expert solves the 16-page book through two levels of sub-agents
            assert "success=1.0 end=finished depth=2 nodes=7" in p.stdout, p.stdout
        if "champion" in body:  # the warm start (version 1) or, if iteration 1 did better, its checkpoint
            assert re.search(r"champion: version [12] at s3://", p.stdout), p.stdout
            print(p.stdout)  # the success table per run: `pytest -rP tests/test_tutorial.py` shows it
    assert (work / "tasks.jsonl").exists()
