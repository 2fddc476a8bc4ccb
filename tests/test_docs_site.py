"""The documentation site builds offline in strict mode: a broken link, a bad anchor, a page left out
of the nav, a missing snippet or a docstring griffe cannot parse fails the build, so it fails this test.
The API reference renders the docstrings' reST roles as links (docs/_ext/rst_roles.py), and the manual stays a
manual: no page over 25,000 bytes, no heading with a date or an issue number (the dated notebook excepted).

The build is the one ``make docs`` runs (``mkdocs build --strict``, config ``mkdocs.yml``), into a temporary
folder. The API reference is read by static analysis (griffe), so nothing is imported and no service starts.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The packages the build needs, all in requirements/main.lock.
NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "pymdownx")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    missing = [m for m in NEEDED if importlib.util.find_spec(m.split(".")[0]) is None
               or importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run make setup")
    out = tmp_path_factory.mktemp("site") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    warnings = [ln for ln in r.stderr.splitlines() if "WARNING" in ln or "ERROR" in ln or "Abort" in ln]
    assert r.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings or r.stderr.splitlines()[-20:])
    return out


def test_make_docs_runs_the_strict_build():
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"\ndocs: setup\n\t.*mkdocs build --strict --site-dir site\n", make)
    assert "site/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_site_builds_in_strict_mode(site):
    """The strict build succeeded (the fixture) and wrote the front pages. Its time is not asserted: a wall-clock
    bound fails on a loaded machine without a defect; `make docs` prints it, and it took 40-63 s here."""
    out = site
    assert (out / "index.html").exists() and (out / "getting-started.html").exists()


def test_every_page_of_docs_is_built(site):
    out = site
    pages = sorted(p.relative_to(ROOT / "docs").with_suffix(".html") for p in (ROOT / "docs").rglob("*.md"))
    assert len(pages) >= 20
    assert not [str(p) for p in pages if not (out / p).exists()]


def test_the_api_reference_has_the_docstrings_of_the_four_packages(site):
    out = site
    ref = out / "reference"
    # one function or module of each page, by its anchor (its dotted path)
    for page, anchor in [("rao_core", "rao_core.rewards.local_node_reward"), ("rao_core", "rao_core.advantages.depth_weights"),
                         ("runtime", "rao_core.runtime.agent"), ("train", "rao_core.train.loss"),
                         ("judge", "rao_core.judge.stage"), ("policies", "rao_core.policies.textcraft_expert"),
                         ("envs", "rao_core.envs.textcraft.env"), ("tasks", "tasks.stages"),
                         ("flows", "flows.campaign"), ("infra", "infra.serving")]:
        assert f'id="{anchor}"' in (ref / f"{page}.html").read_text(), f"{anchor} is not on reference/{page}.html"
    # the sub-packages have their own pages, not a second copy on rao_core's
    assert 'id="rao_core.runtime' not in (ref / "rao_core.html").read_text()


def test_the_getting_started_page_includes_the_readmes_services_table(site):
    out = site
    html = (out / "getting-started.html").read_text()
    assert "RAO_POLICY_BASE_URL" in html and "--8&lt;--" not in html and "--8<--" not in html


#: the dated notebook (its headings carry dates by design) and the generated file map: not manual pages
NOT_MANUAL = {"results.md", "files.md"}
NOTEBOOK_DIR = "notebook"
MANUAL_PAGE_MAX_BYTES = 25_000
RAW_ROLE = re.compile(r":(?:py:)?(?:func|class|data|meth|attr|mod|exc|obj):(?:<code>|`)")
DATED_HEADING = re.compile(r"\d{4}-\d{2}-\d{2}|\bissue\s+#?\d+", re.I)


def manual_pages() -> list[Path]:
    docs = ROOT / "docs"
    return [p for p in sorted(docs.rglob("*.md")) if str(p.relative_to(docs)) not in NOT_MANUAL
            and p.relative_to(docs).parts[0] != NOTEBOOK_DIR and "_ext" not in p.relative_to(docs).parts]


def headings(text: str) -> list[str]:
    """The Markdown headings of ``text`` (ATX, outside fenced code)."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and re.match(r"^#{1,6} ", line):
            out.append(line)
    return out


def test_the_api_reference_renders_no_raw_rest_role(site):
    """Docstrings write :func:`x`; the griffe extension makes each a link (or inline code where the target is
    not on the site), so no role reaches the HTML."""
    pages = sorted((site / "reference").glob("*.html"))
    assert len(pages) >= 9
    raw = {p.name: len(RAW_ROLE.findall(p.read_text())) for p in pages}
    assert not {k: v for k, v in raw.items() if v}, f"raw reST roles in the built reference: {raw}"
    links = sum(p.read_text().count('class="autorefs autorefs-internal"') for p in pages)
    assert links >= 100, f"only {links} cross-references in the reference: is docs/_ext/rst_roles.py loaded?"


def test_no_manual_page_passes_25_kb():
    pages = manual_pages()
    assert len(pages) >= 30
    big = {str(p.relative_to(ROOT)): p.stat().st_size for p in pages if p.stat().st_size > MANUAL_PAGE_MAX_BYTES}
    assert not big, f"manual pages over {MANUAL_PAGE_MAX_BYTES} bytes (split them by topic): {big}"


def test_no_manual_heading_carries_a_date_or_an_issue_number():
    bad = [f"{p.relative_to(ROOT)}: {h}" for p in manual_pages() for h in headings(p.read_text())
           if DATED_HEADING.search(h)]
    assert not bad, "dated headings belong in the notebook (docs/results.md, docs/notebook/):\n" + "\n".join(bad)
