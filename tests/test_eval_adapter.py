"""``hf-rope-ext eval --adapter DIR`` (or the adapter folder as ``--model``, as peft's AutoPeftModelForCausalLM takes
it): a fine-tuned LoRA adapter evaluated unmerged on its base, built with the extended config saved beside it; the
figures equal those of the merged model."""

from __future__ import annotations

import json

import pytest
from conftest import save_byte_llama

from hf_rope_ext.cli import main

L0 = 32


@pytest.fixture(scope="module")
def run(tmp_path_factory, docs_dir):
    """A fine-tuning run (yarn, 2 x L0) with its merged model, trained hard enough to move the perplexity."""
    root = tmp_path_factory.mktemp("adapter")
    base = save_byte_llama(root / "base", L0)
    argv = ["finetune", "--model", str(base), "--data", str(docs_dir), "--out", str(root / "run"), "--rope-type"]
    argv += ["yarn", "--length", str(2 * L0), "--max-steps", "3", "--lr", "0.05", "--merge", "--no-progress"]
    assert main(argv) == 0
    return root


def perplexities(argv: list[str], docs, out) -> list[float]:
    measures = ["--data", str(docs), "--lengths", f"{L0},{2 * L0}", "--passkey-depths", "0", "--last-chunk", "16"]
    assert main(["eval", *argv, *measures, "--json", str(out), "--no-progress"]) == 0
    return [r["perplexity"] for r in json.loads(out.read_text())["records"]]


def test_an_adapter_is_evaluated_unmerged_as_its_merged_model(run, docs_dir, tmp_path):
    merged = perplexities(["--model", str(run / "run" / "merged")], docs_dir, tmp_path / "merged.json")
    adapter = perplexities(["--adapter", str(run / "run")], docs_dir, tmp_path / "adapter.json")
    as_model = perplexities(["--model", str(run / "run")], docs_dir, tmp_path / "as_model.json")
    explicit = perplexities(
        ["--model", str(run / "base"), "--adapter", str(run / "run")], docs_dir, tmp_path / "b.json"
    )
    assert adapter == pytest.approx(merged, rel=1e-4) and as_model == adapter == explicit
    base = perplexities(["--model", str(run / "base")], docs_dir, tmp_path / "base.json")
    assert all(abs(a - b) > 1e-3 * b for a, b in zip(adapter, base, strict=True))  # the adapter does something
    meta = json.loads((tmp_path / "adapter.json").read_text())["metadata"]
    assert meta["adapter"] == str(run / "run") and meta["model"] == str(run / "base")


def test_a_folder_that_is_no_adapter_is_named(run, tmp_path, capsys):
    assert main(["eval", "--adapter", str(run / "base")]) == 2
    assert "is not a peft adapter folder (no adapter_config.json there)" in capsys.readouterr().err


def test_an_adapter_shipped_without_a_tokenizer_reads_its_base_tokenizer(run, docs_dir, tmp_path):
    """The examples ship adapter, config.json and card, no tokenizer (``examples/smollm2-*``): the tokenizer is the
    base's, the config the adapter's."""
    import shutil

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors", "config.json"):
        shutil.copy(run / "run" / name, shipped / name)
    assert (run / "run" / "tokenizer_config.json").is_file()  # the run itself has one: the case differs
    found = perplexities(["--model", str(run / "base"), "--adapter", str(shipped)], docs_dir, tmp_path / "s.json")
    assert found == perplexities(["--adapter", str(run / "run")], docs_dir, tmp_path / "a.json")
