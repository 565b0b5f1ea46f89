"""The dev-split figures of docs/results/real-model.md are the committed records': their tables are what
``experiments/results_at_a_glance.py`` makes of ``docs/results/real-model/results.json``, the chart script runs on
those records, and the interval is Wilson's."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("glance", ROOT / "experiments" / "results_at_a_glance.py")
glance = importlib.util.module_from_spec(spec)
spec.loader.exec_module(glance)
RECORDS = json.loads(glance.RECORDS.read_text(encoding="utf-8"))


def block(path: Path, name: str) -> str:
    """The text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` of the page."""
    found = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", path.read_text(encoding="utf-8"), re.S)
    assert found, f"{path.name} has no <!-- {name}:start --> ... <!-- {name}:end --> table"
    return found.group(1)


def test_the_results_page_glance_is_the_records_and_labelled_dev():
    table = block(ROOT / "docs" / "results" / "real-model.md", "real-model-glance")
    assert table == glance.table(RECORDS)  # `python experiments/results_at_a_glance.py --write` puts it there
    assert "dev split" in table


@pytest.mark.parametrize("factor", [4, 2])
def test_the_results_page_tables_are_the_records(factor):
    table = block(ROOT / "docs" / "results" / "real-model.md", f"real-model-{factor}x")
    assert table == glance.full_table(RECORDS, factor)
    assert "dev split" in table and table.count("\n") >= 10


def test_the_chart_script_runs_on_the_records(tmp_path, capsys):
    assert glance.main(["--chart", str(tmp_path / "chart.png")]) == 0
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "10/10 [0.72, 1.00]" in capsys.readouterr().out
    assert (ROOT / "docs/results/real-model/at-4x.png").is_file()  # the committed chart the page shows


def test_the_interval_is_wilsons():
    """Against values worked by hand: 10/10 -> [0.722, 1], 9/12 -> [0.468, 0.911], 0/5 -> [0, 0.434]."""
    for (hits, n), (low, high) in {(10, 10): (0.7225, 1.0), (9, 12): (0.4677, 0.9111), (0, 5): (0.0, 0.4345)}.items():
        got = glance.wilson(hits, n)
        assert abs(got[0] - low) < 1e-3 and abs(got[1] - high) < 1e-3, (hits, n, got)


def test_the_ruler_controls_table_is_the_records():
    """docs/results/ruler.md's controls: each cell the count of its record in ruler/controls.json (written by
    ``experiments/ruler_controls.py``), samples answered out of 10, with and without the chat template."""
    from hf_rope_ext.eval.intervals import shown

    records = json.loads((ROOT / "docs/results/ruler/controls.json").read_text())["records"]
    page = (ROOT / "docs/results/ruler.md").read_text()
    for template, label in ((False, "plain text"), (True, "chat template")):
        mine = {(r["task"], r["length"]): r for r in records if r["chat_template"] is template}
        cells = [mine[task, n] for task in ("niah_single_1", "niah_multikey_2") for n in (4096, 8192)]
        assert all(r["n"] == 10 for r in cells)
        assert f"| {label} | " + " | ".join(shown(r) for r in cells) + " |" in page


def test_the_static_rows_tables_are_the_records():
    """docs/results/compiled-decode-cpu.md's static rows tables are what ``benchmarks/static_rows_report.py --write``
    makes of the committed records, a row for every type of the registry's attention level and both plain steps (after
    both prompt lengths in the prompt-once and after tables)."""
    from hf_rope_ext.types import registry

    path = ROOT / "benchmarks" / "static_rows_report.py"
    spec = importlib.util.spec_from_file_location("static_rows_report", path)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    page = ROOT / "docs" / "results" / "compiled-decode-cpu.md"
    attention = {m.name for m in registry.methods() if m.kind == "attention"}
    for name, text in report.tables().items():
        assert block(page, name) == text
    for name in ("static-rows-module", "static-rows-generate"):
        rows = {line.split(" | ")[0][2:] for line in report.tables()[name].splitlines()[2:]}
        assert rows == attention | {"default", "default_gqa"}
    for table in ("prompt-once", "after"):  # every type after both prompts, with both plain steps
        cells = [line.split(" | ")[:2] for line in report.tables()[table].splitlines()[2:]]
        for tokens in ("8192", "32768"):
            assert {name for length, name in cells if length == f"| {tokens}"} == attention | {"default", "default_gqa"}
