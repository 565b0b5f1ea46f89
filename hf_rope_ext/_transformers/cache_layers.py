"""KV cache layers that keep the attention-level types' rotated rows in the cache itself (part of the generation
cache seam: subclasses of transformers' public layer classes; nothing of transformers is changed).

The attention-level types cache keys unrotated and rotate them inside the attention function; decoding reuses the
rows rotated at earlier steps (``rotated_cache``). A layer of this module is transformers' own cache layer
(``DynamicLayer``, ``DynamicSlidingWindowLayer``, ``StaticLayer``, ``StaticSlidingWindowLayer``) that also owns
those remembered rows (``rope_entries``: purpose -> ``rotated_cache.Entry``) and cuts them back at every change it
makes to its keys:

- ``update``: rows from the first one it writes on (a dynamic layer appends: none are cut; a static layer writes
  from its length on; a sliding layer that drops or rolls rows: all);
- ``crop``: rows past the new length; ``reorder_cache`` (beam search): the same batch rows picked; ``reset``,
  ``batch_repeat_interleave``, ``batch_select_indices``, ``offload``, a new initialization: all.

So what a layer holds is valid by construction. The attention function finds the layer of its call through the key
tensor it receives: ``update`` records the keys it returned (``rotated_cache.record_update``: a weak reference, per
thread), and the call's keys are that very tensor exactly when they come straight from this layer's update, as
every family routed to the package's attention function passes them. Anything else (a plain cache, keys from
elsewhere) finds no layer, and ``rotated_cache.beside`` compares before reusing.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import (
    Cache,
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticCache,
    StaticLayer,
    StaticSlidingWindowLayer,
)

from ..attention.engine import rotated_cache
from ..attention.layer import config_routes


class RotatedRows:
    """What the layers of this module add to transformers' layer they derive from (first in their bases)."""

    @property
    def rope_entries(self) -> dict:
        """purpose -> Entry: the rotated rows this layer keeps (valid rows [base, end) of its current keys)."""
        return self.__dict__.setdefault("_rope_entries", {})

    def kept_rows(self, added: int) -> int:
        """Before an update that adds ``added`` rows: the leading rows of the keys it will return that hold what
        they held in the keys returned last. A dynamic layer appends, a static one writes from its length on: both
        keep their length."""
        return int(self.get_seq_length()) if self.is_initialized else 0

    def keep_rows(self, rows: int) -> None:
        """Cut every entry back to its rows below ``rows``."""
        for purpose, entry in list(self.rope_entries.items()):
            entry.end = min(entry.end, rows)
            if entry.end <= entry.base:
                del self.rope_entries[purpose]

    def forget_rows(self, *args, **kwargs) -> None:
        self.rope_entries.clear()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        kept = self.kept_rows(key_states.shape[-2])
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self.keep_rows(kept)
        self.__dict__["_rope_returned"] = keys.shape[-2]
        rotated_cache.record_update(self, keys)
        return keys, values

    def crop_rows(self, *args, **kwargs) -> None:
        self.keep_rows(int(self.get_seq_length()))

    def select_rows(self, beam_idx: torch.Tensor) -> None:
        for entry in self.rope_entries.values():
            entry.select(beam_idx)


class SlidingRows(RotatedRows):
    """Sliding-window layers drop (dynamic) or roll (static) leading rows once the window is full."""

    def kept_rows(self, added: int) -> int:
        if not self.is_initialized:
            return 0
        if isinstance(self, StaticLayer):  # written in place from its length on until it rolls
            before = int(self.get_seq_length())
            return before if before + added <= self.max_cache_len else 0
        # dynamic: returns its stored rows, then the new ones; they lead the last keys it returned if it kept them all
        stored = self.keys.shape[-2] if self.keys.ndim == 4 else 0
        return stored if stored == self.__dict__.get("_rope_returned", 0) else 0


# the layer methods after which the rows are cut back, and how (only those the base class defines are wrapped)
AFTER = {
    "crop": RotatedRows.crop_rows,
    "reorder_cache": RotatedRows.select_rows,
    "reset": RotatedRows.forget_rows,
    "batch_repeat_interleave": RotatedRows.forget_rows,
    "batch_select_indices": RotatedRows.forget_rows,
    "offload": RotatedRows.forget_rows,
    "lazy_initialization": RotatedRows.forget_rows,
}


def _rotating(base: type, mixin: type) -> type:
    """``base`` with ``mixin`` first, and each method of AFTER that ``base`` has followed by its cut."""

    def wrapped(name: str, then):
        stock = getattr(base, name)

        def method(self, *args, **kwargs):
            result = stock(self, *args, **kwargs)
            then(self, *args, **kwargs)
            return result

        method.__name__ = name
        return method

    methods = {name: wrapped(name, then) for name, then in AFTER.items() if hasattr(base, name)}
    return type(f"Rotating{base.__name__}", (mixin, base), {"__module__": __name__, **methods})


ROTATING = {
    DynamicLayer: _rotating(DynamicLayer, RotatedRows),
    StaticLayer: _rotating(StaticLayer, RotatedRows),
    DynamicSlidingWindowLayer: _rotating(DynamicSlidingWindowLayer, SlidingRows),
    StaticSlidingWindowLayer: _rotating(StaticSlidingWindowLayer, SlidingRows),
}


def adopt(cache) -> bool:
    """Make ``cache`` (a transformers ``Cache``, or an encoder-decoder one's self-attention cache) keep rotated rows:
    each layer of a class in ROTATING becomes an instance of its rotating class with the same state (tensors
    shared, nothing copied), and layers it creates later are rotating ones. Returns whether anything changed.
    Layers of other classes (quantized, offloaded to another class) are left as they are: exact, compared."""
    cache = getattr(cache, "self_attention_cache", cache)
    if not isinstance(cache, Cache):
        return False
    changed = False
    for i, layer in enumerate(cache.layers):
        rotating = ROTATING.get(type(layer))
        if rotating is not None:
            adopted = rotating.__new__(rotating)
            adopted.__dict__.update(layer.__dict__)
            cache.layers[i], changed = adopted, True
    replicate = getattr(cache, "layer_class_to_replicate", None)
    if replicate in ROTATING:
        cache.layer_class_to_replicate, changed = ROTATING[replicate], True
    return changed


def rope_cache(model, max_cache_len: int | None = None) -> Cache:
    """A cache for ``model`` (or its config): transformers' ``DynamicCache``, or its ``StaticCache`` of
    ``max_cache_len`` rows, whose layers keep the rotated rows when the config names one of the package's types
    that rotate in the attention function (a stock model gets the stock cache; ``generate`` adopts its own)."""
    config = getattr(model, "config", model)
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    cache = DynamicCache(config=config) if max_cache_len is None else StaticCache(config, max_cache_len)
    if config_routes(config):
        adopt(cache)
    return cache
