"""The fast engine's two-band methods with any mask and positions (left padding, packed sequences, sliding-window
masks, several new tokens on a cache): query blocks of at most MASK_BUDGET [rows x kv] mask elements, each block's
slice of the given mask split by distance into a near and a far piece, each piece cut to the columns that some
row of the block sees. Memory stays bounded by the block; the far piece reads every key up to the block."""

from __future__ import annotations

import torch

from ..rotation import rotate
from .call import Call, chunk_mask
from .kernels import attend_piece
from .lse import merge
from .piece import Piece
from .reference import additive
from .two_band import far_keys, far_queries

MASK_BUDGET = 2**22  # mask elements (rows x kv x batch) per query block of the masked path


def block_rows(call: Call, budget: int) -> list[slice]:
    batch, q_len, kv = call.query.shape[0], call.query.shape[2], call.key.shape[2]
    size = max(1, budget // (batch * kv))
    return [slice(i, min(i + size, q_len)) for i in range(0, q_len, size)]


def band_piece(q, k, v, mask: torch.Tensor, scale: float):
    """(out, lse) over the columns of ``mask`` [B, 1, c, kv] (additive) that any row may see; lse -inf for rows
    that see none. Returns None when no row sees any column."""
    low = torch.finfo(mask.dtype).min / 2
    seen = mask > low  # [B, 1, c, kv]
    columns = seen.flatten(0, 2).any(0).nonzero()
    if columns.numel() == 0:
        return None
    lo, hi = int(columns[0]), int(columns[-1]) + 1
    out, lse = attend_piece(q, k[:, :, lo:hi], v[:, :, lo:hi], Piece(mask=mask[..., lo:hi]), scale)
    empty = ~seen.any(-1)  # [B, 1, c]
    return out, lse.masked_fill(empty, float("-inf"))


def combine(a, b, q):
    """The output of two band pieces (either may be None: no row sees that band)."""
    if a is None or b is None:
        piece = a or b
        return torch.zeros_like(q) if piece is None else piece[0]
    return merge(a, b)[0]


def band_masks(call: Call, mask, causal: bool, rows: slice):
    """(near, far) additive masks [B, 1, c, kv] of query rows ``rows``: the given (or causal) mask split by
    distance at the window."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    base = chunk_mask(mask, causal, rows, q_len, kv, call.query.device)
    base = torch.zeros((), dtype=call.query.dtype) if base is None else additive(base, call.query.dtype)
    m = call.q_pos[:, rows]
    beyond = ((m[:, :, None] - call.k_pos[:, None, :]) >= int(call.params["window"]))[:, None]  # [B, 1, c, kv]
    low = torch.tensor(torch.finfo(call.query.dtype).min, dtype=call.query.dtype)
    return torch.where(beyond, low, base), torch.where(beyond, base, low)


def two_band_masked(call: Call, near_keys: torch.Tensor, mask, causal: bool, scale: float) -> torch.Tensor:
    """Any mask and positions: per query block, the block's mask split into near and far columns. ``near_keys``:
    every key rotated by its position [B, Hkv, kv, d]."""
    offset, outs = call.key.shape[2] - call.query.shape[2], []
    far = far_keys(call, offset)
    for rows in block_rows(call, MASK_BUDGET):
        near_mask, far_mask = band_masks(call, mask, causal, rows)
        q = call.query[:, :, rows]
        near = band_piece(rotate(q, call.q_pos[:, rows], call.inv_freq), near_keys, call.value, near_mask, scale)
        beyond = band_piece(far_queries(call, rows), far, call.value, far_mask, scale)
        outs.append(combine(near, beyond, q))
    return torch.cat(outs, dim=2)
