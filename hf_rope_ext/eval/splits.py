"""The pass-key probes' two splits: ``dev`` for choosing methods and parameters, ``test`` for reporting.

A probe prompt is a task line, filler sentences and one needle per key ("... the pass key of the red door is 48213
..."), followed later by one question per needle; ``classic`` prompts hold one key, ``multikey`` prompts three, whose
needles name different objects so that only what each names tells them apart.

- ``dev`` is the probe every earlier figure of the package used: seed 0, five-digit keys, the filler and wordings of
  ``eval.passkey`` / ``eval.multikey``, needles on a regular grid of depths ((i + (p + 0.5) / P) / k for needle i of
  k in prompt p of P), each prompt exactly ``length`` tokens (the first filler sentence cut short).
- ``test`` shares none of that: its own seed, keys of 4 to 7 digits, its own filler sentences, task line, objects
  and three needle/question wordings (drawn per needle), depths drawn at random (a needle of k lands uniformly
  inside its k-th of the filler), whole filler sentences only (a prompt is ``length`` tokens or up to one sentence
  fewer: ``Prompt.ids`` says how many). Prompt p of the test split depends on (length, kind, p) alone, not on how
  many prompts are asked, so a run can be extended or resumed.

Two variants of the test split serve as controls of a long-context figure:

- **paired** (``seeds_of``): a prompt at a shorter length drawn from the seed of the prompt with the same index at
  ``seeds_of`` tokens: the same keys, objects, wordings and depth fractions, less filler, so a 1x and a 4x run pair
  prompt by prompt (``test/k1/8192/3/of32768`` is ``test/k1/32768/3`` told in 8192 tokens).
- **chat** (``chat``): the prompt as the user turn of the model's own chat template and each question's answer stem
  opening the assistant turn (``eval.chat_form``); the template's tokens count towards ``length``.

Neither split shares a sentence with the retrieval rows the package trains on (``train.retrieval``; tested).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import chat_form
from .multikey import OBJECTS, QUESTION, depths, prompt_ids
from .passkey import passkeys

SPLITS = ("dev", "test")
KINDS = {"classic": 1, "multikey": 3}  # keys per prompt

TEST_SEED = 7919
TEST_TASK = (
    "Below is a long story about a small harbour town. A few short notes with numbers are hidden in it. "
    "Read all of it, because you will be asked about the numbers at the end."
)
TEST_FILLER = (
    " The morning ferry left the pier a little after seven.",
    " Gulls circled above the fish stalls and argued over scraps.",
    " Rain was expected later, so the painters worked quickly.",
    " The baker stacked warm loaves in the front window.",
    " Two children ran along the sand with a yellow kite.",
    " In the square, the church clock struck the hour.",
    " A farmer walked his cart slowly up the cobbled hill.",
    " The reading room opened its doors at ten.",
    " Lanterns swayed gently in the evening breeze.",
    " A grey cat slept on the warm steps of the chapel.",
    " After the spring storms the stream ran high and brown.",
    " Somebody near the boatyard was whistling an old song.",
    " The postwoman sorted letters into neat little piles.",
    " Thin smoke rose from every chimney in the village.",
    " Across the road a school bell rang for lunch.",
    " At dusk the traders folded their awnings and went home.",
)
TEST_OBJECTS = ("cellar door", "tin box", "garden shed", "east window", "oak cabinet", "music room", "back gate")
TEST_WORDINGS = (  # (needle, question): the answer follows the question
    (" Note: the code for the {name} is {key}.", " What is the code for the {name}? The code for the {name} is"),
    (" Write this down: {key} opens the {name}.", " Which number opens the {name}? The number that opens it is"),
    (
        " The lock on the {name} was set to {key} last spring.",
        " To which number was the lock on the {name} set? It was set to",
    ),
)
TEST_DIGITS = (4, 7)  # key lengths, inclusive


@dataclass(frozen=True)
class Needle:
    depth: float  # where it sits: filler tokens before it / all filler tokens
    key: int
    question: str  # the text fed after the prompt; the key's digits should follow it


@dataclass(frozen=True)
class Prompt:
    prompt_id: str  # split, kind, length and index: what a resumed run matches on
    ids: list[int]  # task, filler and needles; the questions are asked after them, one at a time
    needles: tuple[Needle, ...]  # in the order they are planted


def check(split: str, kind: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"--split {split!r}: allowed {', '.join(SPLITS)}")
    if kind not in KINDS:
        raise ValueError(f"--probes {kind!r}: allowed {', '.join(KINDS)}")


def prompts(
    tokenizer, split: str, kind: str, length: int, count: int, seeds_of: int | None = None, chat: bool = False
) -> list[Prompt]:
    """The first ``count`` prompts of ``kind`` ("classic" or "multikey") of ``split`` at ``length`` tokens; on the
    test split, drawn from the seeds of the prompts at ``seeds_of`` tokens and/or in the model's ``chat`` template."""
    check(split, kind)
    if split == "dev" and (seeds_of is not None or chat):
        raise ValueError("paired prompts (seeds_of) and the chat template are variants of the test split only")
    if split == "dev":
        return [dev_prompt(tokenizer, KINDS[kind], length, p, count) for p in range(count)]
    return [test_prompt(tokenizer, KINDS[kind], length, p, count, seeds_of, chat) for p in range(count)]


def dev_prompt(tokenizer, k: int, length: int, p: int, count: int) -> Prompt:
    """Prompt ``p`` of ``count`` with ``k`` keys: keys ``passkeys(count * k, seed 0)`` in order, depths on the regular
    grid, objects in ``multikey.OBJECTS`` order; exactly ``length`` tokens (``multikey.prompt_ids``)."""
    keys = passkeys(count * k, 0)[p * k : (p + 1) * k]
    where = depths(k, p, count)
    asked = [Needle(d, key, QUESTION.format(name=name)) for d, key, name in zip(where, keys, OBJECTS, strict=False)]
    return Prompt(f"dev/k{k}/{length}/{p}of{count}", prompt_ids(tokenizer, length, keys, where), tuple(asked))


def interleave(task: list[int], filler: list[int], cuts: list[int], needles: list[list[int]]) -> list[int]:
    """``task``, then ``filler`` with needle i inserted before filler token ``cuts[i]`` (cuts in increasing order)."""
    ids, last = list(task), 0
    for cut, needle in zip(cuts, needles, strict=True):
        ids += filler[last:cut] + needle
        last = cut
    return ids + filler[last:]


def test_prompt(
    tokenizer, k: int, length: int, p: int, count: int = 0, seeds_of: int | None = None, chat: bool = False
) -> Prompt:
    """Prompt ``p`` with ``k`` keys of the test split (``count`` is not used: a prompt does not depend on how many are
    asked); its keys, objects, wordings and depth fractions drawn from the seed of prompt ``p`` at ``seeds_of``
    tokens (default ``length``), the whole in the model's chat template where ``chat``."""
    rng = random.Random(f"{TEST_SEED}/k{k}/{seeds_of or length}/{p}")
    keys = [rng.randint(10 ** (n - 1), 10**n - 1) for n in (rng.randint(*TEST_DIGITS) for _ in range(k))]
    names = rng.sample(TEST_OBJECTS, k)
    wordings = [rng.choice(TEST_WORDINGS) for _ in range(k)]
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    opening = chat_form.user_turn(tokenizer)[0] if chat else [tokenizer.bos_token_id]
    task = [t for t in opening if t is not None] + encode(TEST_TASK)
    planted = [encode(w[0].format(name=n, key=key)) for w, n, key in zip(wordings, names, keys, strict=True)]
    filler, bounds = whole_sentences([encode(s) for s in TEST_FILLER], length - len(task) - sum(map(len, planted)))
    if len(bounds) < k + 1:
        raise ValueError(f"length={length}: too short for {k} needles with this tokenizer")
    where = [(i + rng.uniform(0.02, 0.98)) / k for i in range(k)]  # needle i inside the i-th k-th of the filler
    cuts = [min(bounds, key=lambda b, d=d: abs(b - d * len(filler))) for d in where]
    depths = [cut / len(filler) for cut in cuts]
    questions = [w[1].format(name=n) for w, n in zip(wordings, names, strict=True)]
    questions = [chat_form.question(tokenizer, q) for q in questions] if chat else questions
    asked = [Needle(d, key, q) for d, key, q in zip(depths, keys, questions, strict=True)]
    return Prompt(test_id(k, length, p, seeds_of, chat), interleave(task, filler, cuts, planted), tuple(asked))


def test_id(k: int, length: int, p: int, seeds_of: int | None = None, chat: bool = False) -> str:
    """A test prompt's id: ``test/k1/8192/3``, ``.../of32768`` where drawn from another length's seed, ``/chat``."""
    paired = f"/of{seeds_of}" if seeds_of not in (None, length) else ""
    return f"test/k{k}/{length}/{p}{paired}" + ("/chat" if chat else "")


def whole_sentences(sentences: list[list[int]], room: int) -> tuple[list[int], list[int]]:
    """The sentences repeated in order from the first, as many whole ones as fit in ``room`` tokens, and their
    boundaries (0 and every sentence end, as offsets into those tokens). Every prompt of a split starts with the same
    filler, so prompts read one after another share it in the cache up to their first needle."""
    ids, bounds = [], [0]
    while len(ids) + len(sentence := sentences[(len(bounds) - 1) % len(sentences)]) <= room:
        ids += sentence
        bounds.append(len(ids))
    return ids, bounds
