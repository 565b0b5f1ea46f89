"""Several pass keys per long prompt, each asked in turn through one shared prefill (scored by greedy generation).

A prompt of ``length`` tokens is the passkey task line, the filler sentences of ``passkey`` and ``keys`` needles
"The pass key of the red door is N. Remember it. N is the pass key of the red door." at depths spread over the
filler. The prompt is read once into a KV cache; each question ("What is the pass key of the red door? The pass key
of the red door is") is then fed after it, the answer generated greedily, and the cache cropped back to the prompt,
so one long forward scores ``keys`` probes. A probe is a hit when the generated text starts with the key's digits.
Attention-level types get the package's rotating cache (``hf_rope_ext.rope_cache``), others transformers' own.
"""

from __future__ import annotations

import torch

from ..progress import bar
from .passkey import FILLER, TASK, filler_tokens, passkeys

DOORS = (
    "red door",
    "blue box",
    "green gate",
    "yellow chest",
    "white safe",
    "black drawer",
    "grey locker",
    "pink vault",
)
NEEDLE = " The pass key of the {name} is {key}. Remember it. {key} is the pass key of the {name}."
QUESTION = " What is the pass key of the {name}? The pass key of the {name} is"


def prompt_ids(tokenizer, length: int, keys: list[int]) -> list[int]:
    """Task, filler and one needle per key (names from DOORS, depths spread evenly), exactly ``length`` tokens."""
    if len(keys) > len(DOORS):
        raise ValueError(f"keys: {len(keys)} pass keys per prompt; allowed at most {len(DOORS)}")
    piece = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    task = bos + piece(TASK)
    needles = [piece(NEEDLE.format(name=name, key=key)) for name, key in zip(DOORS, keys, strict=False)]
    count = length - len(task) - sum(map(len, needles))
    if count < len(keys) * 8:
        raise ValueError(f"length={length}: too short for {len(keys)} needles with this tokenizer")
    filler, bounds = filler_tokens([piece(s) for s in FILLER], count)
    cuts = [min(bounds, key=lambda b, d=d: abs(b - d * count)) for d in depths(len(keys))]
    ids, last = list(task), 0
    for cut, needle in zip(cuts, needles, strict=True):
        ids += filler[last:cut] + needle
        last = cut
    return ids + filler[last:]


def depths(n: int) -> list[float]:
    """``n`` needle depths evenly inside the filler (never at its very ends)."""
    return [(i + 0.5) / n for i in range(n)]


@torch.no_grad()
def ask(model, tokenizer, cache, keyword: str, name: str, answer_tokens: int) -> str:
    """Feed the question for ``name`` after what ``cache`` holds and generate greedily; returns the text."""
    question = torch.tensor([tokenizer(QUESTION.format(name=name), add_special_tokens=False)["input_ids"]])
    logits = model(question, logits_to_keep=1, **{keyword: cache}).logits
    out = []
    for _ in range(answer_tokens):
        token = logits[:, -1:].argmax(-1)
        out.append(int(token))
        logits = model(token, logits_to_keep=1, **{keyword: cache}).logits
    return tokenizer.decode(out)


@torch.no_grad()
def multikey_accuracy(model, tokenizer, length: int, prompts: int = 2, keys: int = 5, seed: int = 0, progress=True):
    """Greedy-generation accuracy over ``prompts`` prompts x ``keys`` keys at ``length`` tokens:
    {"multikey_accuracy", "multikey_probes", "multikey_misses": [[depth, key, generated], ...]}."""
    import hf_rope_ext

    keyword = hf_rope_ext.cache_keyword(model)
    all_keys = passkeys(prompts * keys, seed)
    hits, misses = 0, []
    for p in bar(range(prompts), desc=f"multikey @{length}", enabled=progress):
        chosen = all_keys[p * keys : (p + 1) * keys]
        cache = hf_rope_ext.rope_cache(model)
        model(torch.tensor([prompt_ids(tokenizer, length, chosen)]), logits_to_keep=1, **{keyword: cache})
        for depth, name, key in zip(depths(keys), DOORS, chosen, strict=False):
            text = ask(model, tokenizer, cache, keyword, name, answer_tokens=6)
            cache.crop(length - cache.get_seq_length())  # back to the prompt (a negative count removes rows)
            hit = text.strip().startswith(str(key))
            hits += hit
            if not hit:
                misses.append([round(depth, 3), key, text])
    return {"multikey_accuracy": hits / (prompts * keys), "multikey_probes": prompts * keys, "multikey_misses": misses}
