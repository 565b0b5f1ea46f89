"""The evaluation harness on a tiny random Llama with a byte-level tokenizer (L0 = 64)."""

from __future__ import annotations

import json
import math
import shlex

import pytest
import torch
from conftest import EVAL_L0 as L0
from conftest import PNG_MAGIC, eval_llama_config, save_eval_llama
from transformers import AutoModelForCausalLM, ByT5Tokenizer

import hf_rope_ext  # noqa: F401
from hf_rope_ext.cli import main
from hf_rope_ext.eval import (
    compose,
    last_chunk_losses,
    load_model,
    load_token_documents,
    load_tokenizer,
    markdown_table,
    needle_grid,
    parse_rope_params,
    pivot_table,
    plot_heatmap,
    plot_perplexity,
    requested_parameters,
    tokenize_pieces,
    truncated_perplexity,
    write_json,
)
from hf_rope_ext.eval.passkey import NeedleSample, generation_hit, teacher_forced_hit
from hf_rope_ext.eval.perplexity import CachedLosses


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_eval_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture(scope="module")
def documents(tiny_dir, docs_dir):
    return load_token_documents(load_tokenizer(tiny_dir), docs_dir)


def test_documents_are_the_files_bytes(documents, docs_dir):
    assert [len(d) for d in documents] == [40, 150, 260, 400]
    assert bytes((documents[1] - 3).tolist()) == (docs_dir / "doc1.txt").read_bytes()


@pytest.mark.parametrize("length", [32, 100, 260])
def test_perplexity_equals_the_models_own_loss(model, documents, length):
    result = truncated_perplexity(model, documents, length, progress=False)
    with torch.no_grad():
        losses = [
            model(input_ids=d[None, :length], labels=d[None, :length]).loss for d in documents if len(d) >= length
        ]
    assert result["documents"] == len(losses)
    assert result["tokens"] == len(losses) * (length - 1)
    assert result["perplexity"] == pytest.approx(math.exp(torch.stack(losses).mean().item()), rel=1e-5)


def test_perplexity_limit_takes_the_first_long_documents(model, documents):
    limited = truncated_perplexity(model, documents, 100, limit=1, progress=False)
    alone = truncated_perplexity(model, [documents[1]], 100, progress=False)
    assert limited["documents"] == 1 and limited["perplexity"] == pytest.approx(alone["perplexity"], rel=1e-6)


def test_length_longer_than_every_document_is_an_error(model, documents):
    with pytest.raises(ValueError, match="length=401.*longest: 400"):
        truncated_perplexity(model, documents, 401, progress=False)


def test_last_chunk_loss_matches_masked_labels(model, documents):
    contexts, chunk = [40, 90, 150], 24
    result = last_chunk_losses(model, documents, contexts, chunk, progress=False)
    for context in contexts:
        reference = []
        for doc in documents:
            if len(doc) < 150:
                continue
            window = doc[150 - context : 150][None]
            labels = window.clone()
            labels[:, :-chunk] = -100  # score only the final chunk (labels are shifted inside the model)
            with torch.no_grad():
                reference.append(model(input_ids=window, labels=labels).loss)
        assert result[context] == pytest.approx(torch.stack(reference).mean().item(), rel=1e-5)


def test_last_chunk_rejects_contexts_not_longer_than_the_chunk(model, documents):
    with pytest.raises(ValueError, match="chunk=64"):
        last_chunk_losses(model, documents, [64, 128], 64, progress=False)


def test_cached_losses_share_a_window_between_measures(model, documents):
    cache = CachedLosses()
    truncated_perplexity(model, documents, 150, progress=False, losses_fn=cache)
    computed = len(cache.store)
    last_chunk_losses(model, documents, [150], 20, progress=False, losses_fn=cache)
    assert len(cache.store) == computed  # the context-150 windows are the first 150 tokens: nothing recomputed


def depth_error_bound(pieces, length: int) -> float:
    """The largest distance between a requested and an actual depth: half the longest sentence, over the filler."""
    task, sentences, needle, question, answer = pieces
    filler = length - len(task) - len(needle) - len(question) - len(answer)
    return math.inf if filler <= 0 else max(len(s) for s in sentences) / 2 / filler


@pytest.mark.parametrize("length", [260, 333, 512])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_passkey_prompt_has_the_length_and_the_needle_at_depth(length, depth):
    tokenizer = ByT5Tokenizer()
    pieces = tokenize_pieces(tokenizer, 48213)
    sample = compose(pieces, length, depth)
    task, sentences, needle, question, answer = pieces
    ids = sample.input_ids.tolist()
    assert len(ids) == length and sample.prompt_length == length - len(answer)
    assert ids[sample.needle_start : sample.needle_start + len(needle)] == needle
    assert ids[: len(task)] == task and ids[sample.prompt_length :] == answer
    assert ids[sample.prompt_length - len(question) : sample.prompt_length] == question
    assert abs(sample.depth - depth) <= depth_error_bound(pieces, length) + 1e-9
    filler_before = sample.needle_start - len(task)
    filler_total = length - len(task) - len(needle) - len(question) - len(answer)
    assert sample.depth == pytest.approx(filler_before / filler_total)
    before = tokenizer.decode(ids[len(task) : sample.needle_start])
    assert sample.needle_start == len(task) or before.endswith(".")  # the needle starts at a sentence boundary
    after = tokenizer.decode(ids[sample.needle_start + len(needle) : sample.prompt_length - len(question)])
    assert after == "" or after.endswith(".")  # whole sentences between the needle and the question
    assert "The pass key is 48213. Remember it. 48213 is the pass key." in tokenizer.decode(ids)


def test_passkey_prompt_too_short_and_bad_depth_are_errors():
    pieces = tokenize_pieces(ByT5Tokenizer(), 12345)
    with pytest.raises(ValueError, match="length=250"):
        compose(pieces, 250, 0.5)
    with pytest.raises(ValueError, match="depth=1.5"):
        compose(pieces, 400, 1.5)


def test_teacher_forced_and_generation_scoring_agree_on_hits_and_misses(model):
    prompt = torch.arange(3, 43)  # 40 tokens
    with torch.no_grad():
        greedy = model.generate(prompt[None], max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)[0]
    hit = NeedleSample(greedy, prompt_length=40, needle_start=0, needle_length=0, depth=0.0)
    wrong = greedy.clone()
    wrong[-2] = (wrong[-2] + 1) % 384
    miss = NeedleSample(wrong, prompt_length=40, needle_start=0, needle_length=0, depth=0.0)
    assert teacher_forced_hit(model, hit) and generation_hit(model, hit)
    assert not teacher_forced_hit(model, miss) and not generation_hit(model, miss)


def test_needle_grid_and_heatmap(model, tiny_dir, docs_dir, tmp_path):
    grid, depths = needle_grid(model, load_tokenizer(tiny_dir), [220, 300], depths=3, data=docs_dir, progress=False)
    assert grid.shape == (3, 2) and depths == [0.0, 0.5, 1.0]
    assert ((grid == 0) | (grid == 1)).all()
    path = plot_heatmap(grid.numpy(), depths, [220, 300], tmp_path / "needle.png")
    assert path.read_bytes()[:4] == PNG_MAGIC


def test_report_table_json_and_plot(tmp_path):
    records = [
        {"rope_type": "none", "factor": None, "length": 64, "perplexity": 3.5},
        {"rope_type": "yarn", "factor": 2.0, "length": 128, "perplexity": 4.25, "passkey_accuracy": 0.5},
    ]
    table = markdown_table(records).splitlines()
    assert table[0] == "| rope_type | factor | length | perplexity | passkey_accuracy |"
    assert table[2] == "| none | - | 64 | 3.5 | - |" and table[3] == "| yarn | 2 | 128 | 4.25 | 0.5 |"
    assert pivot_table(records).splitlines() == [
        "| rope_type | 64 | 128 |",
        "| --- | --- | --- |",
        "| none | 3.5 | - |",
        "| yarn | - | 4.25 |",
    ]
    assert json.loads(write_json(records, tmp_path / "r.json").read_text()) == records
    assert plot_perplexity(records, tmp_path / "p.png", 64).read_bytes()[:4] == PNG_MAGIC


def test_rope_parameters_for_fills_theta_and_pretraining_length():
    config = eval_llama_config()
    params = requested_parameters(config, "yarn", 4.0)
    assert params == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": L0}
    assert requested_parameters(config, "linear", 2.0) == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    assert requested_parameters(config, None) is None


@pytest.mark.parametrize(
    ("rope_type", "factor", "extra", "error", "match"),
    [
        ("no_such_type", 2.0, {}, KeyError, "no_such_type"),
        (None, 2.0, {}, ValueError, "without a rope_type"),
        ("dynamic_yarn", 2.0, {}, ValueError, "takes no factor"),
        ("yarn", 2.0, {"windw": 3}, ValueError, r"\['windw'\]=3 is not a parameter of rope_type='yarn'"),
        ("yarn", None, {}, KeyError, "needs 'factor'"),
    ],
)
def test_rope_parameters_for_bad_input(rope_type, factor, extra, error, match):
    with pytest.raises(error, match=match):
        requested_parameters(eval_llama_config(), rope_type, factor, extra)


def test_parse_rope_params():
    assert parse_rope_params(["window=16", "beta_fast=24.5", "truncate=false"]) == {
        "window": 16,
        "beta_fast": 24.5,
        "truncate": False,
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_rope_params(["window"])


@pytest.mark.parametrize("rope_type", ["yarn", "ntk_by_parts", "linear"])
def test_loaded_model_equals_one_built_with_the_same_config(tiny_dir, rope_type):
    params = requested_parameters(eval_llama_config(), rope_type, 4.0)
    loaded = load_model(tiny_dir, params)
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(eval_llama_config(rope_parameters=params)).eval()
    built.load_state_dict(load_model(tiny_dir).state_dict())
    ids = torch.arange(3, 203)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, built(ids).logits, rtol=0, atol=0)


def test_eval_cli_writes_records(tiny_dir, docs_dir, tmp_path, capsys):
    out, needle = tmp_path / "r.json", tmp_path / "needle.png"
    argv = [
        "eval",
        "--model",
        str(tiny_dir),
        "--rope-type",
        "yarn",
        "--factor",
        "2",
        "--lengths",
        "256,384",
        "--data",
        str(docs_dir),
        "--passkey-depths",
        "0",
        "--last-chunk",
        "32",
        "--json",
        str(out),
        "--needle",
        str(needle),
        "--needle-depths",
        "2",
        "--no-progress",
    ]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    records = report["records"]
    assert [(r["rope_type"], r["factor"], r["length"]) for r in records] == [("yarn", 2.0, 256), ("yarn", 2.0, 384)]
    assert report["metadata"]["command"] == shlex.join(["hf-rope-ext", *argv]) and report["metadata"]["date"]
    assert all(math.isfinite(r["perplexity"]) and "last_chunk_loss" in r for r in records)
    assert "| yarn | 2 | 384 |" in capsys.readouterr().out
    assert needle.read_bytes()[:4] == PNG_MAGIC
    assert main(argv) == 2  # the JSON exists now: refused without --overwrite
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/nonexistent/model"], "not a model directory"),
        (["--rope-type", "nope", "--factor", "2"], "nope"),
        (["--lengths", "1000"], "length=1000"),
        (["--lengths", "64,abc"], "comma-separated"),
    ],
)
def test_eval_cli_bad_input(tiny_dir, docs_dir, args, message, capsys):
    base = ["eval", "--model", str(tiny_dir), "--data", str(docs_dir), "--passkey-depths", "0", "--no-progress"]
    assert main(base + args) == 2
    assert message in capsys.readouterr().err
