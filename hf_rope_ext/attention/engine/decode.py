"""The fast engine's decode step of the two-band methods: one query after a cache longer than the window, both
bands in one attention call over keys remembered across steps (``rotated_cache``)."""

from __future__ import annotations

import torch

from . import rotated_cache
from .call import Call
from .kernels import attend_piece
from .pieces import Piece, needs_grad
from .rotation import rotate, rotate_each_row_by
from .two_band import far_rotation, near_keys


def decoding(call: Call) -> bool:
    """One query after a cache longer than the window, without autograd: ``two_band_decode`` applies."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    return q_len == 1 and kv > int(call.params["window"]) and not needs_grad(call.query, call.key, call.value)


def two_band_decode(call: Call, module, scale: float) -> torch.Tensor:
    """Both bands of one query in one attention call, [B, H, 1, dv]. The query is rotated for the far band,
    R(f(m)) q; far keys n <= m - window are R(g(n)) k as remembered across steps (f, g: the far band's
    positions); the window's keys are rotated by n - m + f(m), so that their product with the far query is
    the near score (R(m) q) . (R(n) k): the remembered R(n) k of the window (``near_keys``) turned by
    f(m) - m, one angle per pair, written over the last ``window`` rows of the remembered far keys, which
    are not kept (each step rotates one more far row and turns the window anew)."""
    window, kv = int(call.params["window"]), call.key.shape[2]
    reach = kv - window  # keys [reach, kv) are in the window (regular positions)
    far_positions = call.form.far.query_position(call.q_pos, call.params)  # [B, 1]
    tag, far = far_rotation(call, "decode_key")  # far None (ReRoPE): the buffer is a copy of the keys
    keys = rotated_cache.rotated(call.memory, "decode_key", tag, call.key, call.k_pos, kv - 1, far, own=reach)
    near = near_keys(call, reach)  # R(n) k, n in [reach, kv)
    window_rows = keys[:, :, reach:]
    turned = None if keys.dtype == torch.float32 else rotated_cache.scratch(module, "turn", (2, *near.shape), near)
    rotate_each_row_by(near, far_positions - call.q_pos, call.inv_freq, window_rows, turned)
    q = rotate(call.query, far_positions, call.inv_freq)
    return attend_piece(q, keys, call.value, Piece(), scale)[0]
