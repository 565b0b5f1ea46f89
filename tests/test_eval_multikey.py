"""Pass keys by generation, several per prompt (``eval.multikey``), and the python-docs documents."""

from __future__ import annotations

import pytest
import torch

from hf_rope_ext.eval import multikey, python_docs
from hf_rope_ext.eval.loading import load_model, requested_parameters
from hf_rope_ext.types import registry

LENGTH = 640  # bytes (ByT5 tokens): ten times the tiny model's 64 positions


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
def test_every_probe_of_a_shared_prefill_equals_its_own_recompute(probe_llama, probe_tokenizer, rope):
    """One prefill, each question asked after it and cropped away: the same answers as reading each prompt and its
    question from scratch without a cache (so the crop leaves nothing of one question behind for the next)."""
    params = None if rope is None else requested_parameters(probe_llama, rope[0], rope[1], rope[2])
    model = load_model(probe_llama, params)
    keys, where = [11111, 22222, 33333], multikey.depths(3)
    found = multikey.probe_prompt(model, probe_tokenizer, LENGTH, keys, where)
    ids = multikey.prompt_ids(probe_tokenizer, LENGTH, keys, where)
    assert [text for _, _, text in found] == [recompute(model, probe_tokenizer, ids, n) for n in multikey.OBJECTS[:3]]
    assert [(d, k) for d, k, _ in found] == list(zip(where, keys, strict=True))


# every type of the registry (their examples, at 4x) and transformers' own ones, dynamic ones included
ROPES = [None, {"rope_type": "yarn", "factor": 4.0}, {"rope_type": "dynamic", "factor": 4.0}]
ROPES += [{**registry.example_parameters(m, 4.0), "original_max_position_embeddings": 64} for m in registry.methods()]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: "none" if r is None else r["rope_type"])
def test_prompts_read_with_shared_prefixes_answer_as_each_prompt_read_alone(
    probe_llama, probe_tokenizer, rope, monkeypatch
):
    """Prompts whose needles lie deeper each time share their task and filler up to the earlier first needle: what
    one reads of it is kept for the next, and each question sees what that prompt and the question read from scratch
    without a cache give (logits, and the greedy answer). Types whose frequencies follow the length read (dynamic)
    read each prompt whole."""
    model = load_model(probe_llama, None if rope is None else {"rope_theta": 10000.0, **rope})
    keys, where = [[11111, 44444], [22222, 55555], [33333, 66666]], [[0.2, 0.6], [0.4, 0.8], [0.6, 0.9]]
    prompts = [multikey.prompt_ids(probe_tokenizer, LENGTH, k, w) for k, w in zip(keys, where, strict=True)]
    question = lambda name: probe_tokenizer(multikey.QUESTION.format(name=name), add_special_tokens=False).input_ids  # noqa: E731
    seen, read, ask = [], [], multikey.ask

    def asked(model, tokenizer, cache, keyword, text, tokens):  # the question's logits on the cache, then ask
        held = cache.get_seq_length()
        ids = tokenizer(text, add_special_tokens=False).input_ids
        seen.append((held, text, model(torch.tensor([ids]), **{keyword: cache}).logits[0, -1]))
        cache.crop(held - cache.get_seq_length())
        return ask(model, tokenizer, cache, keyword, text, tokens)

    monkeypatch.setattr(multikey, "ask", asked)
    hook = model.model.register_forward_pre_hook(
        lambda m, args, kw: read.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    found = multikey.probe_prompts(model, probe_tokenizer, prompts, keys, where, iter)
    hook.remove()
    asks = [(ids, name) for ids in prompts for name in multikey.OBJECTS[:2]]
    for (held, text, logits), (ids, name) in zip(seen, asks, strict=True):
        alone = model(torch.tensor([ids + question(name)]), use_cache=False).logits[0, -1]
        assert (held, text) == (LENGTH, multikey.QUESTION.format(name=name)) and torch.allclose(
            logits, alone, atol=1e-4
        )
    assert [text for _, _, text in found] == [recompute(model, probe_tokenizer, ids, name) for ids, name in asks]
    prefills = [n for n in read if n > max(len(question(o)) for o in multikey.OBJECTS)]  # questions, answers: shorter
    shared = [multikey.shared_prefix(a, b) for a, b in zip(prompts, prompts[1:], strict=False)]
    whole = not multikey.reads_in_pieces(model)
    assert prefills == ([LENGTH] * 3 if whole else [LENGTH, LENGTH - shared[0], LENGTH - shared[1]])


@pytest.mark.parametrize(
    "rope, pieces",
    [
        (None, True),
        ("yarn", True),
        ("self_extend", True),
        ("dual_chunk", True),
        ("dynamic", False),
        ("longrope", False),
        ("dynamic_yarn", False),
    ],
)
def test_only_types_whose_frequencies_follow_the_length_read_are_read_whole(rope, pieces):
    class Config:  # what reads_in_pieces reads of a model's config: its text config's rope_parameters
        def __init__(self, rope_parameters):
            self.rope_parameters = rope_parameters

        def get_text_config(self, decoder=False):
            return self

    model = lambda params: type("Model", (), {"config": Config(params)})()  # noqa: E731
    assert multikey.reads_in_pieces(model(None if rope is None else {"rope_type": rope})) == pieces
    layered = {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": rope or "default"}}
    assert multikey.reads_in_pieces(model(layered)) == pieces


def test_the_shared_prefix_of_two_prompts_is_their_common_start():
    assert multikey.shared_prefix([1, 2, 3, 4], [1, 2, 5, 4]) == 2
    assert multikey.shared_prefix([1, 2], [1, 2, 3]) == 2 and multikey.shared_prefix([7], [8]) == 0


def test_a_prompt_has_its_length_and_each_needle_once_in_depth_order(probe_tokenizer):
    keys = [11111, 22222, 33333]
    ids = multikey.prompt_ids(probe_tokenizer, LENGTH, keys)
    text = probe_tokenizer.decode(ids)
    assert len(ids) == LENGTH
    counts = [
        text.count(multikey.NEEDLE.format(name=n, key=k).strip()) for n, k in zip(multikey.OBJECTS, keys, strict=False)
    ]
    assert counts == [1, 1, 1]
    assert text.index("11111") < text.index("22222") < text.index("33333")


def test_the_prompts_of_a_cell_spread_their_needles_over_every_slot():
    spread = sorted(d for p in range(4) for d in multikey.depths(3, p, 4))
    assert spread == pytest.approx([(i + 0.5) / 12 for i in range(12)])


def test_too_many_keys_or_too_short_a_prompt_is_refused_by_name(probe_tokenizer):
    with pytest.raises(ValueError, match="keys: 8 pass keys per prompt; allowed 1 to 7"):
        multikey.prompt_ids(probe_tokenizer, LENGTH, list(range(10000, 10008)))
    with pytest.raises(ValueError, match="length=200: too short for 3 needles"):
        multikey.prompt_ids(probe_tokenizer, 200, [11111, 22222, 33333])


def test_accuracy_counts_hits_and_names_each_miss(probe_tokenizer, monkeypatch):
    answers = iter(["12 345", " 99999.", "abc"])
    monkeypatch.setattr(multikey, "passkeys", lambda count, seed: [12345, 99999, 55555][:count])
    monkeypatch.setattr(
        multikey,
        "probe_prompts",
        lambda m, t, ids, keys, where, b: [(d, k, next(answers)) for d, k in zip(where[0], keys[0], strict=True)],
    )
    result = multikey.multikey_accuracy(None, probe_tokenizer, LENGTH, prompts=1, keys=3, progress=False)
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
