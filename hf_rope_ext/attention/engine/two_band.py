"""The fast engine's two-band methods (ReRoPE, leaky ReRoPE, Self-Extend) on regular positions: two passes of
standard attention pieces merged by their log-sum-exps (``lse.merge``), no [q, kv] score or mask.

With w = ``window``, f / g the far band's query / key positions (``form.far``):
- near band (0 <= m - n < w, q/k rotated by their true positions): query blocks of ``near_block`` rows, each a
  window piece over only the keys in its reach [block start - w + 1, block end);
- far band (n <= m - w): queries rotated by f(m), keys by g(n) (ReRoPE: not at all), causal attention shifted by
  the window in blocks of FAR_BLOCK rows (``lse.causal_lse``: one unmasked piece plus one causal square).
Row blocks are the CPU kernel's; on CUDA a band is one block of every row, or a few for long prompts
(``kernels.piece_rows``).
Regular positions: each row's positions consecutive and the queries the newest keys (no cache, a cache extended
by ``generate``, shifted positions); ``masked`` takes everything else.
"""

from __future__ import annotations

import torch

from ..methods.form import origin
from ..rotation import rotate
from . import rotated_cache, static_rows
from .banded import Band, Span, applies, banded, causal_spans
from .call import Call
from .kernels import attend_piece, piece_rows
from .lse import Rows, causal_lse, merge
from .piece import Piece, needs_grad

FAR_BLOCK = 1024  # query rows per far-band block: its rotated queries and outputs are the temporaries


def near_block(window: int) -> int:
    """Query rows per near-band block: each row reads block + window - 1 keys of which window are in its band."""
    return min(max(64, window // 4), 512)  # window 512: 128 rows (block sizes tuned over 64/128/256/512)


def near_keys(call: Call, reach: int, last: torch.Tensor | None = None) -> torch.Tensor:
    """Keys [reach, kv) rotated by their positions; while decoding (one query, a cache) the rows shared with the
    previous step's window are reused (``last``: the newest key already rotated)."""
    if call.query.shape[2] > 1:
        return rotate(call.key[:, :, reach:], call.k_pos[:, reach:], call.inv_freq)
    turn = lambda x, p: rotate(x, p, call.inv_freq)  # noqa: E731
    offset = call.key.shape[2] - 1
    memory = call.memory
    return rotated_cache.rotated(memory, "near_key", call.tag, call.key, call.key_positions, offset, turn, reach, last)


def far_keys(call: Call, old_rows: int, last: torch.Tensor | None = None, stop: int | None = None) -> torch.Tensor:
    """Keys [B, Hkv, kv, d] (``stop``: the first ``stop`` of them) rotated by g(n), remembered across decode steps
    (ReRoPE's ``origin``: the keys as cached, no copy)."""
    far = call.form.far
    if far.key_position is origin:
        return call.key if stop is None else call.key.narrow(2, 0, stop)
    held = static_rows.kept(call, far.key_position)  # a static cache layer's, turned as written
    if held is not None:
        return held if stop is None else held.narrow(2, 0, stop)

    def turn(x, positions):
        return rotate(x, far.key_position(positions, call.params), call.inv_freq)

    keys = call.key_positions
    return rotated_cache.rotated(call.memory, "far_key", call.tag, call.key, keys, old_rows, turn, 0, last, stop)


def far_queries(call: Call, rows: slice) -> torch.Tensor:
    """Queries of rows ``rows`` rotated by f(m)."""
    m = call.q_pos[:, rows]
    return rotate(call.query[:, :, rows], call.form.far.query_position(m, call.params), call.inv_freq)


def near_regular(call: Call, window: int, scale: float, grad: bool):
    """(out [B, H, q, dv], lse [B, H, q]) of the window band for every query, regular positions, no mask."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    offset, reach = kv - q_len, max(0, kv - q_len - window + 1)  # keys before ``reach`` are out of every band
    keys = near_keys(call, reach)
    out, lses = Rows(call.query, call.value.shape[-1], grad), []
    step = piece_rows(call.query.device, near_block(window), q_len)  # query rows per window piece
    for i0 in range(0, q_len, step):
        i1 = min(i0 + step, q_len)
        lo, hi = max(0, offset + i0 - window + 1), offset + i1
        q = rotate(call.query[:, :, i0:i1], call.q_pos[:, i0:i1], call.inv_freq)
        piece = Piece(row0=offset + i0, column0=lo, low=0, high=window)
        block, lse = attend_piece(q, keys[:, :, lo - reach : hi - reach], call.value[:, :, lo:hi], piece, scale)
        out.put(slice(i0, i1), block)
        lses.append(lse)
    return out.result(), torch.cat(lses, dim=2)


def regular_spans(call: Call, window: int) -> tuple[list[Band], list[Span]]:
    """The near and far bands of regular positions as spans (``banded``): the same pieces as the plan below. The bands
    hold positions and frequencies, never the call's q, k or v (the autograd graph keeps them until the backward, past
    what activation checkpointing frees)."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    offset, reach, far = kv - q_len, max(0, kv - q_len - window + 1), call.form.far
    q_pos, k_pos, inv_freq, params = call.q_pos, call.k_pos, call.inv_freq, call.params

    def near_queries(query, rows):
        return rotate(query[:, :, rows], q_pos[:, rows], inv_freq)

    def far_queries_of(query, rows):
        return rotate(query[:, :, rows], far.query_position(q_pos[:, rows], params), inv_freq)

    def far_keys_of(key):
        return key if far.key_position is origin else rotate(key, far.key_position(k_pos, params), inv_freq)

    bands = [
        Band(near_queries, lambda key: rotate(key[:, :, reach:], k_pos[:, reach:], inv_freq), reach),
        Band(far_queries_of, far_keys_of),
    ]
    spans, step = [], piece_rows(call.query.device, near_block(window), q_len)
    for i0 in range(0, q_len, step):
        i1 = min(i0 + step, q_len)
        lo = max(0, offset + i0 - window + 1)
        spans.append(Span(0, slice(i0, i1), lo, offset + i1, Piece(row0=offset + i0, column0=lo, low=0, high=window)))
    first_far = max(0, window - offset)
    step = piece_rows(call.query.device, FAR_BLOCK, max(1, q_len - first_far))
    for i0 in range(first_far, q_len, step):
        spans += causal_spans(1, slice(i0, min(i0 + step, q_len)), offset + i0 - window)
    return bands, spans


def two_band_regular(call: Call, scale: float) -> torch.Tensor:
    """Near band and shifted-causal far band, merged row by row; [B, H, q, dv]."""
    window = int(call.params["window"])
    q_len, kv = call.query.shape[2], call.key.shape[2]
    offset, grad = kv - q_len, needs_grad(call.query, call.key, call.value)
    if grad and applies(call.query.device):  # autograd: only q, k, v, the output and its lse kept (``banded``)
        return banded(call.query, call.key, call.value, *regular_spans(call, window), scale)
    near_out, near_lse = near_regular(call, window, scale, grad)
    first_far = max(0, window - offset)  # rows with a far key: offset + row >= window
    if first_far >= q_len:
        return near_out
    step = piece_rows(call.query.device, FAR_BLOCK, q_len - first_far)
    keys, pieces = far_keys(call, offset), [near_out[:, :, :first_far]]
    for i0 in range(first_far, q_len, step):
        i1 = min(i0 + step, q_len)
        far = causal_lse(far_queries(call, slice(i0, i1)), keys, call.value, offset + i0 - window, scale)
        merged = merge((near_out[:, :, i0:i1], near_lse[:, :, i0:i1]), far, inplace=not grad)[0]
        pieces.append(merged)  # without autograd: merged in place into the buffer of ``Rows``
    return torch.cat(pieces, dim=2) if grad else near_out
