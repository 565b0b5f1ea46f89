"""Bad input to the command, as a user types it: one line on stderr naming the flag, the value and what is allowed,
exit status 2, the same check (and wording) in every subcommand, no Python names, no traceback, no network for a
path. Argument checks run before torch is imported, so those subprocesses are cheap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from hf_rope_ext.cli import main
from hf_rope_ext.store.bundled import default_model_path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
FINETUNE = ["finetune", "--out", "never", "--rope-type", "yarn", "--length", "1024"]
FACTOR = "argument --factor: expected a scaling factor >= 1, got '0.5'"
DOCUMENTS = "argument --documents: expected an integer >= 1, got '{}'"

# argv -> the error line's message (after "hf-rope-ext CMD: error: ")
ARGUMENT_ERRORS = {
    ("eval", "--factor", "0.5", "--rope-type", "linear"): FACTOR,
    ("extend", "--factor", "0.5", "--rope-type", "linear"): FACTOR,
    (*FINETUNE, "--factor", "0.5", "--max-steps", "1"): FACTOR,
    ("extend", "--factors", "2,0.5"): "argument --factors: expected a scaling factor >= 1, got '0.5' in the "
    "comma-separated list '2,0.5'",
    ("eval", "--documents", "-1"): DOCUMENTS.format(-1),
    ("eval", "--documents", "0"): DOCUMENTS.format(0),
    ("extend", "--documents", "0"): DOCUMENTS.format(0),
    ("eval", "--passkey-depths", "-2"): "argument --passkey-depths: expected an integer >= 0, got '-2'",
    ("eval", "--lengths", "64,abc"): "argument --lengths: expected a length in tokens, an integer >= 2, got 'abc' in "
    "the comma-separated list '64,abc'",
    (*FINETUNE, "--max-steps", "-3"): "argument --max-steps: expected an integer >= 1, got '-3'",
    (*FINETUNE, "--max-steps", "1", "--eval-rows", "0"): "argument --eval-rows: expected an integer >= 1, got '0'",
    (*FINETUNE, "--max-steps", "1", "--lr", "0"): "argument --lr: expected a number > 0, got '0'",
    (*FINETUNE, "--max-steps", "1", "--rope-param", "beta"): "argument --rope-param: expected KEY=VALUE, got 'beta'",
    ("eval", "--rope-param", "beta"): "argument --rope-param: expected KEY=VALUE, got 'beta'",
}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_rope_ext", *args], capture_output=True, text=True, env=ENV)


def error_line(err: str) -> str:
    """The last stderr line, which must be the only one besides argparse's usage and carry no traceback."""
    assert "Traceback" not in err and "=True" not in err and "overwrite-card" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv", list(ARGUMENT_ERRORS), ids=lambda argv: " ".join(argv))
def test_argument_checks_agree_across_subcommands(argv):
    out = cli(*argv)
    assert out.returncode == 2
    assert error_line(out.stderr) == f"hf-rope-ext {argv[0]}: error: {ARGUMENT_ERRORS[argv]}"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny GPT-2 (learned absolute positions, no RoPE) with a tokenizer."""
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=384, n_positions=64, bos_token_id=1, eos_token_id=1)
    GPT2LMHeadModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return folder


NO_ROPE = "is a 'gpt2' model, which has no rotary position embedding (rope_parameters) that hf-rope-ext can extend"


def test_a_model_without_rope_is_refused_in_one_line(gpt2, tmp_path, capsys):
    out = cli("eval", "--model", str(gpt2), "--rope-type", "yarn", "--factor", "2")  # was: TypeError traceback
    assert out.returncode == 2 and NO_ROPE in error_line(out.stderr)
    argv = ["extend", "--model", str(gpt2), "--factors", "2", "--report-dir", str(tmp_path / "r"), "--no-progress"]
    assert main(argv) == 2  # was: IndexError traceback
    assert NO_ROPE in error_line(capsys.readouterr().err) and not (tmp_path / "r").exists()
    assert main([*FINETUNE, "--model", str(gpt2), "--max-steps", "1"]) == 2
    assert NO_ROPE in error_line(capsys.readouterr().err)


def test_finetune_model_paths_fail_like_eval_and_never_ask_the_hub_for_a_path(tmp_path, capsys, monkeypatch):
    out = cli(*FINETUNE, "--model", "no-such-dir", "--max-steps", "1")  # a repo id: offline, the cache only
    assert out.returncode == 2
    assert error_line(out.stderr).startswith(
        "hf-rope-ext finetune: error: model 'no-such-dir' is not a model directory"
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not a model")
    cases = {
        "./no-such-dir": "model 'no-such-dir' is not a model directory (no such folder)",
        "a/b/c": "model 'a/b/c' is not a model directory (no such folder)",
        "notes": "model 'notes' is not a model directory (no config.json there)",
    }
    for model, message in cases.items():
        assert main([*FINETUNE, "--model", model, "--max-steps", "1"]) == 2
        assert error_line(capsys.readouterr().err) == f"hf-rope-ext finetune: error: {message}"
        assert main(["eval", "--model", model]) == 2  # eval says the same
        assert error_line(capsys.readouterr().err) == f"hf-rope-ext eval: error: {message}"
    assert main(FINETUNE) == 2
    assert "--max-steps is required (or --stages" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_finetune_help_shows_help_and_default_of_every_option():
    out = cli("finetune", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for option, default in [("--rank", "8"), ("--lr", "0.0002"), ("--pose-chunks", "2"), ("--seed", "0")]:
        assert f"(default: {default})" in text.split(option, 2)[-1].split(" --", 1)[0], option
    from hf_rope_ext.cli import build_parser

    finetune = build_parser()._subparsers._group_actions[0].choices["finetune"]
    assert all(action.help for action in finetune._actions), [a.option_strings for a in finetune._actions if not a.help]
