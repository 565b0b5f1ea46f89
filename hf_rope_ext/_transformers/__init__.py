"""The transformers seams: the only modules that reach transformers' internals, one module per seam, each through
an extension point (or, for RoFormer, which has none, a narrow reversible patch), each saying what it installs and
how it is undone:

- ``rope_registry``: ``ROPE_INIT_FUNCTIONS`` entries and config validators of the package's rope types;
- ``attention_interface``: ``AttentionInterface`` functions for the attention-level types;
- ``conversions``: ``get_model_conversion_mapping`` adds RoPE layout converters for interleaved checkpoints;
- ``generation_cache`` (with ``cache_layers``): ``generate``'s cache keeps the rotated rows in its layers;
- ``roformer``: RoFormer's encoder and config classes, and per-instance changes of its live encoders;
- ``modules``: where transformers keeps a family's modeling code (read only, for the portable export).

``install()`` is idempotent and leaves every built-in entry untouched, so stock behaviour is unchanged for models
that do not name one of this package's types; ``uninstall()`` undoes every seam.
"""

from __future__ import annotations

from . import attention_interface, conversions, generation_cache, roformer, rope_registry
from .attention_interface import stock_attention
from .generation_cache import cache_keyword
from .rope_registry import rope_types

SEAMS = (rope_registry, conversions, attention_interface, generation_cache, roformer)

__all__ = ["SEAMS", "cache_keyword", "install", "rope_types", "stock_attention", "uninstall"]


def install() -> None:
    """Install every seam (safe to call any number of times)."""
    for seam in SEAMS:
        seam.install()


def uninstall() -> None:
    """Undo every seam: transformers as it was before ``install`` (live RoFormer encoders detached)."""
    for seam in reversed(SEAMS):
        seam.uninstall()
