"""The ``hf-rope-ext`` command: subcommands listed, ``list`` shows every type, errors are one line with code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hf_rope_ext import registry
from hf_rope_ext.cli import COMMANDS, main


def test_help_lists_the_subcommands():
    out = subprocess.run([sys.executable, "-m", "hf_rope_ext", "--help"], capture_output=True, text=True, check=True)
    for name in COMMANDS:
        assert name in out.stdout
    assert {"list"} <= set(COMMANDS)


def test_list_shows_every_type_with_parameters_and_level(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for name in registry.available_rope_types() + ["linear", "dynamic", "yarn", "longrope", "llama3"]:
        assert f"`{name}`" in text
    assert "frequency" in text and "`factor` (required)" in text and "`beta_fast` (32.0)" in text


def test_list_json_matches_the_registry(capsys):
    assert main(["list", "--json"]) == 0
    rows = {row["rope_type"]: row for row in json.loads(capsys.readouterr().out)}
    for method in registry.methods():
        row = rows[method.name]
        assert row["source"] == "hf_rope_ext" and row["level"].startswith(method.kind)
        assert set(row["parameters"]) == set(method.params)


def test_unknown_subcommand_is_an_error():
    with pytest.raises(SystemExit) as excinfo:
        main(["frobnicate"])
    assert excinfo.value.code == 2
