"""The fast engine's one-band forms (xPos, RoPER, the dynamic frequency types): plain RoPE queries and keys (xPos scaled
relative to a reference, ``decay_and_value_turns``), RoPER's rotated values, per chunk of query rows: one sdpa call when
possible, else pieces merged by log-sum-exp. Keys and values rotated at earlier decode steps are reused (the decode
step itself: ``single_band_decode``).

With autograd every chunk goes through the device's piece kernel (``kernels``), never torch's sdpa: on an H200
(torch 2.11, bfloat16, ``benchmarks/check_engines.py``'s backward case) the gradients through sdpa's CUDA call were
wrong in each of two runs for one of xPos and RoPER (another each time: q, k and v gradients off by 1.5 times the
reference's largest), while every type whose gradients go through the pieces was right in both runs; the pieces run
the same way on CPU, where the tests check them."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..rotation import rotate
from . import rotated_cache, static_rows
from .call import Call, chunk_mask
from .decay_and_value_turns import (
    decay_rows,
    key_log_scale,
    query_log_scale,
    segments,
    turn_output_back,
    value_inv_freq,
)
from .kernels import attend_piece, piece_rows
from .lse import Rows, causal_lse
from .piece import Piece, needs_grad
from .reference import additive

ROWS = 1024  # query rows per chunk at most: its rotated queries and outputs are the temporaries


def rotated_keys(call: Call, old_rows: int, last: torch.Tensor | None = None) -> torch.Tensor:
    """Keys [B, Hkv, kv, d] rotated by their positions (rows before ``old_rows`` remembered from earlier steps;
    ``last``: the newest one already rotated)."""
    if "rotated_keys" not in call.state:
        by = lambda x, p: rotate(x, p, call.inv_freq)  # noqa: E731
        held = static_rows.kept(call, None)  # a static cache layer's, turned as written (RoPER's)
        if held is None:
            memory, positions = call.memory, call.key_positions
            held = rotated_cache.rotated(memory, "key", call.tag, call.key, positions, old_rows, by, 0, last)
        call.state["rotated_keys"] = held
    return call.state["rotated_keys"]


def rotated_values(call: Call, old_rows: int, last: torch.Tensor | None = None) -> torch.Tensor:
    """Values [B, Hkv, kv, dv]; RoPER's rotated by their positions, remembered across decode steps."""
    if call.form.values is None:
        return call.value
    held = static_rows.kept(call, None, values=True)  # a static cache layer's, turned as written
    if held is not None:
        return held
    inv_freq = value_inv_freq(call)
    by = lambda x, p: rotate(x, p, inv_freq)  # noqa: E731
    return rotated_cache.rotated(call.memory, "value", call.tag, call.value, call.key_positions, old_rows, by, 0, last)


def decay_half(call: Call) -> int:
    """xPos chunks hold half the decay row limit, so the reference r (a multiple of it) stays within the bound."""
    return max(1, decay_rows(call) // 2)


def decayed_query_keys(call: Call, rows: slice, old_rows: int):
    """xPos: queries scaled by zeta^((m - r)/s), keys by zeta^((r - n)/s), r the multiple of ``decay_half``
    just above the chunk's largest position; each rotated and scaled in one pass (``rotate``'s log_scale)."""
    half, m = decay_half(call), call.q_pos[:, rows]
    ref = (m.max(dim=-1, keepdim=True).values // half + 1) * half  # [B, 1]
    q = rotate(call.query[:, :, rows], m, call.inv_freq, query_log_scale(call, m, ref))

    def scaled(x, n):
        return rotate(x, n, call.inv_freq, key_log_scale(call, n, ref))

    reference = tuple(ref.flatten().tolist())
    if old_rows <= 0:  # prefill: keys rotated and scaled once per reference
        memo = ("xpos_keys", reference)
        if memo not in call.state:
            call.state.pop(call.state.get("xpos_last"), None)  # the previous reference's keys: done with
            call.state[memo], call.state["xpos_last"] = scaled(call.key, call.k_pos), memo
        return q, call.state[memo]
    tag = ("xpos_key", call.tag, reference)
    return q, rotated_cache.rotated(call.memory, "xpos_key", tag, call.key, call.key_positions, old_rows, scaled)


def query_keys(call: Call, rows: slice, old_rows: int):
    """(queries [B, H, c, d], keys [B, Hkv, kv, d]) of one chunk, ready for plain attention."""
    if call.form.decay is not None:
        return decayed_query_keys(call, rows, old_rows)
    return rotate(call.query[:, :, rows], call.q_pos[:, rows], call.inv_freq), rotated_keys(call, old_rows)


def chunks(call: Call) -> list[slice]:
    """Query row chunks: the segments, cut to ROWS rows where the kernel needs row blocks (``kernels.piece_rows``;
    xPos: to ``decay_half`` rows first, on every device)."""
    limit = decay_half(call) if call.form.decay is not None else None
    cut = [
        slice(i, min(i + (limit or stop - start), stop))
        for start, stop in segments(call)
        for i in range(start, stop, limit or stop - start)
    ]
    rows = piece_rows(call.query.device, ROWS, call.query.shape[2])
    return [slice(i, min(i + rows, c.stop)) for c in cut for i in range(c.start, c.stop, rows)]


def masked_piece(call: Call, q, k, values, mask, causal: bool, rows: slice, scale: float) -> torch.Tensor:
    """Query rows ``rows`` [B, H, c, dv] under the given mask (or none, attention not causal) as one piece of the
    device's kernel (a row the mask hides entirely: what the kernel gives, as sdpa's own choice for such rows)."""
    given = chunk_mask(mask, causal, rows, call.query.shape[2], call.key.shape[2], q.device)
    return attend_piece(q, k, values, Piece(mask=additive(given, q.dtype)), scale)[0]


def single_band(call: Call, mask, causal: bool, scale: float) -> torch.Tensor:
    """Plain RoPE scores (xPos scaled), RoPER's values: [B, H, q, dv]."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    grad = needs_grad(call.query, call.key, call.value)  # pieces only (see the module's docstring)
    offset, out = kv - q_len, Rows(call.query, call.value.shape[-1], grad)
    values, chunk_list = rotated_values(call, offset), chunks(call)
    for rows in chunk_list:
        q, k = query_keys(call, rows, offset)
        if (mask is not None or not causal) and grad:
            block = masked_piece(call, q, k, values, mask, causal, rows, scale)
        elif mask is not None or not causal:
            rows_mask = None if mask is None else (mask[..., rows, :] if mask.shape[-2] > 1 else mask)
            block = F.scaled_dot_product_attention(q, k, values, attn_mask=rows_mask, scale=scale, enable_gqa=True)
        elif len(chunk_list) == 1 and offset == 0 and not grad:  # one call: the output needs no buffer
            block = F.scaled_dot_product_attention(q, k, values, scale=scale, is_causal=True, enable_gqa=True)
            return turn_output_back(call, block, rows)
        else:
            block = causal_lse(q, k, values, offset + rows.start, scale)[0]
        out.put(rows, turn_output_back(call, block, rows))
    return out.result()
