"""experiments/multikey_at.py: one line per run, with the probe's figures, the rope parameters asked for and the command
that gives them again."""

import json
import shlex

import pytest
from conftest import load_script, save_eval_llama

from hf_rope_ext.eval.loading import load_config, load_model, load_tokenizer, requested_parameters
from hf_rope_ext.eval.multikey import multikey_accuracy


@pytest.fixture(scope="module")
def script():
    return load_script("multikey_at")


def test_a_run_appends_its_probe_and_command(script, tmp_path, monkeypatch):
    read_by = []  # the rope parameters of each model probed (a tiny random model answers alike under any of them)
    monkeypatch.setattr(
        script, "multikey_accuracy", lambda m, *a: read_by.append(m.config.rope_parameters) or multikey_accuracy(m, *a)
    )
    folder = save_eval_llama(tmp_path / "tiny", seed=3)
    out = tmp_path / "probes.jsonl"
    argv = ["--model", str(folder), "--length", "640", "--prompts", "1", "--rope-type", "string"]
    argv += ["--rope-param", "window=48", "--rope-param", "local_window=4", "--out", str(out)]
    script.main(argv)
    script.main([*argv[:4], "--prompts", "1", "--out", str(out)])  # the model as saved
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first["rope_parameters"]["window"] == 48 and first["length"] == 640 and second["rope_parameters"] is None
    assert shlex.split(first["command"])[2:] == argv
    assert read_by[0]["rope_type"] == "string" and read_by[0]["window"] == 48 and read_by[1]["rope_type"] == "default"
    params = requested_parameters(load_config(folder), "string", None, {"window": 48, "local_window": 4})
    expected = multikey_accuracy(load_model(folder, params), load_tokenizer(folder), 640, 1, progress=False)
    assert first["multikey_misses"] == expected["multikey_misses"]
    assert first["multikey_accuracy"] == expected["multikey_accuracy"]
