"""Per-layer memory of rotated keys (and values) for decoding, so a new token does not re-rotate the whole cache.

The KV cache holds unrotated keys; the fast path needs them rotated (the far band of leaky ReRoPE and
Self-Extend, every key for xPos and RoPER). Rotating 16k keys with float64 angles takes about 4x one decode
step's attention, so calls that extend a cache (more keys than queries, no autograd) keep, per attention module
and purpose, the rotated rows beside a copy of the unrotated rows and positions they were computed from, in
buffers with room to grow (a step writes only its new rows). The next call reuses a prefix of them only when it
provably holds the same thing: the same rotation tag (frequencies, parameters, reference), the same key
positions, and unrotated keys equal bit for bit to the copy on that prefix (or vouched for, below). The
comparison is the one read of the cached keys a step pays (read as 8-byte words, 1.7x faster than comparing
floats: 0.9 ms for 4k keys of 8 heads x 64 dims in fp32 on this CPU); it holds whatever the cache does
(transformers' DynamicCache makes a new tensor by concatenation at every step, a static cache writes in place,
beam search reorders rows, assisted generation crops and refills), and anything that differs (another prompt, a
reordered or cropped cache) recomputes.

Comparing costs about a third of a decode step at 4k keys, so it is skipped when the rows are known to be the
same by construction: a forward pre-hook (``_transformers.watch_cache``) hands ``before_forward`` the module's
cache layer when it is transformers' ``DynamicLayer`` or ``StaticLayer``; if that layer's keys (or values) before
this step's update are the very tensor the last call rotated (or viewed), unmodified since (same object, same
``_version``), and the call's source is the layer's tensor after the update (DynamicLayer: then the update was
one concatenation onto that tensor and the old rows are its rows), or leading rows of it changed by exactly one
in-place write from row ``cumulative_length`` on, past the rows reused (StaticLayer), nothing is read.
Reordering, cropping, offloading or an in-place write replaces the object or bumps its version, and any other
cache class, or a call without the hook, compares as above.
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
    source: torch.Tensor  # [B, Hkv, capacity, d]: a copy of the unrotated rows
    positions: torch.Tensor  # [B, capacity] int64
    rotated: torch.Tensor  # [B, Hkv, capacity, d]: the rotated rows
    seen: weakref.ref | None = None  # the source tensor of the last call (the tensor it views)
    seen_version: int = -1  # its _version then
    seen_rows: int = 0  # its rows
    follows: tuple | None = None  # (weakref to a cache layer, "keys"/"values", written_from, version): before_forward


_MEMORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {purpose: Entry}
_SCRATCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {purpose: float32 buffer}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b (same shape and dtype) hold the same bits, compared as 8-byte words where the layout allows."""
    for words in (torch.int64, {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]):
        try:
            return torch.equal(a.view(words), b.view(words))
        except RuntimeError:  # the last dim is not contiguous or not a multiple of 8 bytes
            continue
    return False


def owner(x: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage ``x`` views (x itself when it is not a view)."""
    return x if x._base is None else x._base


def before_forward(module, layer, written_from: int | None) -> None:
    """Before ``module``'s forward: ``layer`` is its cache layer or None; ``written_from`` None when the layer's
    update replaces its tensors by a concatenation (``DynamicLayer``), else the first row its update writes in
    place (``StaticLayer``). Marks each entry whose last source is (a view of) that layer's keys or values as
    they are now, unmodified since, as continued by this step."""
    for entry in _MEMORY.get(module, {}).values():
        seen = entry.seen() if entry.seen is not None and layer is not None else None
        kind = next((k for k in ("keys", "values") if seen is not None and getattr(layer, k, None) is seen), None)
        fresh = kind is not None and seen._version == entry.seen_version
        entry.follows = (weakref.ref(layer), kind, written_from, seen._version) if fresh else None


def continued(entry: Entry, source: torch.Tensor, old_rows: int) -> bool:
    """Whether the first ``old_rows`` rows of ``source`` are provably those of the entry's last source (see the
    module docstring): ``source`` is the layer's tensor after one concatenation onto it, or leads rows of the
    same tensor after exactly one in-place write, from a row at or past ``old_rows``. Consumes the mark."""
    follows, entry.follows = entry.follows, None
    layer = follows[0]() if follows is not None else None
    if layer is None:
        return False
    held, written_from, version = getattr(layer, follows[1], None), follows[2], follows[3]
    if written_from is None:
        return held is source and old_rows == entry.seen_rows
    leading = source.data_ptr() == held.data_ptr() and source.stride() == held.stride()
    return owner(source) is held and leading and held._version == version + 1 and old_rows <= written_from


def reusable_end(
    entry: Entry | None, tag: tuple, source: torch.Tensor, positions: torch.Tensor, rows: range, same: bool = False
) -> int:
    """The end of the key rows from ``rows.start`` on (at most ``rows.stop``) that ``entry`` holds exactly as
    rotating ``source`` would give them; ``rows.start`` when none. ``same``: the rows are known to be the
    entry's (``continued``), only tag, positions and layout are checked."""
    start = rows.start
    if entry is None or entry.tag != tag or not entry.base <= start < min(rows.stop, entry.end):
        return start
    end, held = min(rows.stop, entry.end), entry.source
    if held.shape[:2] != source.shape[:2] or held.shape[3] != source.shape[3] or held.dtype != source.dtype:
        return start
    mine = slice(start - entry.base, end - entry.base)
    if not torch.equal(entry.positions[:, mine], positions[:, start:end]):
        return start
    return end if same or same_bits(held[:, :, mine], source[:, :, start:end]) else start


def fits(entry: Entry | None, source: torch.Tensor, fresh: torch.Tensor, start: int) -> bool:
    """Whether ``entry``'s buffers can hold key rows [start, kv) of ``source`` and rotated rows like ``fresh``."""
    if entry is None or entry.base > start or source.shape[2] - entry.base > entry.source.shape[2]:
        return False
    held, out = entry.source, entry.rotated
    if (out is held) != (fresh is source):  # one shared buffer, or two
        return False
    return (held.shape[:2], held.shape[3], held.dtype, held.device, out.shape[3], out.dtype) == (
        source.shape[:2],
        source.shape[3],
        source.dtype,
        source.device,
        fresh.shape[3],
        fresh.dtype,
    )


def room(entry: Entry | None, start: int, end: int, source, positions, fresh) -> Entry:
    """``entry`` when its buffers fit, else new buffers from row ``start`` with room for 1/8 more rows (at least
    64) holding ``entry``'s valid rows [start, end): a full copy every few steps, not every step."""
    if fits(entry, source, fresh, start):
        return entry
    b, h, kv, d = source.shape
    capacity = kv - start + max(64, (kv - start) // 8)
    copy = source.new_empty((b, h, capacity, d))
    turned = copy if fresh is source else fresh.new_empty((b, h, capacity, fresh.shape[3]))
    grown = Entry((), start, start, copy, positions.new_empty((b, capacity)), turned)
    if end > start:
        old = slice(start - entry.base, end - entry.base)
        put(grown, start, end, entry.source[:, :, old], entry.positions[:, old], entry.rotated[:, :, old])
    return grown


def put(entry: Entry, start: int, end: int, source, positions, rotated) -> None:
    """Write key rows [start, end): their unrotated copy, positions and rotation (one write when these share a
    buffer)."""
    rows = slice(start - entry.base, end - entry.base)
    entry.source[:, :, rows], entry.positions[:, rows] = source, positions
    if entry.rotated is not entry.source:
        entry.rotated[:, :, rows] = rotated


def rotated(
    module,
    purpose: str,
    tag: tuple,
    source: torch.Tensor,
    positions: torch.Tensor,
    old_rows: int,
    rotate: Callable | None,
    start: int = 0,
    own: int | None = None,
) -> torch.Tensor:
    """``rotate(source[:, :, start:], positions[:, start:])`` [B, Hkv, kv - start, d], reusing the rows of the
    module's last call where valid (``start`` > 0: a trailing window, as the near band while decoding).
    ``rotate`` None: the rows as they are (one buffer holds the copy and the result).

    ``old_rows``: rows of ``source`` that were already in the cache before this call (kv - q_len); only those can
    be reused, and the result is remembered only for calls that extend a cache (old_rows > 0) without autograd.
    ``own``: rows [own, kv) of the result are left unwritten and not remembered: the caller fills them.
    The returned view is valid until the module's next call.
    """
    turn = rotate or (lambda x, p: x)
    if old_rows <= 0 or (torch.is_grad_enabled() and source.requires_grad):
        result = turn(source[:, :, start:], positions[:, start:])
        return result.clone() if rotate is None else result
    memory = _MEMORY.setdefault(module, {})
    entry = memory.get(purpose)
    same = entry is not None and continued(entry, source, old_rows)
    end = reusable_end(entry, tag, source, positions, range(start, old_rows), same)
    kv = source.shape[2]
    stop = kv if own is None else max(end, own)
    fresh = turn(source[:, :, end:stop], positions[:, end:stop])
    entry = room(entry, start, end, source, positions, source if rotate is None else fresh)
    put(entry, end, stop, source[:, :, end:stop], positions[:, end:stop], fresh)
    entry.tag, entry.end = tag, stop
    entry.seen, entry.seen_version, entry.seen_rows = weakref.ref(owner(source)), source._version, kv
    memory[purpose] = entry
    return entry.rotated[:, :, start - entry.base : kv - entry.base]


def scratch(module, purpose: str, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """A float32 buffer of ``shape`` kept with the module's memory and handed out again at its next call (a
    step's temporaries without an allocation per step); its contents are the caller's."""
    held = _SCRATCH.setdefault(module, {}).get(purpose)
    if held is None or held.shape != shape or held.device != like.device:
        held = _SCRATCH[module][purpose] = like.new_empty(shape, dtype=torch.float32)
    return held


def forget(module) -> None:
    """Drop what ``module`` remembers (frees the rotated copies and scratch buffers)."""
    _MEMORY.pop(module, None)
    _SCRATCH.pop(module, None)
