"""README.md as a newcomer reads it from the top: short; the two set-up commands exactly as CI runs them (which call
``.venv/bin/...``), and before the first bare command it says how to enter the project's environment. (Its results
table and chart: ``test_results_pages.py``.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
RUN = "bash scripts/setup.sh && .venv/bin/hf-rope-ext extend"
TEST = "bash scripts/setup.sh && .venv/bin/python -m pytest -q"


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
