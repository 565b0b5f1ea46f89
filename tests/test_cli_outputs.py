"""``--overwrite`` replaces only the files a command writes: the user's own files in the folder stay, a README.md
hf-rope-ext did not write is never replaced, and the package removes only its own stale files
(hf_rope_ext.store.outputs)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import save_eval_llama
from transformers import AutoModelForCausalLM

import hf_rope_ext
from hf_rope_ext.cli import main
from hf_rope_ext.store import outputs


def write(folder, files: dict) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_staged_replaces_its_files_keeps_the_users_and_removes_only_its_own_stale_files(tmp_path):
    target = tmp_path / "out"
    with outputs.Staged(target, False, "DST") as tmp:
        write(tmp, {"a.bin": "1", "shards/s1.bin": "1", "shards/s2.bin": "1"})
    write(target, {"notes.md": "mine", "shards/mine.txt": "mine"})
    with pytest.raises(FileExistsError, match="pass --overwrite to replace the files this command writes"):
        outputs.Staged(target, False, "DST")
    stage = outputs.Staged(target, True, "DST")
    with stage as tmp:
        write(tmp, {"a.bin": "2", "b.bin": "2"})
    assert outputs.relative_files(target) == ["a.bin", "b.bin", "notes.md", "shards/mine.txt"]
    assert (target / "a.bin").read_text() == "2"
    assert stage.removed == ["shards/s1.bin", "shards/s2.bin"] and stage.kept == ["notes.md", "shards/mine.txt"]
    with pytest.raises(RuntimeError), outputs.Staged(target, True, "DST") as tmp:  # a failure changes nothing
        write(tmp, {"a.bin": "3"})
        raise RuntimeError("boom")
    assert (target / "a.bin").read_text() == "2" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (target / "README.md").write_text("# my notes\n")
    with pytest.raises(FileExistsError, match="README.md was not written by hf-rope-ext and is never replaced"):
        outputs.Staged(target, True, "DST", writes_card=True)
    with pytest.raises(NotADirectoryError):
        outputs.check_dir(target / "a.bin", True, "--out")


def test_extend_overwrite_keeps_the_users_files(docs_dir, tmp_path, capsys):
    model = save_eval_llama(tmp_path / "tiny")
    out = tmp_path / "extended"
    write(out, {"notes.md": "my notes", "README.md": "# my own readme\n"})
    argv = ["extend", "--model", str(model), "--rope-type", "ntk", "--factor", "2", "--out", str(out)]
    argv += ["--data", str(docs_dir), "--documents", "1", "--last-chunk", "0", "--passkey-depths", "0"]
    argv += ["--no-progress", "--overwrite"]
    assert main(argv) == 2  # the user's README.md is where the card goes: refused before any work
    assert "its README.md was not written by hf-rope-ext" in capsys.readouterr().err
    (out / "README.md").rename(out / "MY_README.md")
    assert main(argv) == 0
    assert (out / "notes.md").read_text() == "my notes" and (out / "MY_README.md").read_text() == "# my own readme\n"
    assert (out / "config.json").is_file() and (out / "report.json").is_file()
    assert main(argv) == 0  # again: our own card and files are replaced, the user's stay
    assert (out / "notes.md").read_text() == "my notes"
    assert main(argv[:-1]) == 2 and "pass --overwrite" in capsys.readouterr().err


def test_export_overwrite_removes_its_stale_shards_and_keeps_the_users_files(tmp_path, capsys):
    torch.manual_seed(0)
    import conftest

    model = AutoModelForCausalLM.from_config(conftest.tiny_config("llama", {"rope_type": "ntk", "factor": 2.0}))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    model.save_pretrained(tmp_path / "single")
    dst = tmp_path / "portable"
    assert main(["export", str(tmp_path / "sharded"), str(dst)]) == 0
    assert len(list(dst.glob("model-*.safetensors"))) > 1
    write(dst, {"notes.md": "mine"})
    assert main(["export", str(tmp_path / "single"), str(dst)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "single"), str(dst), "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert "removed" in out and "stale" in out and "kept 1 file(s) this command does not write: notes.md" in out
    assert not list(dst.glob("model-*.safetensors")) and not (dst / "model.safetensors.index.json").exists()
    assert (dst / "notes.md").read_text() == "mine"
    loaded = AutoModelForCausalLM.from_pretrained(dst).eval()
    ids = torch.arange(20)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits, rtol=0, atol=1e-5)
    assert json.loads((dst / outputs.MANIFEST).read_text())["files"] == sorted(
        p.name for p in dst.iterdir() if p.name not in ("notes.md", outputs.MANIFEST)
    )
    assert hf_rope_ext.available_rope_types()  # the package stays usable after the CLI ran in-process


def modes(folder) -> set[tuple[str, int]]:
    """(kind, permission bits) of ``folder`` and everything in it."""
    paths = [folder, *folder.rglob("*")] if folder.is_dir() else [folder]
    return {("dir" if p.is_dir() else "file", p.stat().st_mode & 0o777) for p in paths}


def test_what_every_command_writes_gets_the_users_umask(docs_dir, tmp_path, capsys):
    """A colleague on the same server reads the outputs as the user's umask allows (safetensors writes 0600, a
    staging folder is made 0700)."""
    from conftest import save_byte_llama

    model, base = save_eval_llama(tmp_path / "tiny"), save_byte_llama(tmp_path / "base", 32)
    rope = ["--rope-type", "ntk", "--factor", "2"]
    measures = ["--data", str(docs_dir), "--documents", "1", "--passkey-depths", "0", "--last-chunk", "16"]
    commands = {
        "extend": ["extend", "--model", str(model), *rope, *measures, "--out", str(tmp_path / "extend")],
        "eval": ["eval", "--model", str(model), *measures, "--lengths", "64", "--json", str(tmp_path / "eval.json")],
        "export": ["export", str(tmp_path / "extend"), str(tmp_path / "export")],
        "convert-layout": ["convert-layout", str(tmp_path / "extend"), str(tmp_path / "layout"), "--to", "interleaved"],
        "push": ["push", str(tmp_path / "export"), "--repo-id", "me/x", "--dry-run", str(tmp_path / "push")],
        "finetune": ["finetune", "--model", str(base), "--data", str(docs_dir), "--out", str(tmp_path / "finetune")]
        + ["--rope-type", "ntk", "--length", "64", "--max-steps", "2", "--save-every", "1", "--merge"],
    }
    previous = os.umask(0o027)
    try:
        for name, argv in commands.items():
            assert main([*argv, "--no-progress"]) == 0, (name, capsys.readouterr().err)
            written = tmp_path / {"eval": "eval.json", "convert-layout": "layout"}.get(name, name)
            assert modes(written) <= {("file", 0o640), ("dir", 0o750)}, (name, modes(written))
    finally:
        os.umask(previous)
