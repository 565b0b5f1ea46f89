"""GGUF files as model inputs (``hf_rope_ext.store.from_gguf``): refused by name when they are not GGUF, converted once
per file content. The conversion itself, on a real GGUF file, is in test_real_model.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import hf_rope_ext
from hf_rope_ext.cli import main
from hf_rope_ext.store import from_gguf, gguf_rope


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


def tiny_gguf(path, context: int = 512):
    """A metadata-and-one-tensor GGUF file of architecture llama (enough for the rope keys, not for a model)."""
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_context_length(context)
    writer.add_rope_freq_base(10000.0)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"rope_type": "linear", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
        (
            {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512, "beta_fast": 16.0},
            {
                "rope_type": "yarn",
                "factor": 2.0,
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 512,
                "beta_fast": 16.0,
            },
        ),
    ],
    ids=["linear", "yarn"],
)
def test_rope_scaling_keys_written_for_llama_cpp_read_back_as_rope_parameters(tmp_path, params, expected):
    out = gguf_rope.export_gguf(tiny_gguf(tmp_path / "m.gguf"), tmp_path / "x.gguf", params)
    reader = gguf.GGUFReader(out)
    assert gguf_rope.field(reader, "llama.rope.scaling.type") == params["rope_type"]
    assert gguf_rope.field(reader, "llama.rope.scaling.original_context_length") == 512
    assert gguf_rope.field(reader, "llama.context_length") == 512 * params["factor"]
    assert gguf_rope.field(reader, "llama.rope.scaling.yarn_beta_slow") is None  # the default is not written
    assert gguf_rope.rope_parameters_of(out) == expected
    assert (reader.tensors[0].data == gguf.GGUFReader(tmp_path / "m.gguf").tensors[0].data).all()
    assert gguf_rope.rope_parameters_of(tmp_path / "m.gguf") is None


def test_gguf_refuses_attention_level_types_and_an_existing_out(tmp_path, capsys):
    src = tiny_gguf(tmp_path / "m.gguf")
    assert main(["gguf", str(src), "--rope-type", "rerope", "--out", str(tmp_path / "x.gguf")]) == 2
    assert "--rope-type 'rerope': llama.cpp's GGUF rope scaling takes ['linear', 'yarn']" in capsys.readouterr().err
    (tmp_path / "x.gguf").write_text("mine")
    with pytest.raises(FileExistsError, match="x.gguf' exists"):
        gguf_rope.export_gguf(src, tmp_path / "x.gguf", {"rope_type": "linear", "factor": 2.0})
    assert (tmp_path / "x.gguf").read_text() == "mine"
