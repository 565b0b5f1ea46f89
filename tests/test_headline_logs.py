"""Every count of the 4x headline and its controls, re-scored here from the JSON-lines logs with a scorer of this
test's own (not ``probes.is_hit``), against results.json, the controls page and every page with the headline table
(README, the results page, the adapter's card). The prompts a cell counts are the committed list
(docs/results/real-model/test-prompts.json): a logged line counts only for its prompt's id and tokens' hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "real-model"
PAGES = [
    ROOT / "README.md",
    RESULTS.parent / "real-model.md",
    ROOT / "examples/smollm2-self-extend-retrieval-lora/README.md",
]


def found(key: int, answer: str) -> bool:
    """The answer, after leading spaces, opens with the key's digits and no further digit."""
    text = answer.lstrip(" \t\n")
    digits = len(text) - len(text.lstrip("0123456789"))
    return digits > 0 and text[:digits] == str(key)


def rescored(log: str, listed: list[list[str]]) -> tuple[int, int, int]:
    """(hits, keys, prompts) of the listed prompts' lines in ``log``."""
    wanted = {tuple(x) for x in listed}
    text = (RESULTS / log).read_text() if (RESULTS / log).is_file() else ""  # a cell not run yet
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    kept = {x["prompt_id"]: x for x in lines if (x["prompt_id"], x["prompt_sha"]) in wanted}
    answers = [(key, answer) for x in kept.values() for _, key, answer, _ in x["probes"]]
    return sum(found(k, a) for k, a in answers), len(answers), len(kept)


@pytest.fixture(scope="module")
def controls():
    return load_script("headline_controls")


def cells(controls):
    listed = json.loads((RESULTS / "test-prompts.json").read_text())
    for name, cell in controls.CELLS.items():
        for probe in controls.SAMPLES:
            yield name, probe, cell, listed[name][probe]


def test_every_cell_of_results_json_is_what_its_log_holds(controls):
    done = json.loads((RESULTS / "results.json").read_text())
    for name, probe, cell, listed in cells(controls):
        assert len(listed) == cell.samples(probe)
        hits, keys, prompts = rescored(cell.log, listed)
        record = done[controls.record_key(name, probe)][0]
        assert (record["hits"], record["n"], record["prompts"]) == (hits, keys, prompts), (name, probe)


def test_the_controls_page_and_the_headline_pages_show_those_counts(controls):
    page = (RESULTS / "controls.md").read_text()
    tables = [p.read_text().split("<!-- results:start -->")[1].split("<!-- results:end -->")[0] for p in PAGES]
    for name, probe, cell, listed in cells(controls):
        hits, keys, _ = rescored(cell.log, listed)
        if not keys:
            continue
        chat = "chat" if cell.chat else "plain"
        row = f"| {cell.configuration} | {cell.length} | {chat} | {probe} | {hits}/{keys} "
        assert row in page, row
        if name in ("se-32768", "se-lora-32768"):
            for table in tables:
                assert f"| {hits}/{keys} [" in table, (name, probe)


def test_the_listed_prompts_keep_the_first_prompts_ids_and_tokens(controls):
    """The 4x multikey list extends the 8 prompts measured first: the same ids and hashes as their logged lines."""
    listed = json.loads((RESULTS / "test-prompts.json").read_text())
    for name in ("se-32768", "se-lora-32768"):
        first = [json.loads(x) for x in (RESULTS / controls.CELLS[name].log).read_text().splitlines()][:8]
        logged = {(x["prompt_id"], x["prompt_sha"]) for x in first if "/k3/" in x["prompt_id"]}
        assert logged and logged <= {tuple(x) for x in listed[name]["multikey"][:8]}
        assert [x[0] for x in listed[name]["multikey"]] == [f"test/k3/32768/{p}" for p in range(24)]
