"""Retrieval rows for fine-tuning: facts planted in a row of real training text, questions about every one of them at
the end, and a loss on the answers only.

A row of ``n`` tokens becomes ``[text ... fact ... text ... fact ... text][question answer]...``, still ``n`` tokens:
the text is the row's own (cut short to make room), each fact ("The vault code of the old mill is 48213.") sits at
a line or sentence end of it, at a random depth, and the questions follow in a random order, each followed by its
answer. Facts name several kinds of value (numbers, words, letter codes) about several places, so the model must
tell the planted facts apart by what they are about and cannot learn one answer format. A share of the rows
(``same_kind``) plants facts all of one kind (every one a vault code, say), as a multi-key probe does, so that only
the place each fact names tells them apart. The wordings are this module's own and differ from the evaluation
probes' (``eval.passkey``, ``eval.multikey``), so a probe measures retrieval, not a memorized sentence. ``labels``
is -100 everywhere except on the answers' tokens.

Everything is drawn from ``random.Random(seed, row index)``: the same seed gives the same rows on every process.
"""

from __future__ import annotations

import random
import string

IGNORE = -100  # the label of a token that is not scored (transformers' and torch's cross-entropy ignore index)
THINGS = (
    "old mill", "north tower", "harbour office", "library vault", "night train", "radio room", "glass house",
    "stone bridge", "copper mine", "winter garden", "clock shop", "fire station", "salt warehouse", "river lock",
)  # fmt: skip
WORDS = (
    "amber", "falcon", "marble", "juniper", "lantern", "orchid", "pepper", "quartz", "saffron", "thistle", "velvet",
    "walnut", "cobalt", "meadow", "harbor", "ember",
)  # fmt: skip
KINDS = {
    "vault code": lambda rng: str(rng.randint(10000, 99999)),
    "ticket number": lambda rng: str(rng.randint(100, 9999)),
    "secret word": lambda rng: rng.choice(WORDS),
    "access tag": lambda rng: "".join(rng.choice(string.ascii_uppercase) for _ in range(3)) + str(rng.randint(1, 9)),
}
FACTS = (
    " The {kind} of the {thing} is {value}.",
    " Note this down: the {thing} has the {kind} {value}.",
    " For the {thing}, use the {kind} {value}; nothing else opens it.",
)
QUESTIONS = ("\nQuestion: what is the {kind} of the {thing}? Answer:", "\nWhich {kind} belongs to the {thing}? It is")


def plant(rng: random.Random, keys: int, same_kind: float = 0.0) -> list[tuple[str, str, str]]:
    """``keys`` facts (kind, thing, value), each about another thing, values distinct; with probability ``same_kind``
    every fact is of one kind (no draw is made for it when ``same_kind`` is 0, so rows made before it stay as they
    were)."""
    things = rng.sample(THINGS, keys)
    one_kind = rng.choice(sorted(KINDS)) if same_kind and rng.random() < same_kind else None
    facts, values = [], set()
    for thing in things:
        kind = one_kind or rng.choice(sorted(KINDS))
        value = KINDS[kind](rng)
        while value in values:
            value = KINDS[kind](rng)
        values.add(value)
        facts.append((kind, thing, value))
    return facts


def cut_points(tokenizer, text_ids: list[int]) -> list[int]:
    """Indices i (1 <= i < len) where a fact may go before text_ids[i]: after a token ending a line or a sentence
    (every index when the text has none)."""
    ends = [i + 1 for i, t in enumerate(text_ids[:-1]) if tokenizer.decode([t]).rstrip(" ").endswith(("\n", "."))]
    return ends or list(range(1, len(text_ids)))


def retrieval_row(
    tokenizer, row: list[int], rng: random.Random, keys: int, same_kind: float = 0.0
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of ``len(row)`` tokens: ``keys`` facts planted in the row's text (``plant``), then every
    question with its answer; labels are the answer tokens' ids and IGNORE elsewhere."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    facts = plant(rng, keys, same_kind)
    fact_ids = [encode(rng.choice(FACTS).format(kind=k, thing=t, value=v)) for k, t, v in facts]
    asked = rng.sample(facts, keys)
    qa = [(encode(rng.choice(QUESTIONS).format(kind=k, thing=t)), encode(f" {v}")) for k, t, v in asked]
    room = len(row) - sum(map(len, fact_ids)) - sum(len(q) + len(a) for q, a in qa)
    if room < 2 * keys:
        raise ValueError(
            f"retrieval_keys={keys}: a row of {len(row)} tokens is too short for {keys} facts and their questions; "
            "plant fewer facts or train on longer rows"
        )
    text = row[:room]
    points = cut_points(tokenizer, text)  # a text with fewer places than facts: facts share places
    cuts = sorted(rng.sample(points, keys) if len(points) >= keys else rng.choices(points, k=keys))
    ids, last = [], 0
    for cut, fact in zip(cuts, fact_ids, strict=True):
        ids += text[last:cut] + fact
        last = cut
    ids += text[last:]
    labels = [IGNORE] * len(ids)
    for question, answer in qa:
        ids += question + answer
        labels += [IGNORE] * len(question) + answer
    return ids, labels


def check_retrieval(fraction: float, keys: int, same_kind: float = 0.0) -> None:
    """The shares of retrieval rows and of one-kind rows within [0, 1] and the facts per row within
    [1, len(THINGS)], else a named error."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"retrieval={fraction!r}: the share of retrieval rows must be within [0, 1]")
    if not 0.0 <= same_kind <= 1.0:
        raise ValueError(f"retrieval_same_kind={same_kind!r}: the share of one-kind rows must be within [0, 1]")
    if not 1 <= keys <= len(THINGS):
        raise ValueError(f"retrieval_keys={keys!r}: facts per retrieval row must be within [1, {len(THINGS)}]")


def mix_retrieval(rows, tokenizer, fraction: float, keys: int, seed: int, same_kind: float = 0.0):
    """A ``datasets.Dataset`` of rows (column ``input_ids``) with a ``labels`` column: a share ``fraction`` of the
    rows (drawn per row from the seed) become retrieval rows (a share ``same_kind`` of those with facts of one kind),
    the others stay language-model text scored on every token (labels = input_ids)."""
    check_retrieval(fraction, keys, same_kind)

    def build(batch, indices):
        out = {"input_ids": [], "labels": []}
        for ids, index in zip(batch["input_ids"], indices, strict=True):
            rng = random.Random(seed * 1_000_003 + index)
            planted = rng.random() < fraction
            ids, labels = retrieval_row(tokenizer, list(ids), rng, keys, same_kind) if planted else (ids, ids)
            out["input_ids"].append(ids)
            out["labels"].append(labels)
        return out

    return rows.map(build, batched=True, with_indices=True, desc="planting retrieval facts")
