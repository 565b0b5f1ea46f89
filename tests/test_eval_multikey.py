"""Pass keys by generation, several per prompt (``eval.multikey``), and the python-docs documents."""

from __future__ import annotations

import pytest
import torch
from conftest import save_eval_llama

from hf_rope_ext.eval import multikey, python_docs
from hf_rope_ext.eval.loading import load_model, load_tokenizer, requested_parameters

LENGTH = 640  # bytes (ByT5 tokens): ten times the tiny model's 64 positions


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_eval_llama(tmp_path_factory.mktemp("tiny_multikey"), seed=3)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return load_tokenizer(tiny_dir)


def recompute(model, tokenizer, ids: list[int], name: str) -> str:
    """The answer to ``name``'s question after ``ids``, greedy, every step a fresh forward over everything."""
    ids = ids + tokenizer(multikey.QUESTION.format(name=name), add_special_tokens=False)["input_ids"]
    out = []
    with torch.no_grad():
        for _ in range(multikey.ANSWER_TOKENS):
            out.append(int(model(torch.tensor([ids + out]), use_cache=False).logits[0, -1].argmax()))
    return tokenizer.decode(out)


@pytest.mark.parametrize(
    "rope",
    [None, ("yarn", 4.0, {}), ("rerope", None, {"window": 16}), ("self_extend", None, {"window": 16, "group_size": 8})],
    ids=["none", "yarn", "rerope", "self_extend"],
)
def test_every_probe_of_a_shared_prefill_equals_its_own_recompute(tiny_dir, tokenizer, rope):
    """One prefill, each question asked after it and cropped away: the same answers as reading each prompt and its
    question from scratch without a cache (so the crop leaves nothing of one question behind for the next)."""
    params = None if rope is None else requested_parameters(tiny_dir, rope[0], rope[1], rope[2])
    model = load_model(tiny_dir, params)
    keys, where = [11111, 22222, 33333], multikey.depths(3)
    found = multikey.probe_prompt(model, tokenizer, LENGTH, keys, where)
    ids = multikey.prompt_ids(tokenizer, LENGTH, keys, where)
    assert [text for _, _, text in found] == [recompute(model, tokenizer, ids, n) for n in multikey.OBJECTS[:3]]
    assert [(d, k) for d, k, _ in found] == list(zip(where, keys, strict=True))


def test_a_prompt_has_its_length_and_each_needle_once_in_depth_order(tokenizer):
    keys = [11111, 22222, 33333]
    ids = multikey.prompt_ids(tokenizer, LENGTH, keys)
    text = tokenizer.decode(ids)
    assert len(ids) == LENGTH
    counts = [
        text.count(multikey.NEEDLE.format(name=n, key=k).strip()) for n, k in zip(multikey.OBJECTS, keys, strict=False)
    ]
    assert counts == [1, 1, 1]
    assert text.index("11111") < text.index("22222") < text.index("33333")


def test_the_prompts_of_a_cell_spread_their_needles_over_every_slot():
    spread = sorted(d for p in range(4) for d in multikey.depths(3, p, 4))
    assert spread == pytest.approx([(i + 0.5) / 12 for i in range(12)])


def test_too_many_keys_or_too_short_a_prompt_is_refused_by_name(tokenizer):
    with pytest.raises(ValueError, match="keys: 8 pass keys per prompt; allowed 1 to 7"):
        multikey.prompt_ids(tokenizer, LENGTH, list(range(10000, 10008)))
    with pytest.raises(ValueError, match="length=200: too short for 3 needles"):
        multikey.prompt_ids(tokenizer, 200, [11111, 22222, 33333])


def test_accuracy_counts_hits_and_names_each_miss(tokenizer, monkeypatch):
    answers = iter(["12 345", " 99999.", "abc"])
    monkeypatch.setattr(multikey, "passkeys", lambda count, seed: [12345, 99999, 55555][:count])
    monkeypatch.setattr(
        multikey,
        "probe_prompt",
        lambda m, t, n, keys, where: [(d, k, next(answers)) for d, k in zip(where, keys, strict=True)],
    )
    result = multikey.multikey_accuracy(None, tokenizer, LENGTH, prompts=1, keys=3, progress=False)
    assert result["multikey_accuracy"] == pytest.approx(1 / 3) and result["multikey_probes"] == 3
    assert [k for _, k, _ in result["multikey_misses"]] == [12345, 55555]


def test_python_docs_are_long_documents_made_of_every_topic_page():
    from pydoc_data.topics import topics

    documents = python_docs.texts()
    assert len(documents) >= 3
    assert all(len(d) >= python_docs.DOCUMENT_CHARS for d in documents)
    assert "\n\n".join(documents) == "\n\n".join(topics[k].strip() for k in sorted(topics))
    assert python_docs.is_python_docs("python-docs") and python_docs.is_python_docs(["python-docs"])
    assert not python_docs.is_python_docs(None) and not python_docs.is_python_docs(["python-docs", "x.txt"])
