"""Ordinary use prints no warning the user can do nothing about: fine-tuning with gradient checkpointing and a
merge (peft reads transformers' deprecated is_gradient_checkpointing; 5.24 deprecates gradient_checkpointing_enable),
evaluation past the trained length (generate's "friendly reminder"), an adapter evaluated unmerged, extend, export,
convert-layout and push. Run as a user runs the command: a process of its own, Python's default warning filters
(DeprecationWarning shown too), stderr to a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import save_byte_llama

ROOT = Path(__file__).resolve().parents[1]
RUN_ALL = """
import json, sys
from hf_rope_ext.cli import main
for argv in json.loads(sys.argv[1]):
    assert main(argv) == 0, argv
"""


def test_ordinary_use_prints_no_warnings(docs_dir, tmp_path):
    base = save_byte_llama(tmp_path / "base", 64)
    run, ext = tmp_path / "run", tmp_path / "ext"
    passkey = ["--lengths", "256", "--passkey-depths", "1", "--documents", "1", "--last-chunk", "0"]
    commands = [
        ["finetune", "--model", str(base), "--data", str(docs_dir), "--out", str(run), "--rope-type", "yarn"]
        + ["--length", "128", "--max-steps", "1", "--grad-checkpointing", "--merge"],
        ["eval", "--model", str(base), *passkey],  # generates past max_position_embeddings (64)
        ["eval", "--adapter", str(run), *passkey],
        ["extend", "--model", str(base), "--rope-type", "ntk_by_parts", "--factor", "2", "--out", str(ext)]
        + ["--data", str(docs_dir), "--documents", "1", "--passkey-depths", "0", "--last-chunk", "16"],
        ["export", str(ext), str(tmp_path / "portable")],
        ["convert-layout", str(ext), str(tmp_path / "interleaved"), "--to", "interleaved"],
        ["push", str(tmp_path / "portable"), "--repo-id", "me/x", "--dry-run", str(tmp_path / "dry")],
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        done = subprocess.run([sys.executable, "-c", RUN_ALL, json.dumps(commands)], stderr=stderr, env=env)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "Warning" not in text and "friendly reminder" not in text and "deprecated" not in text, text
