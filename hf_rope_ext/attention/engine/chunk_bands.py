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

from ...layout.rotation import rotate
from . import rotated_cache
from .call import Call
from .kernels import attend_piece
from .lse import Rows, causal_lse, merge
from .piece import Piece, needs_grad


def same_rows(call: Call) -> bool:
    """Every row of the batch holds its keys at the same positions (chunk boundaries shared by the batch)."""
    return bool((call.k_pos == call.k_pos[:1]).all())


def increasing(call: Call) -> bool:
    """Key positions strictly increasing along the keys, the queries being the newest keys (their positions the
    last q of them): a chunk's keys and rows are runs of indices, causal by index."""
    q_len, k_pos = call.query.shape[2], call.k_pos
    rising = bool((k_pos[:, 1:] > k_pos[:, :-1]).all())
    return rising and bool((call.q_pos == k_pos[:, k_pos.shape[1] - q_len :]).all())


def first_at(positions: torch.Tensor, position: int) -> int:
    """Index of the first of the increasing ``positions`` [n] at or past ``position`` (n when none)."""
    return int(torch.searchsorted(positions.contiguous(), torch.tensor([position], device=positions.device)))


def chunk_keys(call: Call, old_rows: int) -> torch.Tensor:
    """Keys [B, Hkv, kv, d] rotated by the bands' key position, remembered across decode steps."""
    band = call.form.bands[0]

    def turn(x, positions):
        return rotate(x, band.key_position(positions, call.params), call.inv_freq)

    return rotated_cache.rotated(call.memory, "chunk_key", call.tag, call.key, call.k_pos, old_rows, turn)


def band_query(call: Call, band: int, rows: slice) -> torch.Tensor:
    """Queries of rows ``rows`` rotated by band ``band``'s query position."""
    position = call.form.bands[band].query_position(call.q_pos[:, rows], call.params)
    return rotate(call.query[:, :, rows], position, call.inv_freq)


def chunk_rows(call: Call, rows: slice, keys: torch.Tensor, t: int, scale: float, grad: bool):
    """(out, lse) of the query rows ``rows`` of chunk t against every key they see."""
    c, k_pos = call.form.chunks(call.params), call.k_pos[0]
    offset = call.key.shape[2] - call.query.shape[2]
    start, before = first_at(k_pos, t * c), first_at(k_pos, (t - 1) * c)  # first key of chunk t, of chunk t - 1
    end = offset + rows.stop  # keys [start, end): chunk t up to the last row
    k, v = keys[:, :, start:end], call.value[:, :, start:end]
    found = causal_lse(band_query(call, 0, rows), k, v, offset + rows.start - start, scale)
    for band, (lo, hi) in ((1, (before, start)), (2, (0, before))):
        if hi > lo:
            q = band_query(call, band, rows)
            piece = attend_piece(q, keys[:, :, lo:hi], call.value[:, :, lo:hi], Piece(), scale)
            found = merge(found, piece, inplace=not grad)
    return found


def chunked(call: Call, scale: float) -> torch.Tensor:
    """The output [B, H, q, dv] of a chunked form, increasing positions, no mask, the same positions in every row."""
    c, q_pos = call.form.chunks(call.params), call.q_pos[0]
    q_len, kv = call.query.shape[2], call.key.shape[2]
    offset, grad = kv - q_len, needs_grad(call.query, call.key, call.value)
    keys, out = chunk_keys(call, offset), Rows(call.query, call.value.shape[-1], grad)
    i0 = 0
    while i0 < q_len:
        t = int(q_pos[i0]) // c
        i1 = first_at(q_pos, (t + 1) * c)  # past the last row of chunk t
        out.put(slice(i0, i1), chunk_rows(call, slice(i0, i1), keys, t, scale, grad)[0])
        i0 = i1
    return out.result()
