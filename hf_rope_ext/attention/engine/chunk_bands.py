"""The fast engine's chunked methods (Dual Chunk Attention) on increasing positions: per chunk of queries, three
standard attention pieces merged by their log-sum-exps (``lse.merge``), no [q, kv] score or mask.

A form with ``chunks`` declares chunks of c positions and three bands, the chunk gaps 0, 1 and >= 2, whose keys
are all rotated by one key position (DCA: n mod c). Key j stands at position k_pos[j], strictly increasing along
the keys and the same in every row of the batch (consecutive, or skip-wise as PoSE trains), and query row a is key
offset + a (offset = kv - q). Positions increasing, the keys of a chunk are a run of indices (``searchsorted``),
and index order is position order. The rows of chunk t (floor(m / c) = t) meet
- the keys of chunk t causally (gap 0): ``lse.causal_lse``, two pieces without a mask;
- the keys of chunk t - 1 (gap 1) and those before it (gap >= 2), each wholly seen: one piece each;
each with the query rotated by its band's query position. ``fast.run`` sends nothing else here (a mask, positions
that do not increase, queries that are not the newest keys, or rows at different positions take the reference
engine).
"""

from __future__ import annotations

import torch

from ..rotation import rotate
from . import rotated_cache, static_rows
from .banded import Band, Span, applies, banded, causal_spans
from .call import Call
from .kernels import attend_piece
from .lse import Rows, causal_lse, merge
from .piece import Piece, needs_grad


def positions_if_chunked(call: Call) -> tuple[int, int] | None:
    """(first, last) query position where the chunked engine applies, None where it does not: every row of the
    batch holds its keys at the same positions (chunk boundaries shared by the batch), strictly increasing along the
    keys, the queries being the newest keys. One read back from the device (on a GPU each one waits for the queue)."""
    k_pos, q_pos, q_len = call.k_pos, call.q_pos, call.query.shape[2]
    same = (k_pos == k_pos[:1]).all()
    rising = (k_pos[:, 1:] > k_pos[:, :-1]).all() & (q_pos == k_pos[:, k_pos.shape[1] - q_len :]).all()
    applies, first, last = torch.stack((same & rising, q_pos[0, 0], q_pos[0, -1])).tolist()
    return (first, last) if applies else None


def chunk_starts(call: Call, first: int, last: int) -> tuple[list[int], list[int]]:
    """(rows, keys): for t from floor(first / c) - 1 to floor(last / c) + 1, the index of the first query row and of
    the first key at or past position t c (the query count or key count where none is), one read back in all."""
    c = call.form.chunks(call.params)
    starts = torch.arange(
        (first // c - 1) * c, (last // c + 2) * c, c, dtype=call.k_pos.dtype, device=call.k_pos.device
    )
    found = torch.cat([torch.searchsorted(p[0].contiguous(), starts) for p in (call.q_pos, call.k_pos)]).tolist()
    return found[: len(starts)], found[len(starts) :]


def chunk_keys(call: Call, old_rows: int) -> torch.Tensor:
    """Keys [B, Hkv, kv, d] rotated by the bands' key position, remembered across decode steps."""
    band = call.form.bands[0]
    held = static_rows.kept(call, band.key_position)  # a static cache layer's, turned as written
    if held is not None:
        return held

    def turn(x, positions):
        return rotate(x, band.key_position(positions, call.params), call.inv_freq)

    return rotated_cache.rotated(call.memory, "chunk_key", call.tag, call.key, call.key_positions, old_rows, turn)


def band_query(call: Call, band: int, rows: slice) -> torch.Tensor:
    """Queries of rows ``rows`` rotated by band ``band``'s query position."""
    position = call.form.bands[band].query_position(call.q_pos[:, rows], call.params)
    return rotate(call.query[:, :, rows], position, call.inv_freq)


def chunk_rows(call: Call, rows: slice, keys: torch.Tensor, start: int, before: int, scale: float, grad: bool):
    """(out, lse) of the query rows ``rows`` of one chunk against every key they see: ``start`` is the index of the
    chunk's first key, ``before`` that of the chunk before it."""
    offset = call.key.shape[2] - call.query.shape[2]
    end = offset + rows.stop  # keys [start, end): the chunk up to the last row
    k, v = keys[:, :, start:end], call.value[:, :, start:end]
    found = causal_lse(band_query(call, 0, rows), k, v, offset + rows.start - start, scale)
    for band, (lo, hi) in ((1, (before, start)), (2, (0, before))):
        if hi > lo:
            q = band_query(call, band, rows)
            piece = attend_piece(q, keys[:, :, lo:hi], call.value[:, :, lo:hi], Piece(), scale)
            found = merge(found, piece, inplace=not grad)
    return found


def chunk_spans(call: Call, row_starts: list[int], key_starts: list[int]) -> tuple[list[Band], list[Span]]:
    """The pieces of ``chunk_rows`` for every chunk as spans (``banded``): three bands, one rotation of the keys; the
    bands hold positions and frequencies, not the call's tensors (see ``two_band.regular_spans``)."""
    offset, bands = call.key.shape[2] - call.query.shape[2], call.form.bands
    q_pos, k_pos, inv_freq, params = call.q_pos, call.k_pos, call.inv_freq, call.params

    def keys(key):
        return rotate(key, bands[0].key_position(k_pos, params), inv_freq)

    def queries(band):
        position = bands[band].query_position
        return lambda query, rows: rotate(query[:, :, rows], position(q_pos[:, rows], params), inv_freq)

    spans = []
    for i in range(1, len(row_starts) - 1):
        rows, start, before = slice(row_starts[i], row_starts[i + 1]), key_starts[i], key_starts[i - 1]
        if rows.stop > rows.start:
            spans += causal_spans(0, rows, offset + rows.start - start, base=start)
            spans += [Span(b, rows, lo, hi, Piece()) for b, lo, hi in ((1, before, start), (2, 0, before)) if hi > lo]
    return [Band(queries(b), keys) for b in range(3)], spans


def chunked(call: Call, first: int, last: int, scale: float) -> torch.Tensor:
    """The output [B, H, q, dv] of a chunked form, increasing positions from ``first`` to ``last``, no mask, the
    same positions in every row."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    offset, grad = kv - q_len, needs_grad(call.query, call.key, call.value)
    if grad and applies(call.query.device):  # autograd: only q, k, v, the output and its lse kept (``banded``)
        spans = chunk_spans(call, *chunk_starts(call, first, last))
        return banded(call.query, call.key, call.value, *spans, scale)
    keys, out = chunk_keys(call, offset), Rows(call.query, call.value.shape[-1], grad)
    row_starts, key_starts = chunk_starts(call, first, last)  # entry i: chunk floor(first / c) - 1 + i
    for i in range(1, len(row_starts) - 1):
        rows = slice(row_starts[i], row_starts[i + 1])
        if rows.stop > rows.start:  # the chunk has query rows (positions may skip chunks, as PoSE trains)
            out.put(rows, chunk_rows(call, rows, keys, key_starts[i], key_starts[i - 1], scale, grad)[0])
    return out.result()
