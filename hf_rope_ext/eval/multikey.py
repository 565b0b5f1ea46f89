"""Pass keys scored by greedy generation, several probes per long forward pass.

A prompt of ``length`` tokens is the passkey task line and filler sentences (``passkey``) with ``keys`` needles
"The pass key of the red door is N. Remember it. N is the pass key of the red door." at depths spread over the
filler, each needle naming another object (``OBJECTS``). The prompt is read once into a KV cache; each question
("What is the pass key of the red door? The pass key of the red door is") is then fed after it, the answer generated
greedily, and the cache cropped back to the prompt, so one long forward pass scores ``keys`` probes. A probe is a
hit when the generated text starts with the key's digits.

The needles of one prompt compete: SmolLM2-135M answers 9/9 probes at 8k tokens with 3 keys per prompt, 3/4 with
4 and 2/6 with 6 (it repeats the latest key), so the default is 3. Prompt ``p`` of ``P`` shifts its depths by
``p / P`` of a slot, so that across prompts the needles cover the filler evenly.
Attention-level types get the package's rotating cache (``rope_cache``), the others transformers' own.

The prompts of a cell are read in order into one cache, and what a prompt shares with the next (the task line and
the filler before the first needle where they differ) is kept and read once: the classic probe's 10 one-key prompts
at depths 0.05 to 0.95 read about 6.4 prompts' worth of tokens instead of 10. Reading in pieces gives what one forward
gives (the cache is exact); not where the frequencies follow the length read so far (transformers' ``dynamic`` and
``longrope``, the package's dynamic types), which read every prompt from scratch as before.
"""

from __future__ import annotations

import torch

from ..types import registry
from ..util.progress import bar
from .intervals import score
from .passkey import FILLER, TASK, by_depth, filler_tokens, passkeys

OBJECTS = ("red door", "blue box", "green gate", "yellow chest", "white safe", "black drawer", "grey locker")
NEEDLE = " The pass key of the {name} is {key}. Remember it. {key} is the pass key of the {name}."
QUESTION = " What is the pass key of the {name}? The pass key of the {name} is"
DEFAULT_KEYS = 3
ANSWER_TOKENS = 6  # SmolLM2's tokenizer spells five digits as five tokens, after a space


def depths(keys: int, prompt: int = 0, prompts: int = 1) -> list[float]:
    """Needle depths in (0, 1) of prompt ``prompt`` of ``prompts``: slot i of ``keys`` at (i + (p + 0.5) / P) / keys."""
    return [(i + (prompt + 0.5) / prompts) / keys for i in range(keys)]


def prompt_ids(tokenizer, length: int, keys: list[int], where: list[float] | None = None) -> list[int]:
    """Task, filler and one needle per key (objects in OBJECTS order, at depths ``where``, default
    ``depths(len(keys))``, each at the nearest sentence boundary): exactly ``length`` token ids."""
    if not 1 <= len(keys) <= len(OBJECTS):
        raise ValueError(f"keys: {len(keys)} pass keys per prompt; allowed 1 to {len(OBJECTS)}")
    piece = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    task = bos + piece(TASK)
    needles = [piece(NEEDLE.format(name=name, key=key)) for name, key in zip(OBJECTS, keys, strict=False)]
    count = length - len(task) - sum(map(len, needles))
    if count < len(keys) * 8:
        raise ValueError(f"length={length}: too short for {len(keys)} needles with this tokenizer")
    filler, bounds = filler_tokens([piece(s) for s in FILLER], count)
    cuts = [min(bounds, key=lambda b, d=d: abs(b - d * count)) for d in (where or depths(len(keys)))]
    ids, last = list(task), 0
    for cut, needle in zip(cuts, needles, strict=True):
        ids += filler[last:cut] + needle
        last = cut
    return ids + filler[last:]


@torch.no_grad()
def ask(model, tokenizer, cache, keyword: str, question: str, answer_tokens: int = ANSWER_TOKENS) -> str:
    """Feed ``question`` after what ``cache`` holds and generate ``answer_tokens`` tokens greedily; returns the text."""
    device = next(model.parameters()).device
    ids = tokenizer(question, add_special_tokens=False)["input_ids"]
    logits = model(torch.tensor([ids], device=device), logits_to_keep=1, **{keyword: cache}).logits
    out = [int(logits[0, -1].argmax())]
    while len(out) < answer_tokens:  # the last token needs no forward of its own
        token = torch.tensor([out[-1:]], device=device)  # (1, 1)
        out.append(int(model(token, logits_to_keep=1, **{keyword: cache}).logits[0, -1].argmax()))
    return tokenizer.decode(out)


def reads_in_pieces(model) -> bool:
    """Whether ``model`` reading a prompt in pieces into a cache computes what one forward over it computes: not
    where the frequencies follow the length read so far (``registry.follows_length``)."""
    config = model.config.get_text_config(decoder=True)
    params = getattr(config, "rope_parameters", None) or {}
    layers = [params] if "rope_type" in params else [p for p in params.values() if isinstance(p, dict)]
    names = [p.get("rope_type", "default") for p in layers]
    return not any(registry.follows_length(n) for n in names)


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading token ids ``a`` and ``b`` have in common."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@torch.no_grad()
def read_prompts(model, tokenizer, prompts: list[list[int]], questions: list[list[tuple[str, int]]], bar_of, done=None):
    """The answers to each prompt's questions ((text, answer tokens) pairs), prompt by prompt, each question asked
    after its prompt alone. One cache holds the tokens a prompt shares with the next between prompts (where
    ``reads_in_pieces``); each prompt's remaining tokens are read in one forward, every question asked after them and
    cropped away. ``done(i, answers)`` is called after prompt i (a resumable run records it there)."""
    import hf_rope_ext  # the package's public names (cache_keyword, rope_cache) load on first use

    keyword, device = hf_rope_ext.cache_keyword(model), next(model.parameters()).device
    pieces = reads_in_pieces(model)
    pairs = zip(prompts, prompts[1:], strict=False)  # (prompt, the next one)
    keep = [min(shared_prefix(a, b), len(a) - 1, len(b) - 1) if pieces else 0 for a, b in pairs] + [0]  # one token read
    answers, held, cache = [], 0, None
    for i in bar_of(range(len(prompts))):
        ids = prompts[i]  # the cache holds ids[:held], what this prompt shares with the one before
        cache = hf_rope_ext.rope_cache(model) if held == 0 else cache
        model(torch.tensor([ids[held:]], device=device), logits_to_keep=1, **{keyword: cache})
        answers.append([])
        for question, tokens in questions[i]:
            answers[-1].append(ask(model, tokenizer, cache, keyword, question, tokens))
            crop_to(cache, len(ids))
        if done is not None:
            done(i, answers[-1])
        held = keep[i]  # what it shares with the next
        crop_to(cache, held)
    return answers


def probe_prompts(model, tokenizer, prompts: list[list[int]], keys: list[list[int]], where: list[list[float]], bar_of):
    """(depth, key, generated text) for each needle of each prompt (token ids, needles named in OBJECTS order), in
    order (``read_prompts`` with this module's question)."""
    questions = [[(QUESTION.format(name=name), ANSWER_TOKENS) for name in OBJECTS[: len(k)]] for k in keys]
    answers = read_prompts(model, tokenizer, prompts, questions, bar_of)
    triples = zip(where, keys, answers, strict=True)  # per prompt: depths, keys, answers
    return [(d, k, text) for ws, ks, texts in triples for d, k, text in zip(ws, ks, texts, strict=True)]


def crop_to(cache, tokens: int):
    """``cache`` cropped to its first ``tokens`` rows (5.24's ``crop`` takes only a negative count); returns it."""
    if cache.get_seq_length() > tokens:
        cache.crop(tokens - cache.get_seq_length())
    return cache


def probe_prompt(model, tokenizer, length: int, keys: list[int], where: list[float]) -> list[tuple[float, int, str]]:
    """(depth, key, generated text) for each needle of one prompt, every question after one shared prefill."""
    return probe_prompts(model, tokenizer, [prompt_ids(tokenizer, length, keys, where)], [keys], [where], iter)


def prompt_keys(prompts: int, keys: int = DEFAULT_KEYS, seed: int = 0) -> list[list[int]]:
    """The keys of each of ``prompts`` prompts, ``keys`` each, in the order they are planted (start to end)."""
    drawn = passkeys(prompts * keys, seed)
    return [drawn[p * keys : (p + 1) * keys] for p in range(prompts)]


def multikey_accuracy(
    model, tokenizer, length: int, prompts: int = 2, keys: int = DEFAULT_KEYS, seed: int = 0, progress=True
) -> dict:
    """Greedy-generation accuracy over ``prompts`` prompts x ``keys`` keys at ``length`` tokens:
    ``multikey_accuracy``, ``multikey_probes``, ``multikey_hits``, ``multikey_interval`` (Wilson 95%),
    ``multikey_by_depth`` ([[depth, accuracy], ...]) and
    ``multikey_misses`` ([[depth, key, generated text], ...])."""
    chosen = prompt_keys(prompts, keys, seed)
    where = [depths(keys, p, prompts) for p in range(prompts)]
    ids = [prompt_ids(tokenizer, length, k, w) for k, w in zip(chosen, where, strict=True)]
    probes = probe_prompts(
        model, tokenizer, ids, chosen, where, lambda r: bar(r, desc=f"pass keys @{length}", enabled=progress)
    )
    hits = [text.strip().startswith(str(key)) for _, key, text in probes]
    return {
        "multikey_accuracy": sum(hits) / len(hits),
        "multikey_probes": len(hits),
        "multikey_hits": sum(hits),
        "multikey_interval": score(sum(hits), len(hits))["interval"],
        "multikey_by_depth": by_depth([round(d, 4) for d, _, _ in probes], hits),
        "multikey_misses": [[round(d, 4), k, t] for (d, k, t), hit in zip(probes, hits, strict=True) if not hit],
    }
