"""The Markdown a reader meets (README.md, CHANGELOG.md, docs/, the model cards): every relative link resolves, no
page speaks of how the work was done, and the tables generated from the package are in sync with it.

A link is ``[text](target)``, ``![alt](target)``, a reference ``[name]: target`` or an HTML ``src=``/``href=``,
outside code; web addresses, in-page anchors and Jinja placeholders (``{{ plot }}`` in a card template) are not
files. An anchor after a file (``page.md#section``) is not checked, only the file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hf_rope_ext.cli.list_types import markdown, rows
from hf_rope_ext.eval.intervals import wilson

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
CARDS = [
    *sorted(ROOT.glob("examples/*/README.md")),
    *sorted((ROOT / "hf_rope_ext").rglob("*.md")),
]
PAGES = {str(p.relative_to(ROOT)): p for p in DOCS + CARDS}
CODE = re.compile(r"^(```|~~~).*?^\1[^\n]*$|`[^`\n]*`", re.S | re.M)
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
HTML = re.compile(r"\b(?:src|href)=\"([^\"]+)\"")
NOT_A_FILE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#)|\{\{|\{%", re.I)
# how the work was done, not what the project is: leases of machines, sessions, issue numbers, the CPU the
# measurements shared with other jobs ("release" does not match)
PROCESS_WORDS = [
    r"\blease[sd]?\b",
    r"\bsessions?\b",
    r"\bissues? #?\d",
    r"\bthis 2-core\b",
    r"\b2-core cpu\b",
    r"\bthis cpu\b",
    r"\bbeside (?:test suites|the test suites|other jobs|another job|two|one or two|a real-model)\b",
    r"\bone thread beside\b",
    r"\bshared with other (?:jobs|work)\b",
    r"\blent machine\b",
    r"\bthis branch\b",
]


def links(text: str) -> list[str]:
    prose = CODE.sub("", text)
    found = LINK.findall(prose) + REFERENCE.findall(prose) + HTML.findall(prose)
    return [target for target in found if not NOT_A_FILE.search(target)]


def test_the_pages_are_found():
    assert ROOT / "docs" / "README.md" in DOCS and len(DOCS) >= 15
    assert CARDS, "no model card found"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_relative_link_resolves(page):
    path = PAGES[page]
    broken = [t for t in links(path.read_text(encoding="utf-8")) if not (path.parent / t.split("#")[0]).exists()]
    assert broken == [], f"{page}: links to missing files: {broken}"


def test_the_link_reader_finds_what_it_looks_for(tmp_path):
    text = (
        'See [a](docs/a.md#x), ![c](c.png "t") and <img src="d.png">, not [w](https://x.y) or [h](#top).\n'
        "[ref]: e.md\n`[no](inline.md)`\n```\n[no](block.md)\n```\n![p]({{ plot }})\n"
    )
    assert links(text) == ["docs/a.md#x", "c.png", "e.md", "d.png"]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_no_page_speaks_of_how_the_work_was_done(page):
    text = PAGES[page].read_text(encoding="utf-8").lower()
    found = [m.group(0) for pattern in PROCESS_WORDS for m in re.finditer(pattern, text)]
    assert found == [], f"{page}: {found}"


def test_the_process_words_spare_the_project_words():
    words = " ".join(["the release", "a known issue", "leased", "issue 12", "this CPU"]).lower()
    found = [m.group(0) for pattern in PROCESS_WORDS for m in re.finditer(pattern, words)]
    assert found == ["leased", "issue 1", "this cpu"]


def generated_block(text: str, name: str) -> str:
    """The text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``."""
    match = re.search(rf"<!-- {name}:start[^>]*-->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    assert match, f"no {name} block"
    return match.group(1)


def test_the_methods_table_is_the_registry():
    """docs/methods.md's table is ``hf-rope-ext list``'s (``python scripts/docs_tables.py`` rewrites it)."""
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    assert generated_block(text, "types") == markdown(rows())


COUNT = re.compile(r"(\d+)/(\d+)(?: \[(\d\.\d\d), (\d\.\d\d)\])?")
COUNTS_ONLY = re.compile(r"^\s*\**\d+/\d+(?: \[[\d., ]+\])?\**(?:\s*/\s*\**\d+/\d+(?: \[[\d., ]+\])?\**)*\s*$")
RESULT_PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs" / "results").glob("*.md")),
    *ROOT.glob("examples/*/README.md"),
]


def counts_in_tables(text: str) -> list[re.Match]:
    """The hits/n counts of every table cell that holds counts alone (a cell "5/5 [0.57, 1.00] / 4/5 [...]" too); a
    count marked "(by prompt)" carries a cluster bootstrap interval, checked against its records by
    tests/test_headline.py, not here."""
    cells = [c for line in text.splitlines() if line.startswith("|") for c in line.split("|")]
    return [m for cell in cells if COUNTS_ONLY.match(cell) for m in COUNT.finditer(cell)]


@pytest.mark.parametrize("page", RESULT_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_count_in_a_results_table_shows_its_wilson_interval(page):
    for m in counts_in_tables(page.read_text(encoding="utf-8")):
        hits, n = int(m.group(1)), int(m.group(2))
        assert m.group(3) is not None, f"{page.name}: {m.group(0)} has no interval"
        assert (m.group(3), m.group(4)) == tuple(f"{x:.2f}" for x in wilson(hits, n)), (page.name, m.group(0))


def test_the_count_reader_finds_bare_and_wrong_counts():
    found = counts_in_tables("| a 1/5 slope | 3/5 | 5/5 [0.57, 1.00] / 0/5 |\n")
    assert [(m.group(0), m.group(3)) for m in found] == [("3/5", None), ("5/5 [0.57, 1.00]", "0.57"), ("0/5", None)]
