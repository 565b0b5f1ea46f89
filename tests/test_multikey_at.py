"""scripts/multikey_at.py: one line per run, with the probe's figures, the rope parameters asked for and the command
that gives them again."""

import importlib.util
import json
import shlex
from pathlib import Path

import pytest
from conftest import save_eval_llama

from hf_rope_ext.eval.loading import load_config, load_model, load_tokenizer, requested_parameters
from hf_rope_ext.eval.multikey import multikey_accuracy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("multikey_at", ROOT / "scripts" / "multikey_at.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_appends_its_probe_and_command(script, tmp_path):
    folder = save_eval_llama(tmp_path / "tiny", seed=3)
    out = tmp_path / "probes.jsonl"
    argv = ["--model", str(folder), "--length", "640", "--prompts", "1", "--rope-type", "string"]
    argv += ["--rope-param", "window=48", "--rope-param", "local_window=4", "--out", str(out)]
    script.main(argv)
    script.main([*argv[:4], "--prompts", "1", "--out", str(out)])  # the model as saved
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first["rope_parameters"]["window"] == 48 and first["length"] == 640 and second["rope_parameters"] is None
    assert shlex.split(first["command"])[2:] == argv
    params = requested_parameters(load_config(folder), "string", None, {"window": 48, "local_window": 4})
    expected = multikey_accuracy(load_model(folder, params), load_tokenizer(folder), 640, 1, progress=False)
    assert first["multikey_misses"] == expected["multikey_misses"]
    assert first["multikey_accuracy"] == expected["multikey_accuracy"]
