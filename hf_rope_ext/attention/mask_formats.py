"""The masks flash-attention and flex hand to an attention function, in the form the engines take.

The engines take what transformers gives sdpa and eager: None (causal, the queries being the newest keys) or a
[B or 1, 1, q, kv] mask (bool, True = attend, or additive). The other implementations hand over their own:
- ``flash_attention_2/3/4``: None (causal), or a 2D [B, kv'] padding mask (True or 1 = a real token), kv' <= kv
  (a static cache's unfilled end is left out); a sliding layer's window comes as the ``sliding_window`` keyword, and
  packed sequences (batch 1, no mask) as position_ids that restart at 0, each restart opening a new document (the
  rule flash-attention's varlen path follows);
- ``flex_attention``: a ``BlockMask`` (block lists and a ``mask_mod``), an additive tensor mask, or None. The
  engine is given what compiled flex would attend: a fully listed block whole, a partly listed one where its
  ``mask_mod`` allows, an unlisted one not at all.
A mask that comes out causal with nothing else is handed on as None, so the engines take their unmasked plans; so is
sdpa's and eager's for several queries on a cache (``causal_on_cache``: transformers builds a [q, kv] mask there, where
without a cache it passes None), e.g. a long prompt read after a prefix already in the cache.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

FLASH = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
FLEX = "flex_attention"


def causal_distance(q_len: int, kv_len: int, device) -> torch.Tensor:
    """[q, kv] int64: key index of the query (queries are the newest keys) minus the key's index."""
    rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    return rows - torch.arange(kv_len, device=device)[None, :]


def packed_documents(position_ids: torch.Tensor | None, q_len: int, kv_len: int, simplify: bool = True):
    """[1, q] document index of each token of one packed row (positions restarting at 0), else None (also when the
    positions never drop, read from the device when ``simplify``; otherwise one document is that row's index)."""
    if position_ids is None or position_ids.shape[0] != 1 or q_len != kv_len or q_len < 2:
        return None
    if simplify and bool((position_ids[:, 1:] >= position_ids[:, :-1]).all()):
        return None
    return (position_ids == 0).long().cumsum(-1)


def flash_allowed(mask, q_len: int, kv_len: int, window: int | None, position_ids, device, simplify: bool = True):
    """flash's inputs -> None (plain causal) or [B or 1, 1, q, kv] bool: causal, its padding, window, documents."""
    documents = packed_documents(position_ids, q_len, kv_len, simplify) if mask is None else None
    windowed = window is not None and kv_len > window
    if mask is None and documents is None and not windowed:
        return None
    distance = causal_distance(q_len, kv_len, device)
    allowed = (distance >= 0) & (distance < window) if windowed else distance >= 0
    allowed = allowed[None, None]
    if mask is not None:
        if mask.ndim != 2 or mask.shape[-1] > kv_len:
            raise ValueError(f"a flash-attention mask of shape {tuple(mask.shape)} does not fit {kv_len} keys")
        keep = F.pad(mask.bool(), (0, kv_len - mask.shape[-1]))  # [B, kv]: unfilled static slots are not kept
        allowed = allowed & keep[:, None, None, :]
    if documents is not None:
        allowed = allowed & (documents[:, None, :, None] == documents[:, None, None, :])
    return allowed


def listed(counts: torch.Tensor, indices: torch.Tensor, columns: int) -> torch.Tensor:
    """Block lists (counts [B, H, nq], indices [B, H, nq, n]) -> [B, H, nq, columns] bool of the listed blocks."""
    counted = torch.arange(indices.shape[-1], device=indices.device) < counts[..., None]
    room = max(columns, indices.shape[-1])  # a mask built for a longer (padded) key length lists more blocks
    hits = torch.zeros(*indices.shape[:-1], room, dtype=torch.int32, device=indices.device)
    return hits.scatter_add_(-1, indices.long(), counted.int())[..., :columns] > 0


def block_mask_allowed(block_mask) -> torch.Tensor:
    """[B, 1, q, kv] bool of what compiled flex attends under ``block_mask`` (one mask for every head)."""
    from torch.nn.attention.flex_attention import create_mask

    rows, columns = block_mask.seq_lengths
    if block_mask.kv_num_blocks.shape[1] != 1:
        raise ValueError(
            f"a flex BlockMask with {block_mask.kv_num_blocks.shape[1]} head masks: the package's rope types take "
            "one mask for every head (H=None, as transformers builds it)"
        )
    q_block, kv_block = block_mask.BLOCK_SIZE
    n_columns = -(-columns // kv_block)
    row_block = torch.arange(rows, device=block_mask.kv_indices.device) // q_block
    column_block = torch.arange(columns, device=block_mask.kv_indices.device) // kv_block

    def spread(blocks: torch.Tensor) -> torch.Tensor:  # [B, 1, nq, nk] -> [B, 1, q, kv]
        return blocks[:, :, row_block][:, :, :, column_block]

    partly = spread(listed(block_mask.kv_num_blocks, block_mask.kv_indices, n_columns))
    modded = create_mask(block_mask.mask_mod, partly.shape[0], 1, rows, columns, device=partly.device)
    allowed = partly & modded
    if block_mask.full_kv_num_blocks is not None:
        allowed |= spread(listed(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n_columns))
    return allowed


CAUSAL_ROWS = 1024  # query rows read at a time by ``only_causal``


def only_causal(mask: torch.Tensor) -> bool:
    """Whether a [B or 1, 1, q, kv] mask (bool, True = attend; or additive, 0 = attend) lets each query see exactly
    the keys up to its own, the queries being the newest keys: no padding, no window. One pass in blocks of
    ``CAUSAL_ROWS`` rows (each: the keys before its first query all seen, the square of its own queries lower
    triangular, the keys after its last query none), so a 32k-token read on a cache needs no [q, kv] tensor more."""
    q_len, kv_len = mask.shape[-2:]
    if q_len > kv_len:
        return False
    offset = kv_len - q_len
    for r0 in range(0, q_len, CAUSAL_ROWS):
        r1 = min(r0 + CAUSAL_ROWS, q_len)
        rows = mask[..., r0:r1, :]
        seen = rows if rows.dtype == torch.bool else rows == 0  # [B, 1, c, kv]
        square = torch.ones(r1 - r0, r1 - r0, dtype=torch.bool, device=mask.device).tril()
        if not (seen[..., : offset + r0].all() and bool((seen[..., offset + r0 : offset + r1] == square).all())):
            return False
        if seen[..., offset + r1 :].any():
            return False
    return True


def engine_mask(implementation: str, mask, q_len: int, kv_len: int, kwargs: dict, device, simplify: bool = True):
    """The mask ``implementation`` handed over, as the engines take it (see the module docstring). ``simplify``:
    a mask read back from the device and found only causal is handed on as None (not while torch.compile traces)."""
    if implementation in FLASH:
        window, positions = kwargs.get("sliding_window"), kwargs.get("position_ids")
        allowed = flash_allowed(mask, q_len, kv_len, window, positions, device, simplify)
    elif implementation == FLEX and mask is not None and not isinstance(mask, torch.Tensor):
        allowed = block_mask_allowed(mask)
    else:
        return mask
    return None if allowed is None or (simplify and only_causal(allowed)) else allowed


def causal_on_cache(mask, q_len: int, kv_len: int):
    """None for a [B or 1, 1, q, kv] mask of several queries on a cache (kv > q) that is only causal, else ``mask``.
    Applied after a static cache's unfilled slots are cut (``engine.call.crop_empty_slots``), which reads None with
    more keys than queries as an empty static cache."""
    several_on_cache = isinstance(mask, torch.Tensor) and mask.ndim == 4 and 1 < q_len < kv_len
    if several_on_cache and tuple(mask.shape[-2:]) == (q_len, kv_len) and checked_causal(mask):
        return None
    return mask


MASKS_KEPT = 8  # masks whose reads are kept: a model may hand its layers a few (full and sliding-window layers, cut)
_PER_MASK: list = []  # [(weak reference to a mask, its version, {key: value})], the newest last


def per_mask(mask: torch.Tensor, key, compute):
    """``compute()`` once for a mask every layer of a forward is handed (the same tensor object alive and, outside
    inference mode, the same version since): what is read back from it is read once a forward, not once a layer."""
    now = None if mask.is_inference() else mask._version
    found = next((entry for entry in _PER_MASK if entry[0]() is mask and entry[1] == now), None)
    if found is None:
        _PER_MASK[:] = [entry for entry in _PER_MASK[-(MASKS_KEPT - 1) :] if entry[0]() is not None]
        found = (weakref.ref(mask), now, {})
        _PER_MASK.append(found)
    values = found[2]
    if key not in values:
        values[key] = compute()
    return values[key]


def checked_causal(mask: torch.Tensor) -> bool:
    """``only_causal(mask)``, read once for the mask every layer of a forward is handed (``per_mask``)."""
    return per_mask(mask, "only_causal", lambda: only_causal(mask))


def seen_keys(mask: torch.Tensor) -> torch.Tensor:
    """[B or 1, kv] bool: the keys a one-query mask [B or 1, 1, 1, kv] (bool, or additive) lets its row see."""
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return allowed.reshape(allowed.shape[0], allowed.shape[-1])


def graded(mask: torch.Tensor) -> torch.Tensor:
    """0-dim bool: whether an additive mask holds a value other than 0 on a key it lets be seen (a bias the scores
    take, which no plan that reads the mask as seen / hidden may drop); False for a bool mask."""
    if mask.dtype == torch.bool:
        return torch.zeros((), dtype=torch.bool, device=mask.device)
    return ((mask != 0) & (mask > torch.finfo(mask.dtype).min / 2)).any()


def hidden_first(seen: torch.Tensor) -> torch.Tensor:
    """[2] int64 of seen [B or 1, kv] bool: (every key seen, each row sees the keys from some index on, the last
    included)."""
    suffix = (seen[:, 1:] >= seen[:, :-1]).all() & seen[:, -1].all()  # never hidden after a seen key
    return torch.stack((seen.all(), suffix)).long()


def is_step_mask(mask, q_len: int) -> bool:
    """Whether ``mask`` is a decode step's: one query, a [B or 1, 1, 1, kv] tensor (what ``step_padding`` reads)."""
    return q_len == 1 and isinstance(mask, torch.Tensor) and mask.ndim == 4 and tuple(mask.shape[1:3]) == (1, 1)


def step_padding(mask: torch.Tensor) -> tuple[int, str, torch.Tensor]:
    """What a decode step's mask [B or 1, 1, 1, kv] hides, read once for all the layers handed it (``per_mask``):
    (end: past the last key a row sees, a static cache's filled length; what the mask's first ``end`` keys hide:
    "none", "left" (each row sees the keys from some index on, the newest included: left padding, a sliding window)
    or "other" (anything else, or an additive mask with a bias: ``graded``); the mask cut to ``end``, known to
    ``per_mask`` as such, so the layers read nothing more from it).
    One read where the newest key is seen (a dynamic cache), two where it is not (a static cache's unfilled end)."""

    def read() -> tuple[int, str, torch.Tensor]:
        seen = seen_keys(mask)  # [B or 1, kv]
        kv = seen.shape[-1]
        every, left, biased = torch.cat((hidden_first(seen), graded(mask).long().view(1))).tolist()
        if biased:  # an additive mask with a bias: the general masked path applies it
            return kv, "other", mask
        if every or left:
            return kv, "none" if every else "left", mask
        end = kv - seen.any(0).flip(0).to(torch.uint8).argmax()  # past the last seen key (none seen: kv)
        filled = seen | (torch.arange(kv, device=seen.device) >= end)  # the unfilled end counted as seen
        end, every, left = torch.cat((end.view(1), hidden_first(filled))).tolist()
        kind = "none" if every else "left" if left else "other"
        if end == kv or kind == "other":
            return end, kind, mask
        cut = mask[..., :end]
        return per_mask(cut, "step_padding", lambda: (end, kind, cut))

    return per_mask(mask, "step_padding", read)
