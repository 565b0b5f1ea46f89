"""GGUF files as model inputs (``hf_rope_ext.from_gguf``): refused by name when they are not GGUF, converted once
per file content. The conversion itself, on a real GGUF file, is in test_real_model.py."""

from __future__ import annotations

import pytest

import hf_rope_ext
from hf_rope_ext import from_gguf
from hf_rope_ext.cli import main


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ROPE_EXT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_file_that_is_not_gguf_is_named_by_every_entry(tmp_path, cache, capsys):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(ValueError, match="model.gguf' is not a GGUF file \\(it does not start with the GGUF magic\\)"):
        hf_rope_ext.rope_parameters_for(fake, "yarn", factor=2.0)
    assert main(["eval", "--model", str(fake), "--lengths", "64", "--no-progress"]) == 2
    assert "model.gguf' is not a GGUF file" in capsys.readouterr().err
    assert main(["extend", "--model", str(tmp_path / "missing.gguf"), "--no-progress"]) == 2
    assert "missing.gguf' is not a GGUF file (no such file)" in capsys.readouterr().err
    assert not cache.exists()  # nothing converted, nothing left behind


def test_a_gguf_file_is_converted_once_per_content(tmp_path, cache, monkeypatch):
    made = []

    def convert(src, dst, dtype):
        made.append(src.name)
        dst.mkdir(parents=True)
        (dst / "config.json").write_text("{}")
        return dst

    monkeypatch.setattr(from_gguf, "convert_gguf", convert)
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    first.write_bytes(b"GGUF one")
    second.write_bytes(b"GGUF two")
    assert from_gguf.model_folder(first) == from_gguf.model_folder(first)
    assert from_gguf.model_folder(second) != from_gguf.model_folder(first)
    assert made == ["a.gguf", "b.gguf"]
    assert from_gguf.model_folder(first).parent == cache / "gguf"


def test_only_paths_ending_in_gguf_are_gguf(tmp_path):
    assert from_gguf.is_gguf("m.GGUF") and from_gguf.is_gguf(tmp_path / "m.gguf")
    assert not from_gguf.is_gguf(tmp_path) and not from_gguf.is_gguf(None) and not from_gguf.is_gguf({"a": ".gguf"})
