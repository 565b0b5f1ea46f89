"""Rotated keys (and values) remembered between decode steps, so a new token does not re-rotate the whole cache.

The KV cache holds unrotated keys; the fast path needs them rotated (the far band of leaky ReRoPE and Self-Extend,
every key for xPos and RoPER). Rotating 16k keys with float64 angles takes about 4x one decode step's attention, so
calls that extend a cache (more keys than queries, no autograd) keep, per purpose, the rotated rows in buffers with
room to grow (a step writes only its new rows). Where they are kept decides how a later call knows they still hold:

- in the cache itself (:class:`Memory` ``trusted``): the layers of ``_transformers.cache_layers`` (what
  ``generate`` builds for these types, or ``hf_rope_ext.rope_cache``) own the remembered rows and cut them back at
  every change they make (an update's write, ``crop``, ``reorder_cache``, ``reset`` ...), so what is left is valid
  by construction and nothing is read to reuse it. The call finds its layer through its own key argument: the keys
  a layer's update returns carry a weak link to it (:func:`link`, :func:`kept_by_cache`);
- beside any other cache (a plain ``DynamicCache`` or ``StaticCache`` a user built): per attention module, with a
  copy of the unrotated rows they came from; a later call reuses a prefix only where the cached keys equal that copy
  bit for bit (read as 8-byte words, a small fraction of rotating them again). Exact whatever the cache does, at
  the price of that read.

Either way a prefix is reused only under the same rotation tag (frequencies, parameters, reference). Beside other
caches it must also have been rotated at the same key positions (compared); a cache layer's own rows are taken to
stand where they stood (the engine's rule, ``call``: cached keys keep consecutive positions up to the newest query),
so a decode step on them reads nothing back from the device: it rotates its new row and writes it into the buffer.
Nothing here reads tensor version counters, so it runs the same under ``torch.inference_mode``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Entry:
    tag: tuple
    base: int  # key row held in buffer row 0
    end: int  # key rows [base, end) are valid
    source: torch.Tensor | None  # [B, Hkv, capacity, d]: a copy of the unrotated rows (None: trusted, not needed)
    positions: torch.Tensor | None  # [B, capacity] int64 (None: trusted, not needed)
    rotated: torch.Tensor  # [B, Hkv, capacity, d]: the rotated rows

    def select(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search's reorder), in the order given."""
        index = index.to(self.rotated.device)
        self.rotated = self.rotated.index_select(0, index)
        if self.source is not None:
            self.source = self.source.index_select(0, index)
            self.positions = self.positions.index_select(0, index)


@dataclass
class Memory:
    """The remembered entries a layer call reads and writes: purpose -> Entry."""

    entries: dict
    trusted: bool  # True: kept valid by the cache layer that owns them (no comparison)
    layer: object = None  # that cache layer (trusted), whose ``keep_static`` keeps its static rows


_MEMORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {purpose: Entry}: beside other caches
LINK = "_hf_rope_ext_layer"  # attribute of the keys a rotating cache layer's update returned: Link to that layer


class Link:
    """A weak reference that copies and pickles as a dead one (a cache, its layers and keys stay copyable and
    picklable; a copy is linked to nothing)."""

    __slots__ = ("ref",)

    def __init__(self, target=None):
        self.ref = None if target is None else weakref.ref(target)

    def __call__(self):
        return None if self.ref is None else self.ref()

    def __reduce__(self):
        return (Link, ())


def link(keys: torch.Tensor, layer) -> Link:
    """Mark ``keys`` [B, Hkv, kv, d], just returned by ``layer``'s update, as that layer's: the attention call given
    these very keys reads and writes the layer's ``rope_entries``, trusted. Returns a Link to ``keys`` for the layer
    to keep (its ``returned(keys)`` says whether they are still its latest)."""
    setattr(keys, LINK, Link(layer))
    return Link(keys)


def kept_by_cache(keys: torch.Tensor) -> Memory | None:
    """The trusted memory of the cache layer whose latest update returned ``keys`` (the link is taken off them: one
    attention call per update), else None."""
    found = keys.__dict__.pop(LINK, None)
    layer = found() if found is not None else None
    return Memory(layer.rope_entries, trusted=True, layer=layer) if layer is not None and layer.returned(keys) else None


def beside(module) -> Memory:
    """The memory of ``module``'s calls on a cache that keeps none itself (compared before any reuse)."""
    return Memory(_MEMORY.setdefault(module, {}), trusted=False)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b (same shape and dtype) hold the same bits, compared as 8-byte words where the layout allows."""
    for words in (torch.int64, {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]):
        try:
            return torch.equal(a.view(words), b.view(words))
        except RuntimeError:  # the last dim is not contiguous or not a multiple of 8 bytes
            continue
    return False


def reusable_end(entry: Entry | None, tag: tuple, source, positions, rows: range, trusted: bool) -> int:
    """The end of the key rows from ``rows.start`` on (at most ``rows.stop``) that ``entry`` holds exactly as
    rotating ``source`` would give them; ``rows.start`` when none. ``trusted``: the entry is kept valid by its
    cache layer, only tag and layout are checked (nothing read from the device); else the positions (``positions()``,
    [B, kv]) and the entry's copy of the source rows are compared."""
    start = rows.start
    if entry is None or entry.tag != tag or not entry.base <= start < min(rows.stop, entry.end):
        return start
    end, held = min(rows.stop, entry.end), entry.rotated
    if held.shape[:2] != source.shape[:2] or held.device != source.device or (entry.source is None) != trusted:
        return start
    if trusted:
        return end
    mine = slice(start - entry.base, end - entry.base)
    if not torch.equal(entry.positions[:, mine], positions()[:, start:end]):
        return start
    same = entry.source.dtype == source.dtype and entry.source.shape[3] == source.shape[3]
    return end if same and same_bits(entry.source[:, :, mine], source[:, :, start:end]) else start


def fits(entry: Entry | None, source: torch.Tensor, fresh: torch.Tensor, start: int, copy: bool) -> bool:
    """Whether ``entry``'s buffers can hold key rows [start, kv) of ``source`` and rotated rows like ``fresh``
    (with a copy of the source rows when ``copy``)."""
    if entry is None or entry.base > start or source.shape[2] - entry.base > entry.rotated.shape[2]:
        return False
    held, out = entry.source, entry.rotated
    if (held is not None) != copy:
        return False
    if held is not None and (held.dtype, held.shape[3]) != (source.dtype, source.shape[3]):
        return False
    return (out.shape[:2], out.device, out.shape[3], out.dtype) == (
        source.shape[:2],
        source.device,
        fresh.shape[3],
        fresh.dtype,
    )


def room(entry: Entry | None, start: int, end: int, source, positions, fresh, copy: bool) -> Entry:
    """``entry`` when its buffers fit, else new buffers from row ``start`` with room for 1/8 more rows (at least
    64) holding ``entry``'s valid rows [start, end): a full copy every few steps, not every step. ``copy``: with
    a copy of the source rows and their positions (``positions()``: [B, kv]), for comparing (untrusted)."""
    if fits(entry, source, fresh, start, copy):
        return entry
    b, h, kv, d = source.shape
    capacity = kv - start + max(64, (kv - start) // 8)
    turned = fresh.new_empty((b, h, capacity, fresh.shape[3]))
    held = source.new_empty((b, h, capacity, d)) if copy else None
    grown = Entry((), start, start, held, positions().new_empty((b, capacity)) if copy else None, turned)
    if end > start:
        old = slice(start - entry.base, end - entry.base)
        kept = (entry.source[:, :, old], entry.positions[:, old]) if copy else (None, None)
        put(grown, start, end, *kept, entry.rotated[:, :, old])
    return grown


def put(entry: Entry, start: int, end: int, source, positions, rotated) -> None:
    """Write key rows [start, end): their rotation and (untrusted) their positions and unrotated copy."""
    entry.rotated.narrow(2, start - entry.base, end - start).copy_(rotated)
    if entry.source is not None:
        entry.positions[:, start - entry.base : end - entry.base] = positions
        entry.source[:, :, start - entry.base : end - entry.base] = source


def rotated(
    memory: Memory,
    purpose: str,
    tag: tuple,
    source: torch.Tensor,
    positions: Callable[[], torch.Tensor],
    old_rows: int,
    rotate: Callable,
    start: int = 0,
    last: torch.Tensor | None = None,
    stop: int | None = None,
) -> torch.Tensor:
    """``rotate(source[:, :, start:stop], positions()[:, start:stop])`` [B, Hkv, stop - start, d] (``stop``: kv
    when None), reusing the rows that ``memory`` holds from earlier calls where valid (``start`` > 0: a trailing
    window, as the near band while decoding; ``stop`` < kv: the rows read, all being remembered). ``positions`` gives
    the key positions [B, kv] where they are needed (a decode step on a cache layer's rows does without them).

    ``old_rows``: rows of ``source`` that were already in the cache before this call (kv - q_len); only those can
    be reused, and the result is remembered only for calls that extend a cache (old_rows > 0) without autograd.
    ``last``: what ``rotate`` gives for the source's last row alone, when the caller has it already (a decode
    step rotates its query by the same angles). The returned view is valid until the next call on the same memory.
    """
    if old_rows <= 0 or (torch.is_grad_enabled() and source.requires_grad):
        return rotate(source[:, :, start:stop], positions()[:, start:stop])
    entry = memory.entries.get(purpose)
    end = reusable_end(entry, tag, source, positions, range(start, old_rows), memory.trusted)
    kv = source.shape[2]
    fresh = last if last is not None and end == kv - 1 else rotate(source[:, :, end:], positions()[:, end:])
    entry = room(entry, start, end, source, positions, fresh, not memory.trusted)
    copied = (source[:, :, end:], positions()[:, end:]) if not memory.trusted else (None, None)
    put(entry, end, kv, *copied, fresh)
    entry.tag, entry.end = tag, kv
    memory.entries[purpose] = entry
    return entry.rotated.narrow(2, start - entry.base, (kv if stop is None else stop) - start)


def forget(module) -> None:
    """Drop what ``module`` remembers beside plain caches (frees the rotated copies)."""
    _MEMORY.pop(module, None)
