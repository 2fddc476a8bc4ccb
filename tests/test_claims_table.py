"""The claims table keeps the records' figures: every figure of README.md, of the site's "Experiments" page
and of each experiment's page (docs/experiments/*.md) that links a record under docs/results/ is recomputed
from that record. The README's claims table is short (claim | status | headline figure | details); the per-seed
figures are on the experiment pages, checked here the same way.

A figure is a Markdown link to its record whose title says where in the record the figure is::

    [18/50](docs/results/textcraft-tier1x.json "points[arm=recursive,iteration=2,difficulty=tier1x2].successes/n")

The title is a path of keys separated by dots. ``name[k=v,...]`` picks the one element of the list ``name``
whose fields equal those values (as text: ``iteration=2`` matches 2). A last key ``a/b`` is the pair of two
fields. A pair (or a stored ``[successes, n]`` list) is written ``a/b`` with integers; a number is written
with the decimals the writer chose and must equal the record's value rounded to them (0.327 -> "0.33"; a
comma separates thousands: 14173 -> "14,173").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGURE = re.compile(r'\[([^\]]+)\]\(([^)\s]+\.json) "([^"]+)"\)')
STEP = re.compile(r"^([A-Za-z_][\w]*)(?:\[([^\]]+)\])?$")
#: the pages whose record-linked figures are checked: the README, the site's claims page, each experiment's page
PAGES = ["README.md", "docs/experiments.md",
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs/experiments").glob("*.md"))]
CLAIMS = re.compile(r"<!-- claims:start -->\n(.*?)<!-- claims:end -->", re.S)


def select(record: Any, path: str) -> Any:
    """The value at ``path`` in ``record`` (grammar in the module docstring); KeyError when it is not there
    or a list filter does not match exactly one element."""
    *steps, last = path.split(".")
    value = record
    for step in [*steps, last] if "/" not in last else steps:
        m = STEP.match(step)
        if not m:
            raise KeyError(f"bad step {step!r} in {path!r}")
        value = value[m.group(1)]
        if m.group(2):
            want = dict(kv.split("=", 1) for kv in m.group(2).split(","))
            hits = [x for x in value if all(str(x.get(k)) == v for k, v in want.items())]
            if len(hits) != 1:
                raise KeyError(f"{step!r} matches {len(hits)} elements in {path!r}")
            value = hits[0]
    if "/" in last:
        a, b = last.split("/")
        return (value[a], value[b])
    return value


def render(value: Any, text: str | None) -> str:
    """``value`` written as ``text`` writes it (its decimals); None: the canonical form (two decimals)."""
    if isinstance(value, (list, tuple)):
        a, b = value
        if a != int(a) or b != int(b):
            raise ValueError(f"a pair of non-integers: {value}")
        return f"{int(a)}/{int(b)}"
    if text is None:
        return f"{value:.2f}"
    decimals = len(text.split(".", 1)[1]) if "." in text else 0
    return f"{value:,.{decimals}f}" if "," in text else f"{value:.{decimals}f}"  # "14,173": thousands separated


def figures(page: str) -> list[tuple[str, Path, str]]:
    """(text, record file, path) of every record-linked figure of ``page``."""
    text = (ROOT / page).read_text()
    base = (ROOT / page).parent
    return [(t, (base / target).resolve(), sel) for t, target, sel in FIGURE.findall(text)]


def test_select_and_render_by_hand():
    record = {"points": [{"arm": "recursive", "iteration": 0, "successes": 4.0, "n": 50, "child_success": 0.327},
                         {"arm": "recursive", "iteration": 2, "successes": 18.0, "n": 50, "child_success": 0.622},
                         {"arm": "single", "iteration": 2, "successes": 0.0, "n": 50, "child_success": None}],
              "test": {"baseline": [4.0, 50], "p_value": 0.000363}}
    # the one element with arm recursive and iteration 2 (the record stores the iteration as 2, the title as "2")
    assert render(select(record, "points[arm=recursive,iteration=2].successes/n"), "18/50") == "18/50"
    assert render(select(record, "test.baseline"), "4/50") == "4/50"  # a stored [successes, n] pair
    assert render(select(record, "points[arm=recursive,iteration=0].child_success"), "0.33") == "0.33"  # 0.327
    assert render(select(record, "test.p_value"), "0.0004") == "0.0004"  # 0.000363 to 4 decimals
    assert render(0.622, None) == "0.62"
    assert render(14173, "14,173") == "14,173" and render(14173, "14173") == "14173"
    with pytest.raises(KeyError, match="matches 2 elements"):
        select(record, "points[arm=recursive].successes/n")
    with pytest.raises(KeyError, match="matches 0 elements"):
        select(record, "points[arm=outcome].successes/n")
    with pytest.raises(KeyError):
        select(record, "points[arm=single,iteration=2].tokens")


def test_the_pages_carry_their_figures():
    assert len(figures("README.md")) >= 10, "the README's claims table links fewer than 10 figures"
    assert len(figures("docs/experiments.md")) >= 10, "the site's claims table links fewer than 10 figures"
    per_experiment = sum(len(figures(p)) for p in PAGES[2:])
    assert per_experiment >= 50, f"the experiment pages link {per_experiment} figures; were the per-seed figures lost?"


@pytest.mark.parametrize("page", PAGES)
def test_every_linked_figure_equals_its_record(page):
    found = figures(page)
    wrong = []
    for text, record_file, path in found:
        assert record_file.parent == ROOT / "docs/results", f"{page}: {record_file} is not a record of docs/results/"
        record = json.loads(record_file.read_text())
        got = render(select(record, path), text)
        if got != text:
            wrong.append(f"{record_file.name} {path}: written {text}, the record says {got}")
    assert not wrong, f"{page}: figures differ from their records:\n" + "\n".join(wrong)


def claims_rows(page: str) -> list[str]:
    m = CLAIMS.search((ROOT / page).read_text())
    assert m, f"{page} has no claims table (<!-- claims:start --> ... <!-- claims:end -->)"
    return m.group(1).strip().splitlines()


def test_the_claims_table_has_the_papers_four_claims_each_with_a_status():
    rows = claims_rows("README.md")
    head, rule, *claims = rows
    assert head.startswith("| the paper's claim | status here | headline figure") and set(rule) <= set("|-")
    assert len(claims) == 4, "one row per claim of the paper"
    for row in claims:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4, row
        assert re.match(r"\*\*[^*]+\*\*", cells[1]), f"the status cell opens with its verdict in bold: {row[:80]}"
        if cells[2] != "none yet":
            assert FIGURE.search(cells[2]), f"the figure cell links its record: {row[:80]}"
        assert "](docs/experiments/" in cells[3], f"the details cell links the experiment's page: {row[:80]}"


def test_the_sites_claims_table_is_the_readmes():
    readme = [r.replace("](docs/", "](") for r in claims_rows("README.md")]
    assert claims_rows("docs/experiments.md") == readme, "edit both tables (docs/experiments.md links results/...)"
