"""Counts and their Wilson 95% score intervals: how every probe score is reported (``hits/n [lo, hi]``).

A target is shown only when the interval's lower bound clears it: 10/10 has a lower bound of 0.72, so ten probes
cannot show 80%; thirty hits in thirty probes can (0.89).
"""

from __future__ import annotations

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(hits: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``hits`` successes in ``n`` trials (Wilson 1927), clipped to [0, 1]. ``hits``
    need not be whole: a share of keys times a number of prompts is (``paired.by_prompt``)."""
    if n <= 0 or not 0 <= hits <= n:
        raise ValueError(f"hits={hits}, n={n}: expected 0 <= hits <= n and n > 0")
    lo, hi = wilson_bounds(hits / n, n, z)
    return max(0.0, lo), min(1.0, hi)


def wilson_bounds(p, n, z: float = Z95):
    """The Wilson bounds of a share ``p`` over ``n`` trials, unclipped; plain arithmetic, so that numpy arrays of
    shares and counts give arrays of bounds (``eval.coverage``)."""
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5 / (1 + z2 / n)
    return centre - half, centre + half


def score(hits: int, n: int) -> dict:
    """The fields a scored record carries: ``n``, ``hits``, ``accuracy`` and ``interval`` ([lo, hi], 4 decimals)."""
    lo, hi = wilson(hits, n)
    return {"n": n, "hits": hits, "accuracy": hits / n, "interval": [round(lo, 4), round(hi, 4)]}


def shown(record: dict) -> str:
    """``hits/n [lo, hi]`` of a scored record, the interval to two decimals: a Wilson interval (a record without an
    ``interval_kind``) from its count, so that it is rounded once, another kind as the record holds it."""
    lo, hi = record["interval"] if "interval_kind" in record else wilson(record["hits"], record["n"])
    return f"{record['hits']}/{record['n']} [{lo:.2f}, {hi:.2f}]"


def verdict(record: dict, target: float) -> str:
    """Whether a scored record shows ``target``: "met" when the interval's lower bound is at or above it, "missed"
    when its upper bound is below it, else "not shown at this sample size"."""
    lo, hi = record["interval"]
    return "met" if lo >= target else "missed" if hi < target else "not shown at this sample size"
