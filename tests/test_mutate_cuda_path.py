"""scripts/mutate_cuda_path.py keeps working as the code moves on: each of its faults still names a fragment that
occurs exactly once in its module, and one fault applied to a copy is caught by the test meant to catch it."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "mutate_cuda_path.py"


def load_script():
    spec = importlib.util.spec_from_file_location("mutate_cuda_path", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("number", range(1, len(load_script().MUTATIONS) + 1))
def test_every_fault_names_one_place_in_the_code(number):
    what, module, fragment, replacement = load_script().MUTATIONS[number - 1]
    text = (ROOT / module).read_text(encoding="utf-8")
    assert text.count(fragment) == 1, what
    assert fragment != replacement and text.replace(fragment, replacement) != text


def test_a_fault_applied_to_a_copy_is_caught():
    tests = "tests/test_attention_engines.py::test_flex_block_masks_equal_the_dense_meaning[1-1-blocks]"
    command = [sys.executable, str(SCRIPT), "--only", "1", "--tests", tests]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1. partly and fully listed blocks swapped: caught by tests/test_attention_engines.py::" in out.stdout
    assert "1 of 1 mutations caught" in out.stdout
