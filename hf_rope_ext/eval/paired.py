"""What probe counts can say when the keys of one prompt are not independent draws: an interval over prompts
(``by_prompt``), and whether two runs over the same keys differ, key by key (``mcnemar``, exact) or prompt by prompt
(``sign_flip``, exact).

The three keys of a multikey prompt share its filler, its lengths and whatever the model makes of them: 24 keys of 8
prompts are at most 24 draws and at least 8. ``by_prompt`` is the Wilson interval of the share of keys found with n =
the number of prompts, the fewest draws the keys can be worth: it covers the share of keys at its nominal 95% or
above whatever the correlation of a prompt's keys (``eval.coverage`` simulates it; the percentile bootstrap over 8
prompts does not). A prompt of one key is one draw either way, so classic counts get the plain Wilson interval.
"""

from __future__ import annotations

import math

from .intervals import wilson


def by_prompt(per_prompt: list[tuple[int, int]]) -> list[float]:
    """The 95% interval [lo, hi] (4 decimals) of the share of keys found, from (hits, keys) of each prompt: Wilson on
    that share with n = the number of prompts."""
    check_per_prompt(per_prompt)
    share = sum(h for h, _ in per_prompt) / sum(k for _, k in per_prompt)
    lo, hi = wilson(share * len(per_prompt), len(per_prompt))
    return [round(lo, 4), round(hi, 4)]


def check_per_prompt(per_prompt: list[tuple[int, int]]) -> None:
    if not per_prompt or any(not 0 <= h <= k or k < 1 for h, k in per_prompt):
        raise ValueError(f"per_prompt={per_prompt}: expected (hits, keys) pairs with 0 <= hits <= keys, keys >= 1")


def mcnemar(first: list[bool], second: list[bool]) -> dict:
    """The exact McNemar test of two runs over the same keys (in the same order): ``only_first`` and
    ``only_second`` (the discordant keys) and the two-sided ``p`` of the binomial test of one against the other."""
    if len(first) != len(second):
        raise ValueError(f"paired runs of {len(first)} and {len(second)} keys: they must score the same keys")
    b = sum(x and not y for x, y in zip(first, second, strict=True))
    c = sum(y and not x for x, y in zip(first, second, strict=True))
    tail = sum(math.comb(b + c, i) for i in range(min(b, c) + 1)) / 2 ** (b + c)
    return {"only_first": b, "only_second": c, "p": min(1.0, 2 * tail)}


def sign_flip(first: list[list[bool]], second: list[list[bool]]) -> dict:
    """The exact paired test of two runs over the same prompts, each prompt's keys kept together: under "no
    difference" the two runs' answers to a prompt may swap as a whole, so each prompt's difference d (keys the second
    run found minus keys the first found) is as likely -d as d. ``p``: the share of the 2^prompts sign patterns whose
    |sum of signed |d||| is at least the observed |sum of d| (two-sided), counted exactly by convolution. With one key a
    prompt it is ``mcnemar``. Also ``only_first``/``only_second`` (discordant keys) and the prompts each run wins."""
    if [len(x) for x in first] != [len(x) for x in second]:
        raise ValueError("paired runs asked different numbers of keys per prompt: they must score the same keys")
    d = [sum(b) - sum(a) for a, b in zip(first, second, strict=True)]
    ways, reach = {0: 1}, 0  # signed sum -> number of sign patterns reaching it; the largest |sum| so far
    for step in (abs(x) for x in d if x):
        reach += step
        ways = {s: ways.get(s - step, 0) + ways.get(s + step, 0) for s in range(-reach, reach + 1, 2)}
    extreme = sum(n for s, n in ways.items() if abs(s) >= abs(sum(d)))
    keys = mcnemar([x for a in first for x in a], [x for b in second for x in b])
    return keys | {
        "p": extreme / sum(ways.values()),
        "prompts_first": sum(x < 0 for x in d),
        "prompts_second": sum(x > 0 for x in d),
    }
