"""Attention-level methods: each module registers one rope_type that changes how scores or outputs are formed.

The method modules (``rerope``, ``leaky_rerope``, ``self_extend``, ``xpos``, ``roper``) declare their types
without importing torch (``table``), so reading the registry (``hf-rope-ext list``) stays fast; the scorers that
compute them are built on first use. The shared machinery: ``dispatch`` (the attention function), ``positions``
(query/key positions with a cache of unrotated keys), ``kernel`` (eager / sdpa over one or two score bands),
``scoring`` (what a method provides), ``windowed`` (the two-band distance methods), ``rotation`` (float64-angle
rotations), ``fast`` (the sdpa path).
"""

from .. import frequencies  # noqa: F401  (first: its dynamic_yarn reads .params, which reads frequencies.params)
from . import leaky_rerope, rerope, roper, self_extend, xpos  # noqa: F401  (each registers its rope_type)
from .table import SCORERS

__all__ = ["SCORERS", "attend", "attention_type_of"]


def __getattr__(name: str):
    if name in ("attend", "attention_type_of"):  # the attention function imports torch: loaded on access
        from . import dispatch

        return getattr(dispatch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
