"""What probe counts can say beyond a Wilson interval: an interval that treats the keys of one prompt as one draw
(``cluster_bootstrap``), and whether two runs over the same keys differ (``mcnemar``, exact).

The three keys of a multikey prompt share its filler, its lengths and whatever the model makes of them: 24 keys of 8
prompts are 8 draws, not 24, and an interval counting them as 24 is too narrow. The cluster bootstrap resamples
prompts with replacement and reads the percentiles of the resampled share of keys found."""

from __future__ import annotations

import math
import random

RESAMPLES = 10_000
SEED = 20261129  # fixed: the interval of a record is the same on every run


def cluster_bootstrap(per_prompt: list[tuple[int, int]], resamples: int = RESAMPLES, seed: int = SEED) -> list[float]:
    """The percentile 95% interval [lo, hi] (4 decimals) of hits / keys over prompts resampled with replacement;
    ``per_prompt``: (hits, keys) of each prompt. Quantiles interpolated linearly between order statistics."""
    if not per_prompt or any(not 0 <= h <= k or k < 1 for h, k in per_prompt):
        raise ValueError(f"per_prompt={per_prompt}: expected (hits, keys) pairs with 0 <= hits <= keys, keys >= 1")
    rng, count = random.Random(seed), len(per_prompt)
    shares = []
    for _ in range(resamples):
        drawn = [per_prompt[rng.randrange(count)] for _ in range(count)]  # one resample: count prompts
        shares.append(sum(h for h, _ in drawn) / sum(k for _, k in drawn))
    shares.sort()
    return [round(quantile(shares, 0.025), 4), round(quantile(shares, 0.975), 4)]


def quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values, linear between order statistics (numpy's default)."""
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def mcnemar(first: list[bool], second: list[bool]) -> dict:
    """The exact McNemar test of two runs over the same keys (in the same order): ``only_first`` and
    ``only_second`` (the discordant keys) and the two-sided ``p`` of the binomial test of one against the other."""
    if len(first) != len(second):
        raise ValueError(f"paired runs of {len(first)} and {len(second)} keys: they must score the same keys")
    b = sum(x and not y for x, y in zip(first, second, strict=True))
    c = sum(y and not x for x, y in zip(first, second, strict=True))
    tail = sum(math.comb(b + c, i) for i in range(min(b, c) + 1)) / 2 ** (b + c)
    return {"only_first": b, "only_second": c, "p": min(1.0, 2 * tail)}
