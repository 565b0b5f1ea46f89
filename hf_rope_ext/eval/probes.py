"""The pass-key probes of ``hf-rope-ext eval --probes``: a split's prompts (``eval.splits``) read by one model,
each question answered by greedy generation, scored as ``hits/n`` with a Wilson 95% interval.

A probe is a hit when the answer's first run of digits is the key (a key followed by more digits is a miss): the
answer is generated for as many tokens as the key has digits plus two. Prompts are read in the order of their
tokens, so that each shares as much of the previous one as can be kept in the cache (``multikey.read_prompts``).

A run can be stopped and resumed: with a ``ProbeLog`` every prompt's probes are appended to a JSON-lines file as
soon as they are answered, under the identity of what was measured (``cell``: the model, adapter, rope parameters
and dtype) and with the run's provenance (``metadata.provenance``: commit, clean tree, dtype, device, threads); a
later run with the same cell reads them back and asks only the prompts not there yet.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..util.progress import bar
from .intervals import score
from .multikey import read_prompts
from .passkey import by_depth
from .splits import Prompt, prompts

FIRST_NUMBER = re.compile(r"\s*(\d+)")
NUMBERS = re.compile(r"\d+")


def answer_tokens(key: int) -> int:
    """Tokens generated for an answer: the key's digits, a leading space and one more, so that a key continued by a
    further digit is seen (a tokenizer that spells several digits per token needs fewer)."""
    return len(str(key)) + 2


def is_hit(key: int, answer: str) -> bool:
    """Whether ``answer`` starts (after spaces) with exactly the digits of ``key``."""
    match = FIRST_NUMBER.match(answer)
    return match is not None and match.group(1) == str(key)


def names_key(key: int, answer: str) -> bool:
    """The looser reading shown beside ``is_hit`` where they differ: some run of digits in ``answer`` is exactly
    ``key`` (": 2619", "the number 2619")."""
    return str(key) in NUMBERS.findall(answer)


class ProbeLog:
    """A JSON-lines file of answered prompts: one line {"cell", "prompt_id", "prompt_sha", "probes": [[depth, key,
    answer, hit]], "provenance"} per prompt, appended and flushed to disk as each prompt ends. A line counts for a run
    only where its cell and its prompt's tokens (``prompt_sha``) are the run's; other lines are kept and left alone."""

    def __init__(self, path, cell: dict, provenance: dict | None = None):
        self.path, self.cell = Path(path), json.loads(json.dumps(cell))  # the cell as it reads back from JSON
        self.provenance = provenance

    def done(self) -> dict[tuple[str, str], list]:
        """(prompt_id, prompt_sha) -> probes, for this cell's lines."""
        if not self.path.is_file():
            return {}
        lines = [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return {(line["prompt_id"], line["prompt_sha"]): line["probes"] for line in lines if line["cell"] == self.cell}

    def append(self, prompt: Prompt, probes: list) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = {"cell": self.cell, "prompt_id": prompt.prompt_id, "prompt_sha": prompt_sha(prompt), "probes": probes}
        line |= {} if self.provenance is None else {"provenance": self.provenance}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def prompt_sha(prompt: Prompt) -> str:
    """A short hash of a prompt's tokens and questions: a logged answer is reused only for the very same prompt."""
    text = json.dumps([prompt.ids, [n.question for n in prompt.needles], [n.key for n in prompt.needles]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_probes(
    model, tokenizer, split: str, kind: str, length: int, samples: int, log=None, progress=True, **variant
) -> dict:
    """The record of ``samples`` prompts of ``kind`` of ``split`` at ``length`` tokens (``aggregate``), asking only
    the prompts ``log`` does not hold yet; ``variant``: ``seeds_of`` and ``chat`` of ``splits.prompts``."""
    chosen = prompts(tokenizer, split, kind, length, samples, **variant)
    found = ask(
        model, tokenizer, chosen, log, bar_of=lambda r: bar(r, desc=f"{split} {kind} @{length}", enabled=progress)
    )
    return aggregate(split, kind, length, [found[p.prompt_id] for p in chosen], [len(p.ids) for p in chosen])


def ask(model, tokenizer, chosen: list[Prompt], log=None, bar_of=None) -> dict[str, list]:
    """prompt_id -> probes of every prompt of ``chosen``: those ``log`` holds for the very same tokens read back, the
    others answered (read in the order of their tokens, so that shared prefixes are adjacent) and appended to it."""
    ident = {p.prompt_id: (p.prompt_id, prompt_sha(p)) for p in chosen}
    found = log.done() if log is not None else {}
    todo = sorted((p for p in chosen if ident[p.prompt_id] not in found), key=lambda p: p.ids)

    def done(i: int, answers: list[str]) -> None:
        prompt = todo[i]
        found[ident[prompt.prompt_id]] = probes_of(prompt, answers)
        if log is not None:
            log.append(prompt, found[ident[prompt.prompt_id]])

    questions = [[(n.question, answer_tokens(n.key)) for n in p.needles] for p in todo]
    read_prompts(model, tokenizer, [p.ids for p in todo], questions, bar_of or (lambda r: bar(r, enabled=False)), done)
    return {p.prompt_id: found[ident[p.prompt_id]] for p in chosen}


def probes_of(prompt: Prompt, answers: list[str]) -> list:
    """[[depth, key, answer, hit], ...] of one prompt's needles, in the order they are planted."""
    pairs = zip(prompt.needles, answers, strict=True)
    return [[round(n.depth, 4), n.key, text, is_hit(n.key, text)] for n, text in pairs]


def aggregate(split: str, kind: str, length: int, per_prompt: list[list], prompt_tokens: list[int]) -> dict:
    """One record: split, probe, length, ``score`` (n, hits, accuracy, interval), accuracy by depth, the misses
    ([depth, key, answer]) and the shortest and longest prompt read (tokens before the questions)."""
    probes = [probe for prompt in per_prompt for probe in prompt]
    hits = [is_hit(key, text) for _, key, text, _ in probes]  # from the answers: the rule of this version
    return {
        "split": split,
        "probe": kind,
        "length": length,
        **score(sum(hits), len(hits)),
        "by_depth": by_depth([depth for depth, *_ in probes], hits),
        "misses": [[depth, key, text] for (depth, key, text, _), hit in zip(probes, hits, strict=True) if not hit],
        "prompt_tokens": [min(prompt_tokens), max(prompt_tokens)],
    }
