"""Retrieval rows for fine-tuning (``train.retrieval``), checked on token ids with a byte-level tokenizer (one token
per byte, so positions in the text are positions in the ids): exact length, facts inside the row's own text, every
fact asked once, labels only on the answers, the same rows for the same seed, a share of the rows as asked."""

from __future__ import annotations

import random

import pytest
from datasets import Dataset
from transformers import ByT5Tokenizer

from hf_rope_ext.train.retrieval import FACTS, IGNORE, KINDS, QUESTIONS, THINGS, mix_retrieval, plant, retrieval_row

TEXT = "".join(f"Line {i} of the manual says nothing at all about vaults.\n" for i in range(40))


@pytest.fixture(scope="module")
def tokenizer():
    return ByT5Tokenizer()


def row_of(tokenizer, length=1200):
    return tokenizer(TEXT, add_special_tokens=False)["input_ids"][:length]


def answers(tokenizer, ids, labels) -> list[str]:
    """The labelled spans, decoded, in order."""
    spans, current = [], []
    for token, label in zip(ids, labels, strict=True):
        if label != IGNORE:
            assert label == token  # a labelled token is scored against itself (the loss shifts)
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    return spans + ([tokenizer.decode(current)] if current else [])


@pytest.mark.parametrize("keys", [1, 3, 5])
def test_a_row_keeps_its_length_plants_each_fact_once_and_labels_only_the_answers(tokenizer, keys):
    row = row_of(tokenizer)
    ids, labels = retrieval_row(tokenizer, row, random.Random(7), keys)
    assert len(ids) == len(labels) == len(row)
    facts = plant(random.Random(7), keys)  # the row's first draws
    first_question = min(i for i, label in enumerate(labels) if label != IGNORE)
    body = tokenizer.decode(ids[:first_question])
    body = body[: max(body.rfind("\nQuestion:"), body.rfind("\nWhich"))]
    for kind, thing, value in facts:  # each fact once, in one of the wordings, then removed
        written = [
            f.format(kind=kind, thing=thing, value=value)
            for f in FACTS
            if f.format(kind=kind, thing=thing, value=value) in body
        ]
        assert len(written) == 1 and body.count(written[0]) == 1, (kind, thing, value)
        body = body.replace(written[0], "")
    assert tokenizer.decode(row).startswith(body)  # what is left is the row's own text, cut short
    spans = answers(tokenizer, ids, labels)
    assert sorted(s.strip() for s in spans) == sorted(v for _, _, v in facts)
    assert sum(label != IGNORE for label in labels) == sum(
        len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in spans
    )
    assert tokenizer.decode(ids).endswith(spans[-1])  # the last answer ends the row


def test_facts_name_distinct_things_and_values_of_several_kinds(tokenizer):
    seen_kinds = set()
    for seed in range(30):
        ids, _ = retrieval_row(tokenizer, row_of(tokenizer), random.Random(seed), 4)
        text = tokenizer.decode(ids)
        things = [t for t in THINGS if text.count(f"the {t}") >= 2]  # planted and asked
        assert len(things) == 4
        seen_kinds |= {k for k in KINDS if k in text}
    assert seen_kinds == set(KINDS)


def test_a_share_of_rows_plants_facts_of_one_kind_and_none_by_default(tokenizer):
    """``same_kind=1``: every row's facts share one kind (all kinds seen over the rows); ``same_kind=0``: the rows are
    those made before the option (no extra draw), and some rows mix kinds; ``0.5``: both kinds of row."""

    def kinds_of(seed, same_kind):
        return {kind for kind, _, _ in plant(random.Random(seed), 4, same_kind)}

    assert all(len(kinds_of(seed, 1.0)) == 1 for seed in range(40))
    assert set().union(*(kinds_of(seed, 1.0) for seed in range(40))) == set(KINDS)
    assert sum(len(kinds_of(seed, 0.0)) == 1 for seed in range(40)) < 10
    halves = [len(kinds_of(seed, 0.5)) == 1 for seed in range(40)]
    assert 10 <= sum(halves) <= 35
    old = retrieval_row(tokenizer, row_of(tokenizer), random.Random(3), 3)
    assert retrieval_row(tokenizer, row_of(tokenizer), random.Random(3), 3, 0.0) == old
    ids, labels = retrieval_row(tokenizer, row_of(tokenizer), random.Random(3), 4, 1.0)
    text = tokenizer.decode(ids)
    assert sum(kind in text for kind in KINDS) == 1  # one kind named, in facts and questions
    assert len(answers(tokenizer, ids, labels)) == 4


def test_the_same_seed_gives_the_same_rows_and_another_seed_others(tokenizer):
    rows = Dataset.from_dict({"input_ids": [row_of(tokenizer)] * 12})
    first = mix_retrieval(rows, tokenizer, 0.5, 3, seed=1)
    again = mix_retrieval(rows, tokenizer, 0.5, 3, seed=1)
    other = mix_retrieval(rows, tokenizer, 0.5, 3, seed=2)
    assert first["input_ids"] == again["input_ids"] and first["labels"] == again["labels"]
    assert first["input_ids"] != other["input_ids"]


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_the_share_of_retrieval_rows_and_plain_rows_scored_on_every_token(tokenizer, fraction):
    rows = Dataset.from_dict({"input_ids": [row_of(tokenizer)] * 40})
    mixed = mix_retrieval(rows, tokenizer, fraction, 2, seed=0)
    planted = [IGNORE in labels for labels in mixed["labels"]]
    plain = [
        (ids, labels) for ids, labels, p in zip(mixed["input_ids"], mixed["labels"], planted, strict=True) if not p
    ]
    assert all(ids == labels == row_of(tokenizer) for ids, labels in plain)
    assert sum(planted) == {0.0: 0, 1.0: 40}.get(fraction, sum(planted))
    if fraction == 0.5:
        assert 10 <= sum(planted) <= 30


def test_bad_settings_and_rows_too_short_are_named(tokenizer):
    rows = Dataset.from_dict({"input_ids": [row_of(tokenizer)]})
    with pytest.raises(ValueError, match=r"retrieval=1\.5"):
        mix_retrieval(rows, tokenizer, 1.5, 3, seed=0)
    with pytest.raises(ValueError, match=r"retrieval_keys=0"):
        mix_retrieval(rows, tokenizer, 0.5, 0, seed=0)
    with pytest.raises(ValueError, match=r"retrieval_same_kind=2\.0: the share of one-kind rows"):
        mix_retrieval(rows, tokenizer, 0.5, 3, seed=0, same_kind=2.0)
    with pytest.raises(ValueError, match="too short"):
        retrieval_row(tokenizer, row_of(tokenizer, 60), random.Random(0), 3)


def test_the_wordings_are_not_the_probes(tokenizer):
    from hf_rope_ext.eval import multikey, passkey

    probes = {passkey.NEEDLE, passkey.QUESTION, multikey.NEEDLE, multikey.QUESTION}
    assert probes.isdisjoint(FACTS + QUESTIONS)
    assert not any("pass key" in text for text in FACTS + QUESTIONS)


def test_finetune_scores_only_the_answers_of_retrieval_rows(tmp_path, monkeypatch):
    """``finetune(retrieval=1.0)``: every micro-batch reaches the loss with labels that score the answers alone, and
    the loss is the cross-entropy of exactly those tokens."""
    import torch
    import torch.nn.functional as F
    from conftest import save_byte_llama

    from hf_rope_ext.train import FinetuneConfig, finetune, loop

    base = save_byte_llama(tmp_path / "base", 32)
    (tmp_path / "data.txt").write_text(TEXT * 4)
    seen, stock = [], loop.forward_loss

    def forward_loss(accelerator, model, input_ids, positions, labels=None, sequence=None):
        loss = stock(accelerator, model, input_ids, positions, labels, sequence)
        with torch.no_grad():
            logits = model(input_ids=input_ids, position_ids=positions).logits[:, :-1].float()
        scored = labels[:, 1:] != IGNORE
        expected = F.cross_entropy(logits[scored], input_ids[:, 1:][scored])
        seen.append((labels.clone(), input_ids.clone(), float(loss.detach()), float(expected)))
        return loss

    monkeypatch.setattr(loop, "forward_loss", forward_loss)
    config = FinetuneConfig(
        model=str(base), out=str(tmp_path / "out"), rope_type="ntk_by_parts", length=512, max_steps=2,
        data=[str(tmp_path / "data.txt")], batch_size=2, retrieval=1.0, retrieval_keys=2,
    )  # fmt: skip
    finetune(config)
    assert len(seen) == 2
    for labels, input_ids, loss, expected in seen:
        scored = labels != IGNORE
        assert 0 < int(scored.sum()) < labels.numel() // 4  # the answers only
        assert torch.equal(labels[scored], input_ids[scored])
        assert loss == pytest.approx(expected, rel=1e-4)
