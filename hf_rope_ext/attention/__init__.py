"""Attention-level methods: each module registers one rope_type that changes how scores or outputs are formed.

The shared machinery: ``dispatch`` (the attention function), ``positions`` (query/key positions with a cache of
unrotated keys), ``kernel`` (eager / sdpa over one or two score bands), ``scoring`` (what a method provides),
``windowed`` (the two-band distance methods), ``rotation`` (float64-angle rotations).
"""

from . import dynamic, leaky_rerope, rerope, roper, self_extend, xpos  # noqa: F401  (each registers its rope_type)
from .dispatch import attend, attention_type_of
from .scoring import SCORERS

__all__ = ["SCORERS", "attend", "attention_type_of"]
