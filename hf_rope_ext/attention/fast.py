"""The ``sdpa`` fast path: every attention-level type as a few standard attention calls, no dense [q, kv] score
or mask (``eager`` and the chunked two-score-matrix path in ``kernel`` stay the reference).

Two-band types (ReRoPE, leaky ReRoPE, Self-Extend) as two passes merged by their log-sum-exps (``lse.merge``):
- near band: |m - n| < window with q/k rotated by their true positions, in query blocks of ``near_block`` rows
  against only the keys in reach, with a [block, block + window] band mask;
- far band: n <= m - window, queries rotated by ``far_query(m)``, keys by ``far_key(n)`` (ReRoPE: not at all),
  as causal attention shifted by the window, in blocks of ``FAR_BLOCK`` rows (``lse.causal_lse``: no mask).
  Decoding (one query after a cache longer than the window) takes both bands in one call instead
  (``two_band_decode``): the window's keys turned to meet the far query, over remembered far keys.
This index arithmetic needs "regular" positions: each row's positions consecutive, queries the newest keys
(no cache, a cache extended by generate, shifted positions). Any given mask or irregular positions (left padding,
packed sequences, sliding-window masks) take the masked path: query blocks of at most ``MASK_BUDGET`` [rows x kv]
mask elements, each block's own slice of the given mask split into the two bands, columns cut to those in reach.
Single-band types (xPos, RoPER, the dynamic frequency types): one sdpa call (GQA in place) when possible, else
chunks merged by log-sum-exp. Not taken (returns None, the reference path runs): devices other than CPU,
dropout while training.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from . import rotated_cache
from .kernel import additive
from .lse import attention_lse, causal_lse, merge, needs_grad
from .positions import chunk_mask
from .rotation import rotate, rotate_each_row_by
from .scoring import Call, Scorer

FAR_BLOCK = 1024  # query rows per far-band block: its rotated queries and outputs are the temporaries
MASK_BUDGET = 2**22  # mask elements (rows x kv x batch) per query block of the masked path


def applicable(call: Call, dropout: float, training: bool) -> bool:
    return call.query.device.type == "cpu" and not (training and dropout > 0)


def regular(call: Call, mask) -> bool:
    """Each row's key positions consecutive, the queries being the newest keys (kv - q_len on)."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    if mask is None and (kv > q_len or q_len == 1):  # key_positions made them consecutive up to the last query
        return q_len == 1 or bool((call.q_pos[:, 1:] - call.q_pos[:, :-1] == 1).all())
    base = call.k_pos - torch.arange(kv, device=call.k_pos.device)
    start = base[:, :1]
    queries = call.q_pos - torch.arange(kv - q_len, kv, device=call.q_pos.device)
    return bool((base == start).all() and (queries == start).all())


def near_block(window: int) -> int:
    """Query rows per near-band block: each row reads block + window - 1 keys of which window are in its band."""
    return min(max(64, window // 4), 512)  # window 512: 128 rows, measured fastest of 64/128/256/512


def window_mask(p0: int, rows: int, lo: int, hi: int, window: int, dtype, device) -> torch.Tensor | None:
    """Additive [rows, hi - lo] mask: row p0 + a sees key lo + b iff 0 <= (p0 + a) - (lo + b) < window."""
    if p0 >= hi - 1 and p0 + rows - 1 - lo < window:  # every distance in [0, window): no mask (decode)
        return None
    d = torch.arange(p0, p0 + rows, device=device)[:, None] - torch.arange(lo, hi, device=device)[None, :]
    allowed = (d >= 0) & (d < window)
    if bool(allowed.all()):
        return None
    return torch.zeros((), dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


class Rows:
    """The result [B, H, q, dv] assembled from row blocks. Without autograd the blocks are written into one
    buffer laid out [B, q, H, dv], so the caller's ``transpose(1, 2).contiguous()`` copies nothing; with it
    they are concatenated (autograd cannot see through writes into a buffer)."""

    def __init__(self, call: Call, grad: bool):
        b, h, q_len, _ = call.query.shape
        shape, self.pieces = (b, q_len, h, call.value.shape[-1]), []
        self.buffer = None if grad else call.query.new_empty(shape).transpose(1, 2)

    def put(self, rows: slice, x: torch.Tensor) -> None:
        """Rows must come in order, each block once (or, for the buffer, overwrite earlier rows in place)."""
        if self.buffer is not None:
            self.buffer[:, :, rows] = x
        else:
            self.pieces.append(x)

    def result(self) -> torch.Tensor:
        return self.buffer if self.buffer is not None else torch.cat(self.pieces, dim=2)


def near_keys(module, call: Call, reach: int) -> torch.Tensor:
    """Keys [reach, kv) rotated by their positions; while decoding (one query, a cache) the rows shared with the
    previous step's window are reused."""
    if call.query.shape[2] > 1 or reach == 0:
        return rotate(call.key[:, :, reach:], call.k_pos[:, reach:], call.inv_freq)
    tag = ("near_key", tuple(call.inv_freq.tolist()))
    turn = lambda x, p: rotate(x, p, call.inv_freq)  # noqa: E731
    offset = call.key.shape[2] - 1
    return rotated_cache.rotated(call.memory, "near_key", tag, call.key, call.k_pos, offset, turn, start=reach)


def near_regular(module, call: Call, window: int, scale: float, grad: bool):
    """(out [B, H, q, dv], lse [B, H, q]) of the window band for every query, regular positions, no mask."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    offset, reach = kv - q_len, max(0, kv - q_len - window + 1)  # keys before ``reach`` are out of every band
    keys = near_keys(module, call, reach)
    out, lses, step = Rows(call, grad), [], near_block(window)
    for i0 in range(0, q_len, step):
        i1 = min(i0 + step, q_len)
        p0 = offset + i0
        lo, hi = max(0, p0 - window + 1), offset + i1
        q = rotate(call.query[:, :, i0:i1], call.q_pos[:, i0:i1], call.inv_freq)
        mask = window_mask(p0, i1 - i0, lo, hi, window, q.dtype, q.device)
        block, lse = attention_lse(q, keys[:, :, lo - reach : hi - reach], call.value[:, :, lo:hi], mask, False, scale)
        out.put(slice(i0, i1), block)
        lses.append(lse)
    return out.result(), torch.cat(lses, dim=2)


def far_rotation(scorer, call: Call, purpose: str):
    """(memory tag, rotate) of keys by far_key(n); rotate None when every far key sits at position 0 (ReRoPE:
    the unrotated keys themselves)."""
    unrotated = not bool(scorer.far_key(call.k_pos, call.params).any())
    params = tuple(sorted(map(str, call.params.items())))
    tag = (purpose, id(scorer), unrotated, tuple(call.inv_freq.tolist()), params)

    def far(x, positions):
        return rotate(x, scorer.far_key(positions, call.params), call.inv_freq)

    return tag, None if unrotated else far


def far_keys(scorer, module, call: Call, old_rows: int) -> torch.Tensor:
    """Keys [B, Hkv, kv, d] rotated by far_key(n) (ReRoPE: the unrotated keys themselves)."""
    tag, far = far_rotation(scorer, call, "far_key")
    if far is None:
        return call.key
    return rotated_cache.rotated(call.memory, "far_key", tag, call.key, call.k_pos, old_rows, far)


def decoding(call: Call) -> bool:
    """One query after a cache longer than the window, without autograd: ``two_band_decode`` applies."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    return q_len == 1 and kv > int(call.params["window"]) and not needs_grad(call.query, call.key, call.value)


def two_band_decode(scorer, module, call: Call, scale: float) -> torch.Tensor:
    """Both bands of one query in one attention call, [B, H, 1, dv]. The query is rotated for the far band,
    R(f(m)) q; far keys n <= m - window are R(g(n)) k as remembered across steps (f, g: ``far_query``,
    ``far_key``); the window's keys are rotated by n - m + f(m), so that their product with the far query is
    the near score (R(m) q) . (R(n) k): the remembered R(n) k of the window (``near_keys``) turned by
    f(m) - m, one angle per pair, written over the last ``window`` rows of the remembered far keys, which
    are not kept (each step rotates one more far row and turns the window anew)."""
    window, kv = int(call.params["window"]), call.key.shape[2]
    reach = kv - window  # keys [reach, kv) are in the window (regular positions)
    far_positions = scorer.far_query(call.q_pos, call.params)  # [B, 1]
    tag, far = far_rotation(scorer, call, "decode_key")  # far None (ReRoPE): the buffer is a copy of the keys
    keys = rotated_cache.rotated(call.memory, "decode_key", tag, call.key, call.k_pos, kv - 1, far, own=reach)
    near = near_keys(module, call, reach)  # R(n) k, n in [reach, kv)
    window_rows = keys[:, :, reach:]
    turned = None if keys.dtype == torch.float32 else rotated_cache.scratch(module, "turn", (2, *near.shape), near)
    rotate_each_row_by(near, far_positions - call.q_pos, call.inv_freq, window_rows, turned)
    q = rotate(call.query, far_positions, call.inv_freq)
    return attention_lse(q, keys, call.value, None, False, scale)[0]


def two_band_regular(scorer, module, call: Call, scale: float) -> torch.Tensor:
    """Near band and shifted-causal far band, merged row by row; [B, H, q, dv]."""
    window = int(call.params["window"])
    q_len, kv = call.query.shape[2], call.key.shape[2]
    offset, grad = kv - q_len, needs_grad(call.query, call.key, call.value)
    near_out, near_lse = near_regular(module, call, window, scale, grad)
    first_far = max(0, window - offset)  # rows with a far key: offset + row >= window
    if first_far >= q_len:
        return near_out
    keys, pieces = far_keys(scorer, module, call, offset), [near_out[:, :, :first_far]]
    for i0 in range(first_far, q_len, FAR_BLOCK):
        i1 = min(i0 + FAR_BLOCK, q_len)
        q = rotate(call.query[:, :, i0:i1], scorer.far_query(call.q_pos[:, i0:i1], call.params), call.inv_freq)
        far = causal_lse(q, keys, call.value, offset + i0 - window, scale)
        merged = merge((near_out[:, :, i0:i1], near_lse[:, :, i0:i1]), far, inplace=not grad)[0]
        pieces.append(merged)  # without autograd: merged in place into the buffer of ``Rows``
    return torch.cat(pieces, dim=2) if grad else near_out


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
    out, lse = attention_lse(q, k[:, :, lo:hi], v[:, :, lo:hi], mask[..., lo:hi], False, scale)
    empty = ~seen.any(-1)  # [B, 1, c]
    return out, lse.masked_fill(empty, float("-inf"))


def two_band_masked(scorer, module, call: Call, mask, causal: bool, scale: float) -> torch.Tensor:
    """Any mask and positions: per query block, the block's mask split into near and far columns."""
    window, q_len, kv = int(call.params["window"]), call.query.shape[2], call.key.shape[2]
    offset = kv - q_len
    near_keys, far = scorer.fast_keys(module, call, offset), far_keys(scorer, module, call, offset)
    outs = []
    for rows in block_rows(call, MASK_BUDGET):
        base = chunk_mask(mask, causal, rows, q_len, kv, call.query.device)
        base = torch.zeros((), dtype=call.query.dtype) if base is None else additive(base, call.query.dtype)
        m = call.q_pos[:, rows]
        beyond = ((m[:, :, None] - call.k_pos[:, None, :]) >= window)[:, None]  # [B, 1, c, kv]
        low = torch.tensor(torch.finfo(call.query.dtype).min, dtype=call.query.dtype)
        q = call.query[:, :, rows]
        near_mask, far_mask = torch.where(beyond, low, base), torch.where(beyond, base, low)
        near = band_piece(rotate(q, m, call.inv_freq), near_keys, call.value, near_mask, scale)
        q_far = rotate(q, scorer.far_query(m, call.params), call.inv_freq)
        beyond_piece = band_piece(q_far, far, call.value, far_mask, scale)
        outs.append(combine(near, beyond_piece, q))
    return torch.cat(outs, dim=2)


def combine(a, b, q):
    """The output of two band pieces (either may be None: no row sees that band)."""
    if a is None or b is None:
        piece = a or b
        return torch.zeros_like(q) if piece is None else piece[0]
    return merge(a, b)[0]


def single_band(scorer: Scorer, module, call: Call, mask, causal: bool, scale: float):
    """Plain RoPE scores (xPos scaled), RoPER's values: sdpa per chunk of ``scorer.fast_chunks``."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    offset, out = kv - q_len, Rows(call, needs_grad(call.query, call.key, call.value))
    values = scorer.fast_values(module, call, offset)
    chunks = [
        slice(i, min(i + FAR_BLOCK, c.stop))
        for c in scorer.fast_chunks(call)
        for i in range(c.start, c.stop, FAR_BLOCK)
    ]
    for rows in chunks:
        q, k = scorer.fast_query_keys(module, call, rows, offset)
        if mask is not None or not causal:
            rows_mask = None if mask is None else (mask[..., rows, :] if mask.shape[-2] > 1 else mask)
            block = F.scaled_dot_product_attention(q, k, values, attn_mask=rows_mask, scale=scale, enable_gqa=True)
        elif q_len == 1:  # decode: the grouped-query kernel call of ``attention_lse`` (faster than sdpa's here)
            return scorer.finish(call, attention_lse(q, k, values, None, False, scale)[0], rows)
        elif len(chunks) == 1 and offset == 0:  # one call: the output needs no buffer
            return scorer.finish(
                call, F.scaled_dot_product_attention(q, k, values, scale=scale, is_causal=True, enable_gqa=True), rows
            )
        else:
            block = causal_lse(q, k, values, offset + rows.start, scale)[0]
        out.put(rows, scorer.finish(call, block, rows))
    return out.result()


def run(scorer, module, call: Call, mask, causal: bool, scale: float, dropout: float, training: bool):
    """The fast path's output [B, H, q, dv], or None where it does not apply (the reference path runs)."""
    if not applicable(call, dropout, training):
        return None
    if scorer.bands_count == 1:
        return single_band(scorer, module, call, mask, causal, scale)
    if mask is None and causal and regular(call, mask):
        if decoding(call):
            return two_band_decode(scorer, module, call, scale)
        return two_band_regular(scorer, module, call, scale)
    return two_band_masked(scorer, module, call, mask, causal, scale)
