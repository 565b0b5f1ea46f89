"""Per-layer memory of rotated keys (and values) for decoding, so a new token does not re-rotate the whole cache.

The KV cache holds unrotated keys; the fast path needs them rotated (the far band of leaky ReRoPE and
Self-Extend, every key for xPos and RoPER). Rotating 16k keys with float64 angles takes about 4x one decode
step's attention, so calls that extend a cache (more keys than queries, no autograd) keep, per attention module
and purpose, the rotated rows and what they were computed from. The next call reuses a prefix of them only when
it provably holds the same thing: the same rotation tag (frequencies, parameters, reference), the same key
positions, and the same unrotated keys: either the very view of memory seen before, not written since (its
version counter; memory written in place, as a static cache, is never compared with itself), or a tensor equal
to it element by element on that prefix (transformers' DynamicCache makes a new
tensor by concatenation at every step, so this comparison runs and costs one read of the cached keys). Anything
else (another prompt, beam reordering, a cropped cache refilled, a static cache written in place) recomputes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Entry:
    tag: tuple
    source: torch.Tensor  # [B, Hkv, n, d] the unrotated tensor the rows were computed from
    version: int  # source._version when stored
    positions: torch.Tensor  # [B, n] int64
    rotated: torch.Tensor  # [B, Hkv, capacity, d]: rows [0, n) hold the rotated rows, the rest is room to grow


_MEMORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {purpose: Entry}


def reusable_rows(entry: Entry | None, tag: tuple, source: torch.Tensor, positions: torch.Tensor, limit: int) -> int:
    """How many leading rows (at most ``limit``) of ``entry`` hold exactly what rotating ``source`` would give."""
    if entry is None or entry.tag != tag or limit <= 0:
        return 0
    n = min(limit, entry.positions.shape[1])
    if entry.source.shape[:2] != source.shape[:2] or entry.source.dtype != source.dtype:
        return 0
    if not torch.equal(entry.positions[:, :n], positions[:, :n]):
        return 0
    if entry.source.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
        # the same memory (a static cache, written in place): only an unwritten, identical view can be trusted
        same_view = entry.source.data_ptr() == source.data_ptr() and entry.source.stride() == source.stride()
        return n if same_view and source._version == entry.version else 0
    return n if torch.equal(entry.source[:, :, :n], source[:, :, :n]) else 0


def rotated(
    module, purpose: str, tag: tuple, source: torch.Tensor, positions: torch.Tensor, old_rows: int, rotate: Callable
) -> torch.Tensor:
    """``rotate(source, positions)`` [B, Hkv, kv, d], reusing the rows of the module's last call where valid.

    ``old_rows``: rows of ``source`` that were already in the cache before this call (kv - q_len); only those can
    be reused, and the result is remembered only for calls that extend a cache (old_rows > 0) without autograd.
    The rows live in a buffer with room for kv/8 more rows, so a step writes only its new rows (a full copy every
    kv/8 steps); the returned view is valid until the module's next call.
    """
    if old_rows <= 0 or (torch.is_grad_enabled() and source.requires_grad):
        return rotate(source, positions)
    memory = _MEMORY.setdefault(module, {})
    entry = memory.get(purpose)
    n = reusable_rows(entry, tag, source, positions, old_rows)
    kv = source.shape[2]
    buffer = entry.rotated if n > 0 and entry.rotated.shape[2] >= kv else None
    if buffer is None:
        shape = (*source.shape[:2], kv + max(64, kv // 8), source.shape[3])  # room for kv/8 more steps
        buffer = source.new_empty(shape)
        if n > 0:
            buffer[:, :, :n] = entry.rotated[:, :, :n]
    buffer[:, :, n:kv] = rotate(source[:, :, n:], positions[:, n:])
    memory[purpose] = Entry(tag, source, source._version, positions, buffer)
    return buffer[:, :, :kv]


def forget(module) -> None:
    """Drop what ``module`` remembers (frees the rotated copies)."""
    _MEMORY.pop(module, None)


@dataclass
class Window:
    tag: tuple
    start: int  # first key row held
    source: torch.Tensor  # [B, Hkv, w, d] a copy of the unrotated rows [start, start + w)
    positions: torch.Tensor  # [B, w]
    rotated: torch.Tensor  # [B, Hkv, w, d]


def window_rows(module, purpose: str, tag: tuple, source: torch.Tensor, positions: torch.Tensor, start: int, rotate):
    """``rotate(source[:, :, start:], positions[:, start:])`` for a short trailing window (the near band while
    decoding), reusing the rows it shares with the module's last window once their unrotated copies and
    positions compare equal (a comparison of window rows, not of the cache)."""
    if torch.is_grad_enabled() and source.requires_grad:
        return rotate(source[:, :, start:], positions[:, start:])
    memory = _MEMORY.setdefault(module, {})
    old, kv = memory.get(purpose), source.shape[2]
    shift = None if old is None or old.tag != tag else start - old.start
    shared = 0 if shift is None or shift < 0 else max(0, min(old.source.shape[2] - shift, kv - start))
    if shared and not (
        old.source.shape[:2] == source.shape[:2]
        and torch.equal(old.positions[:, shift : shift + shared], positions[:, start : start + shared])
        and torch.equal(old.source[:, :, shift : shift + shared], source[:, :, start : start + shared])
    ):
        shared = 0
    rotated = old.rotated[:, :, shift : shift + shared] if shared else None
    if start + shared < kv:
        fresh = rotate(source[:, :, start + shared :], positions[:, start + shared :])
        rotated = fresh if rotated is None else torch.cat((rotated, fresh), dim=2)
    memory[purpose] = Window(tag, start, source[:, :, start:].clone(), positions[:, start:].clone(), rotated)
    return rotated
