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
"""

from __future__ import annotations

import torch

from ..util.progress import bar
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
def ask(model, tokenizer, cache, keyword: str, name: str, answer_tokens: int = ANSWER_TOKENS) -> str:
    """Feed the question for ``name`` after what ``cache`` holds and generate greedily; returns the text."""
    device = next(model.parameters()).device
    question = tokenizer(QUESTION.format(name=name), add_special_tokens=False)["input_ids"]
    logits = model(torch.tensor([question], device=device), logits_to_keep=1, **{keyword: cache}).logits
    out = [int(logits[0, -1].argmax())]
    while len(out) < answer_tokens:  # the last token needs no forward of its own
        token = torch.tensor([out[-1:]], device=device)  # (1, 1)
        out.append(int(model(token, logits_to_keep=1, **{keyword: cache}).logits[0, -1].argmax()))
    return tokenizer.decode(out)


@torch.no_grad()
def probe_prompt(model, tokenizer, length: int, keys: list[int], where: list[float]) -> list[tuple[float, int, str]]:
    """(depth, key, generated text) for each needle of one prompt, every question after one shared prefill."""
    import hf_rope_ext  # the package's public names (cache_keyword, rope_cache) load on first use

    keyword = hf_rope_ext.cache_keyword(model)
    cache = hf_rope_ext.rope_cache(model)
    ids = torch.tensor([prompt_ids(tokenizer, length, keys, where)], device=next(model.parameters()).device)
    model(ids, logits_to_keep=1, **{keyword: cache})
    found = []
    for depth, name, key in zip(where, OBJECTS, keys, strict=False):
        found.append((depth, key, ask(model, tokenizer, cache, keyword, name)))
        cache.crop(length - cache.get_seq_length())  # back to the prompt (5.24 takes only a negative count)
    return found


def multikey_accuracy(
    model, tokenizer, length: int, prompts: int = 2, keys: int = DEFAULT_KEYS, seed: int = 0, progress=True
) -> dict:
    """Greedy-generation accuracy over ``prompts`` prompts x ``keys`` keys at ``length`` tokens:
    ``multikey_accuracy``, ``multikey_probes``, ``multikey_by_depth`` ([[depth, accuracy], ...]) and
    ``multikey_misses`` ([[depth, key, generated text], ...])."""
    all_keys = passkeys(prompts * keys, seed)
    probes = []
    for p in bar(range(prompts), desc=f"pass keys @{length}", enabled=progress):
        chosen = all_keys[p * keys : (p + 1) * keys]
        probes += probe_prompt(model, tokenizer, length, chosen, depths(keys, p, prompts))
    hits = [text.strip().startswith(str(key)) for _, key, text in probes]
    return {
        "multikey_accuracy": sum(hits) / len(hits),
        "multikey_probes": len(hits),
        "multikey_by_depth": by_depth([round(d, 4) for d, _, _ in probes], hits),
        "multikey_misses": [[round(d, 4), k, t] for (d, k, t), hit in zip(probes, hits, strict=True) if not hit],
    }
