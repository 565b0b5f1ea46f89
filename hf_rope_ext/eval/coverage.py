"""How often a 95% interval of the share of keys found covers the true share, when the keys of a prompt are
correlated: a simulation over a grid of hit rates, intra-prompt correlations and numbers of prompts.

A draw is ``prompts`` prompts of ``keys`` keys. Each prompt's own hit rate comes from a beta distribution with mean
``rate`` whose intra-class correlation is ``rho`` (parameters a = rate (1 - rho) / rho, b = (1 - rate) (1 - rho) /
rho; rho = 0: every prompt at ``rate``), and its keys are found independently at that rate. The methods compared:

- ``by prompt``: Wilson on the share with n = prompts (``paired.by_prompt``, what the probe pages show);
- ``by key``: Wilson with n = keys, as if every key were its own draw;
- ``bootstrap``: the percentile cluster bootstrap over prompts (resampled with replacement).
"""

from __future__ import annotations

import numpy as np

from .intervals import wilson_bounds

SEED = 20261207
METHODS = ("by prompt", "by key", "bootstrap")


def draw(rate: float, rho: float, prompts: int, keys: int, draws: int, rng) -> np.ndarray:
    """Hits per prompt, shape (draws, prompts), each in 0..keys."""
    if rho == 0:
        rates = np.full((draws, prompts), rate)
    else:
        a, b = rate * (1 - rho) / rho, (1 - rate) * (1 - rho) / rho
        rates = rng.beta(a, b, size=(draws, prompts))
    return rng.binomial(keys, rates)


def intervals(method: str, hits: np.ndarray, keys: int, rng, resamples: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per draw of ``hits`` (draws, prompts) by ``method``, each of shape (draws,)."""
    draws, prompts = hits.shape
    share = hits.sum(axis=1) / (prompts * keys)
    if method == "bootstrap":  # shares of resampled prompts, (draws, resamples), percentiles per draw
        picks = rng.integers(0, prompts, size=(draws, resamples, prompts))
        shares = np.take_along_axis(hits[:, None, :], picks, axis=2).sum(axis=2) / (prompts * keys)
        lo, hi = np.quantile(shares, [0.025, 0.975], axis=1)
        return lo, hi
    n = {"by prompt": prompts, "by key": prompts * keys}[method]
    lo, hi = wilson_bounds(share, n)
    return np.clip(lo, 0, 1), np.clip(hi, 0, 1)


def coverage(method: str, rate: float, rho: float, prompts: int, keys: int = 3, draws: int = 10_000, seed=SEED):
    """The share of ``draws`` simulated draws whose interval by ``method`` holds ``rate``."""
    rng = np.random.default_rng([seed, round(rate * 1000), round(rho * 1000), prompts, keys, METHODS.index(method)])
    hits = draw(rate, rho, prompts, keys, draws, rng)
    if method == "bootstrap":  # in blocks, to bound memory: draws x resamples x prompts indices at a time
        parts = [intervals(method, hits[i : i + 250], keys, rng) for i in range(0, draws, 250)]
        lo, hi = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    else:
        lo, hi = intervals(method, hits, keys, rng)
    return float(np.mean((lo <= rate) & (rate <= hi)))
