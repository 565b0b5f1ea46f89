"""README.md as a newcomer reads it from the top: short; the two set-up commands exactly as CI runs them (which call
``.venv/bin/...``), and before the first bare command it says how to enter the project's environment; its results
table is the committed records' (``experiments/results_at_a_glance.py``), and so is its chart."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
RUN = "bash scripts/setup.sh && .venv/bin/hf-rope-ext extend"
TEST = "bash scripts/setup.sh && .venv/bin/python -m pytest -q"
spec = importlib.util.spec_from_file_location("glance", ROOT / "experiments" / "results_at_a_glance.py")
glance = importlib.util.module_from_spec(spec)
spec.loader.exec_module(glance)


def test_the_readme_reads_in_five_minutes():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_the_two_commands_are_those_ci_and_the_set_up_script_run():
    text = README.read_text(encoding="utf-8")
    commands = [line.strip() for block in BASH.findall(text) for line in block.splitlines()]
    assert RUN in commands and TEST in commands
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/setup.sh" in ci and ".venv/bin/python -m pytest -q" in ci  # CI runs README's test command
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert ".venv" in setup and "install" in setup  # the environment both commands call into


def test_the_environment_is_entered_before_the_first_bare_command():
    text = README.read_text(encoding="utf-8")
    bare = [m for m in BASH.finditer(text) if re.search(r"^(hf-rope-ext|python|accelerate) ", m.group(1), re.M)]
    assert bare, "README shows no command"
    activation = text.find("source .venv/bin/activate")
    assert 0 <= activation < bare[0].start(), "activate .venv (or call .venv/bin/...) before the first bare command"
    assert ".venv/bin/hf-rope-ext" in text[:activation]  # the set-up commands themselves need no activation


def test_the_results_table_is_the_records_and_labelled_dev():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- results:start -->\n(.*?)\n<!-- results:end -->", text, re.S)
    assert block, "README has no <!-- results:start --> ... <!-- results:end --> table"
    records = glance.json.loads(glance.RECORDS.read_text(encoding="utf-8"))
    assert block.group(1) == glance.table(records)  # `python experiments/results_at_a_glance.py` prints it
    assert "dev split" in block.group(1)


def test_the_chart_script_runs_on_the_records(tmp_path, capsys):
    assert glance.main(["--chart", str(tmp_path / "chart.png")]) == 0
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "10/10 [0.72, 1.00]" in capsys.readouterr().out
    assert (ROOT / "docs/results/real-model/at-4x.png").is_file()  # the committed chart README shows


def test_the_interval_is_wilsons():
    """Against values worked by hand: 10/10 -> [0.722, 1], 9/12 -> [0.468, 0.911], 0/5 -> [0, 0.434]."""
    for (hits, n), (low, high) in {(10, 10): (0.7225, 1.0), (9, 12): (0.4677, 0.9111), (0, 5): (0.0, 0.4345)}.items():
        got = glance.wilson(hits, n)
        assert abs(got[0] - low) < 1e-3 and abs(got[1] - high) < 1e-3, (hits, n, got)
