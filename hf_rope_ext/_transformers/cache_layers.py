"""KV cache layers that keep the attention-level types' rotated rows in the cache itself (part of the generation
cache seam: subclasses of transformers' public layer classes; nothing of transformers is changed).

The attention-level types cache keys unrotated and rotate them inside the attention function; decoding reuses the
rows rotated at earlier steps (``rotated_cache``). Each class here is one of transformers' own layers
(``DynamicLayer``, ``DynamicSlidingWindowLayer``, ``StaticLayer``, ``StaticSlidingWindowLayer``) that also owns
those remembered rows (``rope_entries``: purpose -> ``rotated_cache.Entry``) and, as transformers' layers do,
overrides what it changes: every method that changes its keys calls the stock one, then cuts the rows back:

- ``update``: rows from the first one it writes on (a dynamic layer appends: none are cut; a static layer writes
  from its length on; a sliding layer that drops or rolls rows: all);
- ``crop``: rows past the new length; ``reorder_cache`` (beam search): the same batch rows picked; ``reset``,
  ``batch_repeat_interleave``, ``batch_select_indices``, ``offload``, a new initialization: all.

So what a layer holds is valid by construction. The attention function finds the layer through the key tensor it
is called with: ``update`` links the keys it returns to itself (``rotated_cache.link``), and the link holds only
while those keys are the layer's latest. Every family routed to the package's attention function passes them on
untouched; anything else (a plain cache, keys from elsewhere) finds no layer, and ``rotated_cache.beside``
compares before reusing.
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

from ..attention.engine import rotated_cache, static_rows
from ..attention.layer import config_routes


class RotatedRows:
    """What every layer of this module adds to the transformers layer it derives from (listed after it): the
    rows, the link from the keys it returns, and the cuts after the changes every layer class can make."""

    _layer_type = None  # never entered in transformers' layer-type tables: caches it builds keep its own layers

    @property
    def rope_entries(self) -> dict:
        """purpose -> Entry: the rotated rows this layer keeps (valid rows [base, end) of its current keys)."""
        return self.__dict__.setdefault("_rope_entries", {})

    @classmethod
    def holding(cls, layer) -> RotatedRows:
        """A layer of this class holding ``layer``'s state (its tensors shared, nothing copied), to stand in its
        place in a cache; ``layer`` must be of the transformers class this one derives from."""
        new = cls.__new__(cls)
        new.__dict__.update(vars(layer))
        return new

    def returned(self, keys: torch.Tensor) -> bool:
        """Whether ``keys`` are what this layer's latest update returned."""
        latest = self.__dict__.get("_rope_keys")
        return latest is not None and latest() is keys

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

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if torch.compiler.is_compiling():  # a compiled step keeps no rows (nor links a tensor): none stay valid
            self.rope_entries.clear()
            return super().update(key_states, value_states, *args, **kwargs)
        kept = self.kept_rows(key_states.shape[-2])
        keys, values = super().update(key_states, value_states, *args, **kwargs)  # keys [B, Hkv, kv, d]
        self.keep_rows(kept)
        self.__dict__["_rope_filled"] = kept + key_states.shape[-2]  # a static layer's filled slots after it
        self.__dict__["_rope_returned"] = keys.shape[-2]
        self.__dict__["_rope_keys"] = rotated_cache.link(keys, self)
        return keys, values

    def lazy_initialization(self, *args, **kwargs) -> None:
        super().lazy_initialization(*args, **kwargs)
        self.rope_entries.clear()

    def reset(self) -> None:
        super().reset()
        self.rope_entries.clear()

    def offload(self) -> None:
        super().offload()
        self.rope_entries.clear()

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        super().reorder_cache(beam_idx)
        for entry in self.rope_entries.values():
            entry.select(beam_idx)

    def keep_static(self, call):
        """After this layer's update, an eager attention call on its keys: the static rows kept, every written row
        turned (``static_rows.StaticRows``), or None (none here)."""
        return None


class RotatingDynamicLayer(RotatedRows, DynamicLayer):
    """transformers' ``DynamicLayer`` keeping rotated rows: it appends, and can also be cropped and batch-edited."""

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self.keep_rows(int(self.get_seq_length()))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.rope_entries.clear()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self.rope_entries.clear()


class RotatingDynamicSlidingWindowLayer(RotatingDynamicLayer, DynamicSlidingWindowLayer):
    """transformers' ``DynamicSlidingWindowLayer`` keeping rotated rows: it drops leading rows once its window is
    full."""

    def kept_rows(self, added: int) -> int:
        if not self.is_initialized:
            return 0
        # it returns its stored rows, then the new ones: they lead the last keys it returned if it kept them all
        stored = self.keys.shape[-2] if self.keys.ndim == 4 else 0
        return stored if stored == self.__dict__.get("_rope_returned", 0) else 0


class RotatingStaticLayer(RotatedRows, StaticLayer):
    """transformers' ``StaticLayer`` keeping rotated rows: it writes in place from its length on. Beside them, the
    static rows a compiled step reads (``static_rows``): the keys turned as each attention call finds them written,
    in buffers of the keys' size that keep their addresses; kept right through ``reset``, ``crop`` (rows past the
    length are written again before they are seen) and ``reorder_cache``, dropped for good by ``offload`` (the keys
    then move between devices: the step turns the cache itself), rebuilt by the next eager call where an update
    went unturned."""

    keeps_static_rows = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        rows = self.__dict__.get("_rope_static")
        if rows is not None and not torch.compiler.is_compiling():  # traced: the attention call writes, on the device
            if self.__dict__.get("_rope_pending"):  # the last update's rows were never turned
                rows.valid = False
            self.__dict__["_rope_pending"] = True
        return super().update(key_states, value_states, *args, **kwargs)

    def keep_static(self, call):
        """Write the rows this update wrote, turned, into the static rows (all of them where absent or stale);
        returns them where the call reads them as written (None where this layer keeps none)."""
        self.__dict__["_rope_pending"] = False
        if not self.keeps_static_rows or self.__dict__.get("_rope_static_off") or not any(static_rows.wanted(call)):
            return None
        rows, length = self.__dict__.get("_rope_static"), self.cumulative_length
        if static_rows.fitting(rows, call, self.keys, self.values, length):
            static_rows.write(rows, call, self.keys, self.values)
        else:
            rows = self.__dict__["_rope_static"] = static_rows.build(call, self.keys, self.values, length, rows)
        # read by a call on the filled slots alone (a call given no mask and more keys than queries reads the first
        # slots as an empty cache's prompt: its positions are not the rows')
        return rows if call.key.shape[2] == self.__dict__.get("_rope_filled") else None

    def lazy_initialization(self, *args, **kwargs) -> None:
        super().lazy_initialization(*args, **kwargs)
        self.__dict__.pop("_rope_static", None)

    def reset(self) -> None:
        super().reset()
        self.__dict__["_rope_pending"] = False  # rows are written again from the first

    def offload(self) -> None:
        super().offload()
        self.__dict__.pop("_rope_static", None)
        self.__dict__["_rope_static_off"] = True

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        super().reorder_cache(beam_idx)
        rows = self.__dict__.get("_rope_static")
        if rows is not None:
            static_rows.select(rows, beam_idx)
            setattr(self.keys, static_rows.STATIC, rows)  # transformers' reorder made new keys

    if hasattr(StaticLayer, "crop"):  # the releases whose static layers can be cropped

        def crop(self, tokens_to_remove: int) -> None:
            super().crop(tokens_to_remove)
            self.keep_rows(int(self.get_seq_length()))


class RotatingStaticSlidingWindowLayer(RotatingStaticLayer, StaticSlidingWindowLayer):
    """transformers' ``StaticSlidingWindowLayer`` keeping rotated rows: written in place until it rolls. No static
    rows: once full it rolls its keys, and a compiled step turns its window itself."""

    keeps_static_rows = False

    def kept_rows(self, added: int) -> int:
        if not self.is_initialized:
            return 0
        before = int(self.get_seq_length())
        return before if before + added <= self.max_cache_len else 0


# transformers' layer class -> the class here that keeps rotated rows (other classes: exact, compared)
ROTATING = {
    DynamicLayer: RotatingDynamicLayer,
    DynamicSlidingWindowLayer: RotatingDynamicSlidingWindowLayer,
    StaticLayer: RotatingStaticLayer,
    StaticSlidingWindowLayer: RotatingStaticSlidingWindowLayer,
}


def adopt(cache) -> bool:
    """Make ``cache`` (a transformers ``Cache``, or an encoder-decoder one's self-attention cache) keep rotated rows:
    each layer of a class in ROTATING is replaced by a layer of its rotating class holding the same state, and
    layers it creates later are rotating ones. Returns whether anything changed. Layers of other classes
    (quantized, offloaded to another class) are left as they are: exact, compared."""
    cache = getattr(cache, "self_attention_cache", cache)
    if not isinstance(cache, Cache):
        return False
    changed = False
    for i, layer in enumerate(cache.layers):
        rotating = ROTATING.get(type(layer))
        if rotating is not None:
            cache.layers[i], changed = rotating.holding(layer), True
    replicate = getattr(cache, "layer_class_to_replicate", None)
    if replicate in ROTATING:
        cache.layer_class_to_replicate, changed = ROTATING[replicate], True
    return changed


def rope_cache(model, max_cache_len: int | None = None, static_rows: bool = True) -> Cache:
    """A cache for ``model`` (or its config): transformers' ``DynamicCache``, or its ``StaticCache`` of
    ``max_cache_len`` rows, whose layers keep the rotated rows when the config names one of the package's types
    that rotate in the attention function (a stock model gets the stock cache; ``generate`` adopts its own).

    ``static_rows=False`` (a static cache only): its layers keep no turned keys beside their keys (``hf-rope-ext
    list`` says which types keep them: one more key cache, RoPER's a value cache too); a compiled step then turns
    every cached key at every step, slower, in the memory of the cache alone."""
    if not isinstance(static_rows, bool):
        raise TypeError(f"rope_cache: static_rows={static_rows!r}; allowed: True or False")
    if not static_rows and max_cache_len is None:
        raise ValueError("rope_cache: static_rows=False applies to a static cache; give max_cache_len too")
    config = getattr(model, "config", model)
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    cache = DynamicCache(config=config) if max_cache_len is None else StaticCache(config, max_cache_len)
    if config_routes(config):
        adopt(cache)
    for layer in cache.layers if not static_rows else ():
        if isinstance(layer, RotatingStaticLayer):  # a stock model's layers are left as transformers made them
            layer.__dict__["_rope_static_off"] = True
    return cache
