"""The shipped default model and its corpus list (the few tests that read the shipped files)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import conftest
import numpy as np
import pytest
import torch
from transformers import ByT5Tokenizer

from hf_rope_ext.eval import load_model, load_tokenizer, truncated_perplexity
from hf_rope_ext.eval.data import encode
from hf_rope_ext.eval.last_chunk import last_chunk_losses
from hf_rope_ext.eval.passkey import passkey_accuracy
from hf_rope_ext.store import bundled

ROOT = Path(__file__).resolve().parents[1]
SAME_PYTHON = sys.version_info[:2] == (3, 11)
# path components that are tests, GUI demos, generated tables or installed third-party code, not library source
EXCLUDED_PARTS = frozenset(
    {"test", "tests", "idlelib", "turtledemo", "site-packages", "encodings", "pydoc_data", "__pycache__", "lib2to3"}
)


def scan_stdlib() -> list[str]:
    """Sorted relative paths of the stdlib's ``.py`` files, minus ``EXCLUDED_PARTS`` and ``_sysconfigdata*``: the
    rule ``corpus_files.txt`` was made by."""
    root = bundled.stdlib_root()
    paths = (p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    keep = (p for p in paths if not EXCLUDED_PARTS.intersection(p.split("/")[:-1]))
    return sorted(p for p in keep if not p.rsplit("/", 1)[-1].startswith("_sysconfigdata"))


def listed() -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in bundled.FILE_LIST.read_text().splitlines()]


def test_file_list_is_sorted_and_split_by_path_hash():
    rows = listed()
    assert [p for _, p in rows] == sorted(p for _, p in rows)
    assert all(split == bundled.split_of(path) for split, path in rows)
    assert {split for split, _ in rows} == set(bundled.SPLITS)


@pytest.mark.skipif(not SAME_PYTHON, reason="the list was made from the Python 3.11 standard library")
def test_file_list_is_this_interpreters_stdlib_scan():
    assert [p for _, p in listed()] == scan_stdlib()


@pytest.mark.skipif(not SAME_PYTHON, reason="the list was made from the Python 3.11 standard library")
def test_eval_split_has_documents_for_eight_times_the_pretraining_length():
    sizes = [len(text.encode("utf-8")) for text in bundled.read_documents(bundled.corpus_files("eval"))]
    assert sum(size >= 8 * 512 for size in sizes) >= 20


def test_bad_split_is_an_error():
    with pytest.raises(ValueError, match="'dev'"):
        bundled.corpus_files("dev")


def pretrain_script():
    spec = importlib.util.spec_from_file_location("pretrain", ROOT / "experiments" / "pretrain_tiny_llama.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_pretraining_ids_are_the_tokenizers_ids():
    script = pretrain_script()
    text = "def f(x):\n    return x  # é ≥ 🙂\n"
    ids = torch.from_numpy(script.token_stream_of([text]))
    assert ids.tolist() == ByT5Tokenizer()(text)["input_ids"]  # the bytes + 3, then </s>


def test_synthetic_windows_have_the_length_and_ask_for_what_they_planted():
    script = pretrain_script()
    code = script.token_stream_of(["def f(x):\n    return x + 1\n" * 200])
    tokenizer = ByT5Tokenizer()
    for seed in range(40):
        for length in (128, 512):
            rng = np.random.default_rng(seed)
            ids, targets = script.synthetic_window(rng, code, length)
            assert len(ids) == len(targets) == length and targets.any()
            ids, targets = script.passkey_window(np.random.default_rng(seed), code, length)
            text = tokenizer.decode(ids)
            key = text.rsplit(" ", 1)[-1]  # the answer: the last word
            assert key.isdigit() and 3 <= len(key) <= 7 and text.count(key) >= 2  # planted before, asked at the end
            assert tokenizer.decode(ids[targets]) == key  # the targets are the answer's digits


def test_copy_drill_windows_repeat_one_random_string():
    script = pretrain_script()
    for seed in range(20):
        ids, targets = script.drill_window(np.random.default_rng(seed), 128)
        k = int(np.argmax(targets))  # the first scored id starts the second copy
        assert len(ids) == len(targets) == 128 and 8 <= k < 64 and targets[k:].all() and not targets[:k].any()
        assert (ids[k:] == ids[:-k]).all() and np.isin(ids, script.PRINTABLE).all()


def test_copy_drill_runs_each_phase_and_reports_its_loss():
    script = pretrain_script()
    args = script.parse_args(["--drill", "1e-3:2,5e-3:3", "--drill-len", "32", "--drill-batch", "2"])
    model = conftest.tiny_model("llama", **{**conftest.SMALL, "vocab_size": 384}).train()
    before = [p.detach().clone() for p in model.parameters()]
    phases = script.copy_drill(model, args)
    assert [(p["lr"], p["steps"]) for p in phases] == [(1e-3, 2), (5e-3, 3)] and all(0 < p["loss"] < 10 for p in phases)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("text", ["1e-3", "0:10", "1e-3:0", "a:b"])
def test_a_malformed_drill_is_refused_before_anything_loads(text):
    with pytest.raises(SystemExit, match="--drill"):
        pretrain_script().parse_args(["--drill", text])


def test_card_gives_every_run_of_a_warm_start_chain_in_order():
    script = pretrain_script()
    first = {"command": "python first.py", "step": 1000, "max_steps": 1000, "eval_loss": 1.25}
    second = {"command": "python second.py", "step": 600, "max_steps": 900, "eval_loss": 1.5}
    last = {"command": "python third.py", "step": 5, "max_steps": 5, "eval_loss": 1.3}
    last["init_from_training"] = {**second, "init_from_training": first}
    assert [run["command"] for run in script.stages(last)] == ["python first.py", "python second.py", "python third.py"]
    text = "\n".join(script.reproduce_lines(last))
    assert "3 runs in order" in text and "# 600 of 900 steps, held-out loss 1.5000\npython second.py" in text
    assert text.index("first.py") < text.index("second.py") < text.index("third.py")
    assert "runs in order" not in "\n".join(script.reproduce_lines(first)) and "python first.py" in text


def test_synthetic_batches_are_seeded_per_step():
    script = pretrain_script()
    code = script.token_stream_of(["x = 1\n" * 2000])
    windows = script.windows(code, 256)
    args = script.parse_args(["--synthetic", "0.5", "--seed", "3"])
    rows = torch.arange(4)
    first, targets = script.make_batch(windows, rows, code, 7, 256, args)
    assert torch.equal(first, script.make_batch(windows, rows, code, 7, 256, args)[0])
    assert not torch.equal(first, script.make_batch(windows, rows, code, 8, 256, args)[0])
    assert torch.equal(first[2:], windows[2:4]) and targets[2:].all()  # the rest of the batch is code, all scored


@pytest.fixture(scope="module")
def shipped():
    path = bundled.default_model_path()
    return path, load_model(path), load_tokenizer(path)


def test_shipped_model_is_small_and_loads_offline(shipped):
    path, model, tokenizer = shipped
    assert (path / "model.safetensors").stat().st_size <= 20 * 2**20
    assert model.config.max_position_embeddings == 512 and model.config.vocab_size == len(tokenizer) == 384
    assert (path / "README.md").is_file()


@pytest.mark.skipif(not SAME_PYTHON, reason="the eval split is read from the Python 3.11 standard library")
def test_shipped_model_has_learned_the_corpus(shipped):
    _, model, tokenizer = shipped
    docs = [encode(tokenizer, text) for text in bundled.read_documents(bundled.corpus_files("eval")[:4])]
    result = truncated_perplexity(model, docs, 512, progress=False)
    assert result["loss"] < math.log(len(tokenizer)) / 2  # far below a uniform guess over the bytes


def test_shipped_model_retrieves_a_pass_key_at_its_training_length(shipped):
    # 5 depths (0, 25, 50, 75, 100%) x 2 keys, 512 tokens, unscaled: every answer digit must be the argmax
    _, model, tokenizer = shipped
    result = passkey_accuracy(model, tokenizer, 512, depths=5, trials=2, generate=False, seed=3, progress=False)
    assert result["passkey_accuracy"] == 1.0, result["passkey_by_depth"]


@pytest.mark.skipif(not SAME_PYTHON, reason="the eval split is read from the Python 3.11 standard library")
def test_shipped_model_reads_its_whole_context(shipped):
    # the last 128 tokens of each eval document's first 512, predicted with 512 tokens of context and with 160:
    # 1.498 and 1.625 nats; the model before retrieval training had 1.505 and 1.517
    _, model, tokenizer = shipped
    docs = [encode(tokenizer, text) for text in bundled.read_documents(bundled.corpus_files("eval"))]
    losses = last_chunk_losses(model, docs, (160, 512), progress=False)
    assert losses[512] < losses[160] - 0.05, losses
