"""A report names the torch build it ran on (+cpu, +cu128), not only the distribution's version: PyPI's CUDA
wheels leave the build out of the distribution's version, so a figure from a CUDA run would read as a CPU one."""

from __future__ import annotations

import json
import platform

import torch

from hf_rope_ext.eval import metadata


def test_torch_version_is_the_modules_with_its_build(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "9.9.9+cu999")  # no distribution on any machine has this version
    assert metadata.version("torch") == "9.9.9+cu999"


def test_versions_of_every_package_and_python(tmp_path):
    meta = metadata.run_metadata(tmp_path, "hf-rope-ext eval")
    assert set(meta["versions"]) == {*metadata.PACKAGES, "python"}
    assert meta["versions"]["python"] == platform.python_version()
    assert metadata.version("no-such-distribution-hf-rope-ext") is None
    assert meta["model_sha256"] is None  # a folder without config.json or weights


def test_a_report_names_the_dtype_device_and_threads_it_ran_with(probe_llama, tmp_path):
    """``eval --json`` (the default measures, which load the model in float32 on the CPU) records its provenance."""
    from hf_rope_ext.cli import main

    argv = ["eval", "--model", str(probe_llama), "--lengths", "256", "--documents", "1", "--passkey-depths", "0"]
    assert main([*argv, "--no-progress", "--json", str(tmp_path / "r.json")]) == 0
    found = json.loads((tmp_path / "r.json").read_text())["metadata"]["provenance"]
    assert {k: found[k] for k in ("dtype", "device")} == {"dtype": "float32", "device": "cpu"}
    assert found["threads"] >= 1 and found["commit"] and found["clean"] in (True, False, "unknown")
