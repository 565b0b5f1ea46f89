"""A new user's mistakes and accidents at the command line: every bad input is one line naming what is wrong and
what to do (no traceback), a damaged file is named, out of memory says what to try, and nothing is left behind
that blocks the retry."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from conftest import save_byte_llama, save_eval_llama

import hf_rope_ext
from hf_rope_ext.cli import main

L0 = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_eval_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def byte_llama(tmp_path_factory):
    return save_byte_llama(tmp_path_factory.mktemp("base"), L0)


def error_of(capsys) -> str:
    """The one stderr line of a refused command (argparse's usage lines aside)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def leftovers(folder: Path, keep: set[str]) -> list[str]:
    """Names in ``folder`` besides ``keep``: what a failed command left behind (partial folders included)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def finetune_argv(model, data, out, *extra) -> list[str]:
    words = ["finetune", "--model", str(model), "--data", str(data), "--out", str(out), "--rope-type", "yarn"]
    return [*words, "--length", str(2 * L0), "--max-steps", "2", "--batch-size", "1", "--no-progress", *extra]


# 1. rope parameters -------------------------------------------------------------------------------------------------

BAD_PARAMS = {
    "beta_fast=oops": "rope_parameters['beta_fast']='oops' is invalid for rope_type='yarn': expected a number > 0",
    "beta_fast=0.5": "rope_parameters['beta_fast']=0.5 must be greater than rope_parameters['beta_slow']=1",
    "beta_fst=16": "rope_parameters['beta_fst']=16 is not a parameter of rope_type='yarn' (did you mean 'beta_fast'?)",
}


@pytest.mark.parametrize("param", list(BAD_PARAMS))
@pytest.mark.parametrize("command", ["eval", "extend", "finetune"])
def test_a_bad_rope_parameter_is_one_line_naming_it(command, param, tiny, docs_dir, tmp_path, capsys):
    rope = ["--rope-type", "yarn", "--factor", "2", "--rope-param", param]
    argv = {
        "eval": ["eval", "--model", str(tiny), *rope],
        "extend": ["extend", "--model", str(tiny), *rope, "--report-dir", str(tmp_path / "r")],
        "finetune": [*finetune_argv(tiny, docs_dir, tmp_path / "ft"), "--rope-param", param],
    }[command]
    assert main(argv) == 2
    assert BAD_PARAMS[param] in error_of(capsys)
    assert leftovers(tmp_path, set()) == []


def test_rope_parameters_for_validates_like_the_command(tiny):
    with pytest.raises(ValueError, match=r"'beta_fast'\]=0.5 must be greater than"):
        hf_rope_ext.rope_parameters_for(tiny, "yarn", factor=2.0, beta_fast=0.5)
    with pytest.raises(ValueError, match=r"did you mean 'truncate'\?\); allowed keys"):
        hf_rope_ext.rope_parameters_for(tiny, "yarn", factor=2.0, trunkate=False)
    with pytest.raises(KeyError, match=r"'factor'\] is required .* \('fator' was given: a misspelling\?\)"):
        hf_rope_ext.rope_parameters_for(tiny, "ntk", fator=2.0)
    with pytest.raises(ValueError, match=r"'short_factor'\]=\[1, 'x'\] is invalid .* a list of numbers"):
        hf_rope_ext.rope_parameters_for(tiny, "longrope", short_factor=[1, "x"], long_factor=[1.0])
    with pytest.raises(KeyError, match=r"rope_type='yarnn' is not a type of hf_rope_ext \(did you mean 'yarn'\?\)"):
        hf_rope_ext.rope_parameters_for(tiny, "yarnn", factor=2.0)


# 2. damaged files, in every command that reads one ------------------------------------------------------------------


def truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def not_json(path: Path) -> Path:
    path.write_text("{oops")
    return path


def damaged_copy(source: Path, folder: Path, name: str, damage) -> tuple[Path, Path]:
    shutil.copytree(source, folder)
    return folder, damage(folder / name)


def finished_run(byte_llama, docs, root: Path) -> Path:
    out = root / "done"
    assert main(finetune_argv(byte_llama, docs, out, "--save-every", "1")) == 0
    return out


CASES = {
    "eval model.safetensors": ("eval", "model.safetensors", truncate),
    "eval config.json": ("eval", "config.json", not_json),
    "extend model.safetensors": ("extend", "model.safetensors", truncate),
    "finetune model.safetensors": ("finetune", "model.safetensors", truncate),
    "finetune tokenizer_config.json": ("finetune", "tokenizer_config.json", not_json),
    "export config.json": ("export", "config.json", not_json),
    "export model.safetensors": ("export", "model.safetensors", truncate),
    "convert-layout model.safetensors": ("convert-layout", "model.safetensors", truncate),
    "push config.json": ("push", "config.json", not_json),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_command_names_a_damaged_file_and_leaves_no_output(case, tiny, docs_dir, tmp_path, capsys):
    command, name, damage = CASES[case]
    model, damaged = damaged_copy(tiny, tmp_path / "model", name, damage)
    out = tmp_path / "out"
    argv = {
        "eval": ["eval", "--model", str(model), "--json", str(out)],
        "extend": ["extend", "--model", str(model), "--rope-type", "ntk", "--factor", "2", "--out", str(out)],
        "finetune": finetune_argv(model, docs_dir, out),
        "export": ["export", str(model), str(out)],
        "convert-layout": ["convert-layout", str(model), str(out), "--to", "interleaved"],
        "push": ["push", str(model), "--repo-id", "me/x", "--dry-run", str(out)],
    }[command]
    assert main(argv) == 2
    line = error_of(capsys)
    assert line.startswith(f"hf-rope-ext {command}: error: cannot read {str(damaged)!r}") and "again" in line, line
    assert leftovers(tmp_path, {"model"}) == []


@pytest.mark.parametrize("command", ["get-smollm2", "eval"])
def test_a_damaged_gguf_file_is_named_and_leaves_no_output(command, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_ROPE_EXT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "cache" / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"  # as get-smollm2 caches it
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00cut short")
    argv = {"get-smollm2": ["get-smollm2", "--out", str(tmp_path / "out")], "eval": ["eval", "--model", str(gguf)]}
    assert main(argv[command]) == 2
    assert error_of(capsys).startswith(f"hf-rope-ext {command}: error: cannot read {str(gguf)!r}")
    assert leftovers(tmp_path, {"cache"}) == [] and leftovers(tmp_path / "cache", {"downloads"}) == []


def test_a_damaged_checkpoint_is_named_and_the_run_stays_resumable(byte_llama, docs_dir, tmp_path, capsys):
    done = finished_run(byte_llama, docs_dir, tmp_path)
    out = tmp_path / "stopped"  # a run stopped after its first checkpoint: its folder without the adapter
    shutil.copytree(done / "checkpoints", out / "checkpoints")
    checkpoint = out / "checkpoints" / "step-000001"
    truncate(checkpoint / "optimizer.bin")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert main(finetune_argv(byte_llama, docs_dir, out, "--save-every", "1", "--resume-from", str(checkpoint))) == 2
    line = error_of(capsys)
    assert f"cannot read {str(checkpoint / 'optimizer.bin')!r} (BadZipFile" in line
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


# 3. out of memory ---------------------------------------------------------------------------------------------------


def running_out_of_memory_at(monkeypatch, step: int) -> None:
    """Training runs out of memory in the forward of optimizer step ``step`` (as the CPU allocator reports it)."""
    from hf_rope_ext.train import loop

    stock, calls = loop.forward_loss, []

    def forward_loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes.")
        return stock(*args, **kwargs)

    monkeypatch.setattr(loop, "forward_loss", forward_loss)


def test_out_of_memory_says_what_to_try_and_leaves_nothing(byte_llama, docs_dir, tmp_path, capsys, monkeypatch):
    running_out_of_memory_at(monkeypatch, 1)
    assert main(finetune_argv(byte_llama, docs_dir, tmp_path / "out")) == 1
    line = error_of(capsys)
    assert line.startswith("hf-rope-ext finetune: error: out of memory (DefaultCPUAllocator: can't allocate memory")
    assert "--grad-checkpointing" in line and "--batch-size" in line
    assert leftovers(tmp_path, set()) == []  # the same command can be run again


def test_out_of_memory_after_a_checkpoint_keeps_a_resumable_run(byte_llama, docs_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    argv = finetune_argv(byte_llama, docs_dir, out, "--save-every", "1")
    running_out_of_memory_at(monkeypatch, 2)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "out of memory" in err.splitlines()[-1]
    assert f"checkpoint {out / 'checkpoints' / 'step-000001'}" in err and "resume with:" in err
    assert leftovers(tmp_path, set()) == ["out"] and not (out / "adapter_model.safetensors").exists()
    monkeypatch.undo()
    assert main([*argv, "--resume-from", str(out / "checkpoints" / "step-000001")]) == 0
    assert (out / "adapter_model.safetensors").is_file()


# 4. push --dry-run into an existing folder --------------------------------------------------------------------------


def test_push_dry_run_takes_the_overwrite_it_suggests(tiny, tmp_path, capsys):
    argv = ["push", str(tiny), "--repo-id", "me/tiny", "--dry-run", str(tmp_path / "dry")]
    assert main(argv) == 0
    (tmp_path / "dry" / "notes.md").write_text("mine")
    assert main(argv) == 2 and "pass --overwrite" in error_of(capsys)
    assert main([*argv, "--overwrite"]) == 0
    assert (tmp_path / "dry" / "notes.md").read_text() == "mine" and (tmp_path / "dry" / "config.json").is_file()


# 11. a misspelled flag ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "unknown"),
    [
        (["extend", "--factr", "2"], "--factr 2 (did you mean '--factor'?)"),
        (
            ["finetune", "--out", "o", "--rope-type", "yarn", "--length", "64", "--grad-chekpointing"],
            "--grad-chekpointing (did you mean '--grad-checkpointing'?)",
        ),
    ],
)
def test_a_misspelled_flag_gets_the_subcommands_usage_and_the_flag_it_meant(argv, unknown, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: hf-rope-ext {argv[0]} ")
    assert err.strip().splitlines()[-1] == f"hf-rope-ext {argv[0]}: error: unrecognized arguments: {unknown}"


# 12. model names that are no folder ---------------------------------------------------------------------------------


def test_rope_parameters_for_a_missing_folder_names_it():
    with pytest.raises(FileNotFoundError, match=r"model '/nope' is not a model directory \(no such folder\)"):
        hf_rope_ext.rope_parameters_for("/nope", "yarn", factor=2.0)


def test_a_hub_id_that_cannot_be_read_fails_at_once_without_retrying(tmp_path, capsys, monkeypatch):
    def no_retry(seconds):
        raise AssertionError(f"slept {seconds} s: the Hub lookup retried")

    monkeypatch.setattr(time, "sleep", no_retry)  # huggingface_hub backs off with time.sleep between retries
    name = "hf-rope-ext-tests/no-such-model-26"
    with pytest.raises(FileNotFoundError, match=f"model '{name}' is not a model directory"):
        hf_rope_ext.rope_parameters_for(name, "yarn", factor=2.0)
    assert main(finetune_argv(name, tmp_path, tmp_path / "out")) == 2
    assert error_of(capsys).startswith(f"hf-rope-ext finetune: error: model '{name}' is not a model directory")
