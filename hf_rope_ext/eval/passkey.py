"""Passkey retrieval in the standard format (Mohtashami & Jaggi 2023; Chen et al. 2023).

A prompt is ``[task][filler ... needle ... filler][question]`` followed by the answer, exactly ``length`` tokens in
all; the needle ("The pass key is N. Remember it. N is the pass key.") sits at a whole-sentence boundary of the
filler, the one nearest the requested depth (0 = right after the task line, 1 = right before the question).
Scored two ways: teacher-forced (every answer token is the argmax given the true prefix, one forward pass) and
greedy generation (``model.generate``, which exercises the KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..util.progress import bar
from ..util.quiet import generating_past_max_length
from .data import encode
from .intervals import score

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = (" The grass is green.", " The sky is blue.", " The sun is yellow.", " Here we go.", " There and back again.")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"


@dataclass(frozen=True)
class NeedleSample:
    input_ids: torch.Tensor  # (length,): prompt tokens then answer tokens
    prompt_length: int  # tokens before the answer
    needle_start: int  # index of the needle's first token
    needle_length: int
    depth: float  # where the needle actually sits: filler tokens before it / all filler tokens

    @property
    def answer(self) -> torch.Tensor:
        return self.input_ids[self.prompt_length :]


def tokenize_pieces(tokenizer, key: int, sentences=FILLER, task=TASK, question=QUESTION):
    """(task ids with BOS, [sentence ids], needle ids, question ids, answer ids) for passkey ``key``."""
    piece = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return (
        encode(tokenizer, task).tolist(),
        [piece(s) for s in sentences],
        piece(NEEDLE.format(key=key)),
        piece(question),
        piece(ANSWER.format(key=key)),
    )


def filler_tokens(sentences: list[list[int]], count: int) -> tuple[list[int], list[int]]:
    """The last ``count`` tokens of the sentences repeated in order (only the first sentence is cut short), and the
    boundaries: 0 and every sentence end, as offsets into those tokens (the last one is ``count``)."""
    if count <= 0:
        return [], [0]
    cycle = [tok for s in sentences for tok in s]
    cycles = count // len(cycle) + 1
    offset = cycles * len(cycle) - count  # tokens dropped from the front
    ends = torch.tensor([len(s) for s in sentences]).cumsum(0)  # sentence ends within one cycle
    all_ends = torch.arange(cycles)[:, None] * len(cycle) + ends[None]  # (cycles, sentences)
    bounds = [0] + [e - offset for e in all_ends.flatten().tolist() if e > offset]
    return (cycle * cycles)[offset:], bounds


def compose(pieces, length: int, depth: float) -> NeedleSample:
    """Place the needle at the sentence boundary nearest ``depth`` and fill to exactly ``length`` tokens."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth!r}: expected a number in [0, 1]")
    task, sentences, needle, question, answer = pieces
    fixed = len(task) + len(needle) + len(question) + len(answer)
    if length < fixed:
        raise ValueError(f"length={length}: a passkey prompt needs at least {fixed} tokens with this tokenizer")
    filler, bounds = filler_tokens(sentences, length - fixed)
    cut = min(bounds, key=lambda b: (abs(b - depth * len(filler)), b))
    ids = task + filler[:cut] + needle + filler[cut:] + question + answer
    return NeedleSample(
        input_ids=torch.tensor(ids, dtype=torch.long),
        prompt_length=length - len(answer),
        needle_start=len(task) + cut,
        needle_length=len(needle),
        depth=cut / len(filler) if filler else 0.0,
    )


def passkeys(count: int, seed: int = 0) -> list[int]:
    """``count`` seeded five-digit pass keys."""
    return torch.randint(10000, 100000, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def spread_depths(n: int) -> list[float]:
    """``n`` depths uniformly spread over [0, 1] (0.5 alone when n == 1)."""
    return [0.5] if n == 1 else torch.linspace(0, 1, n).tolist()


@torch.no_grad()
def teacher_forced_hit(model, sample: NeedleSample, predict=None) -> bool:
    """Is every answer token the argmax given the true prefix? One forward pass over the whole sample (through
    ``predict(model, ids)`` -> each next token's argmax (n - 1,), where given)."""
    if predict is not None:
        return bool((predict(model, sample.input_ids)[sample.prompt_length - 1 :].cpu() == sample.answer).all())
    device = next(model.parameters()).device
    logits = model(input_ids=sample.input_ids[None].to(device), use_cache=False).logits[0]  # (length, vocab)
    predicted = logits[sample.prompt_length - 1 : -1].argmax(-1)  # predictions for the answer positions
    return bool((predicted.cpu() == sample.answer).all())


@torch.no_grad()
def generation_hit(model, sample: NeedleSample) -> bool:
    """Does greedy generation from the prompt reproduce the answer tokens?"""
    device = next(model.parameters()).device
    prompt = sample.input_ids[None, : sample.prompt_length].to(device)
    n = len(sample.answer)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    with generating_past_max_length():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=pad,
        )
    return torch.equal(out[0, sample.prompt_length :].cpu(), sample.answer)


def passkey_accuracy(
    model,
    tokenizer,
    length: int,
    depths: int = 5,
    trials: int = 1,
    generate=True,
    seed=0,
    sentences=FILLER,
    progress=True,
    predict=None,
) -> dict:
    """Accuracy over ``depths`` uniformly spread needle depths x ``trials`` pass keys at one ``length``, overall
    (``passkey_accuracy``, teacher-forced, with ``passkey_hits`` of ``passkey_samples`` and the Wilson 95%
    ``passkey_interval``; the same for generation) and per depth (``passkey_by_depth``: [[depth, accuracy], ...])."""
    keys = passkeys(depths * trials, seed)  # a different key for every sample
    grid = [(depth, keys[i * trials + t]) for i, depth in enumerate(spread_depths(depths)) for t in range(trials)]
    forced, generated = [], []
    for depth, key in bar(grid, desc=f"passkey @{length}", enabled=progress):
        sample = compose(tokenize_pieces(tokenizer, key, sentences), length, depth)
        forced.append(teacher_forced_hit(model, sample, predict))
        if generate:
            generated.append(generation_hit(model, sample))
    result = {
        "passkey_accuracy": sum(forced) / len(forced),
        "passkey_samples": len(forced),
        "passkey_hits": sum(forced),
        "passkey_interval": score(sum(forced), len(forced))["interval"],
        "passkey_by_depth": by_depth([depth for depth, _ in grid], forced),
    }
    if generate:
        result["passkey_generation_accuracy"] = sum(generated) / len(generated)
        result["passkey_generation_hits"] = sum(generated)
        result["passkey_generation_interval"] = score(sum(generated), len(generated))["interval"]
    return result


def by_depth(depths: list[float], hits: list[bool]) -> list[list[float]]:
    """[[requested depth, accuracy over its trials], ...] in order of depth."""
    levels = sorted(set(depths))
    return [[d, sum(h for x, h in zip(depths, hits, strict=True) if x == d) / depths.count(d)] for d in levels]
