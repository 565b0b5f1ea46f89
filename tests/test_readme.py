"""README.md as a newcomer reads it from the top: after the two set-up commands (which call ``.venv/bin/...``), every
command it shows runs in the project's environment, so it says how to enter it before the first bare command."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def test_the_environment_is_entered_before_the_first_bare_command():
    text = README.read_text(encoding="utf-8")
    bare = [m for m in BASH.finditer(text) if re.search(r"^(hf-rope-ext|python|accelerate) ", m.group(1), re.M)]
    assert bare, "README shows no command"
    activation = text.find("source .venv/bin/activate")
    assert 0 <= activation < bare[0].start(), "activate .venv (or call .venv/bin/...) before the first bare command"
    assert ".venv/bin/hf-rope-ext" in text[:activation]  # the set-up commands themselves need no activation
