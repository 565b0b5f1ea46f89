"""The ``hf-rope-ext`` command: subcommands listed, ``list`` shows every type, ``--help`` and ``list`` start
without importing transformers (or, for ``--help``, torch), errors are one line with code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hf_rope_ext.cli import COMMANDS, main
from hf_rope_ext.types import registry

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(*args: str) -> set[str]:
    """Top-level packages a fresh ``python -X importtime -m hf_rope_ext ARGS`` imports (it must exit 0)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-X", "importtime", "-m", "hf_rope_ext", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    lines = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    return {name.split(".")[0] for name in lines}


def test_help_lists_the_subcommands_without_importing_torch_or_transformers():
    out = subprocess.run([sys.executable, "-m", "hf_rope_ext", "--help"], capture_output=True, text=True, check=True)
    for name in COMMANDS:
        assert name in out.stdout
    for args in (["--help"], ["finetune", "--help"], ["eval", "--help"]):
        assert not {"torch", "transformers", "peft", "datasets"} & imported_modules(*args), args
    assert "transformers" not in imported_modules("list", "--json")


def test_list_json_runs_without_importing_torch_or_transformers():
    """``list`` reads the method table, which the method modules declare without torch (attention/methods/)."""
    code = (
        "import json, sys, io, contextlib\n"
        "sys.argv = ['hf-rope-ext', 'list', '--json']  # as the console script starts\n"
        "from hf_rope_ext.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    assert main(sys.argv[1:]) == 0\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
        "print(json.dumps(sorted(row['rope_type'] for row in json.loads(out.getvalue()))))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    imported, names = out.stdout.splitlines()
    assert imported == "[]"
    assert set(json.loads(names)) >= set(registry.available_rope_types()) | {"linear", "yarn", "llama3"}
    assert not {"torch", "transformers"} & imported_modules("list", "--json")


def test_list_shows_every_type_with_parameters_and_level(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for name in registry.available_rope_types() + ["linear", "dynamic", "yarn", "longrope", "llama3"]:
        assert f"`{name}`" in text
    assert "frequency" in text and "`factor` (required)" in text and "`beta_fast` (32.0)" in text


def test_list_json_keeps_json_types(capsys):
    assert main(["list", "--json"]) == 0
    rows = {row["rope_type"]: row for row in json.loads(capsys.readouterr().out)}
    for method in registry.methods():
        row = rows[method.name]
        assert row["source"] == "hf_rope_ext" and row["level"] == method.kind and row["dynamic"] is method.dynamic
        params = registry.type_spec(method.name)[0]  # the method's keys, and L0 for every one
        assert set(row["parameters"]) == set(method.params) | {"original_max_position_embeddings"}
        for key, spec in params.items():
            required = spec.default is registry.REQUIRED
            default = spec.default.text if isinstance(spec.default, registry.FromLength) else spec.default
            assert row["parameters"][key] == {"default": None if required else default, "required": required}
    assert rows["ntk_by_parts"]["parameters"]["beta_fast"]["default"] == 32.0  # a number, not "32.0"
    assert rows["ntk_by_parts"]["parameters"]["truncate"]["default"] is True  # a boolean, not "True"
    assert rows["yarn"]["parameters"]["factor"] == {"default": None, "required": True}
    assert rows["string"]["parameters"]["window"] == {"default": "L0 // 3", "required": False}  # the authors' S
    assert rows["dynamic"]["dynamic"] is True and rows["linear"]["dynamic"] is False


def test_list_describes_every_type_by_its_method(capsys):
    """A summary names what the method does, not where this project's notes first described it ("seed 001")."""
    assert main(["list", "--json"]) == 0
    rows = {row["rope_type"]: row["summary"] for row in json.loads(capsys.readouterr().out)}
    assert not [name for name, summary in rows.items() if "seed" in summary.lower()], rows
    assert "NTK-aware" in rows["part_ntk"] and "theta_i/s" in rows["part_ntk"]


def test_unknown_subcommand_is_an_error(capsys):
    assert main(["frobnicate"]) == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
