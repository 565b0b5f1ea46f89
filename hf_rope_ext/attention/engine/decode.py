"""The fast engine's decode step of the two-band methods: one query after a cache longer than the window, as two
pieces over keys remembered across steps (``rotated_cache``), merged by their log-sum-exps.

With w = ``window``, m the query's position and f / g the far band's query / key positions, keys [0, kv - w) are
beyond the window and keys [kv - w, kv) inside it (regular positions):
- near piece: R(m) q against the window's keys R(n) k, of which each step rotates only the new one;
- far piece: R(f(m)) q against R(g(n)) k, of which each step rotates only the new one (ReRoPE: the cached keys
  themselves, no copy).
Each piece is one grouped-query kernel call; the two read the cache once between them, as plain decoding does, and
are merged once by their log-sum-exps (``union``).
The angles of a step (m and f(m) for the query, m and g(m) for the new key) are formed once, in one pass, and each
of the query and the new key is turned by all of them at once (``step_turns``): on a cache layer's remembered rows a
step reads nothing back from the device and dispatches a few dozen operations.
"""

from __future__ import annotations

import torch

from ..methods.form import origin
from .call import Call
from .padding import Padding, padded_piece
from .piece import needs_grad
from .step_turns import partner_index, per_step, signed_freq, step_cos_sin, turn_step
from .two_band import far_keys, near_keys
from .union import attend_union


def decoding(call: Call) -> bool:
    """One query after a cache longer than the window, without autograd: ``two_band_decode`` applies."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    return q_len == 1 and kv > int(call.params["window"]) and not needs_grad(call.query, call.key, call.value)


def step_positions(call: Call) -> list[torch.Tensor]:
    """[B, 1] positions of a step: m and f(m) (the query's in each band) and, unless the far keys stay unrotated,
    g(m) (the new key's far position)."""
    m, far = call.q_pos, call.form.far
    positions = [m, far.query_position(m, call.params)]
    return positions if far.key_position is origin else [*positions, far.key_position(m, call.params)]


def grouped(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """One query [B, H, 1, d] as [B, Hkv, H / Hkv, d]: the query heads of each kv head as rows of one problem."""
    b, h, _, d = query.shape
    return query.view(b, kv_heads, h // kv_heads, d)


def two_band_decode(call: Call, scale: float, padding: Padding | None = None) -> torch.Tensor:
    """Both bands of one query, [B, H, 1, dv] (module docstring); ``padding``: keys before a row's first hidden."""
    b, h, _, d = call.query.shape
    kv, kv_heads = call.key.shape[2], call.key.shape[1]
    reach = kv - int(call.params["window"])  # keys [reach, kv) are in the window
    freq = signed_freq(call, call.inv_freq, "key", d)
    cos, sin = per_step(call, ("two_band", d), lambda: step_cos_sin(torch.stack(step_positions(call)), freq))
    partner = partner_index(call, call.inv_freq.shape[-1], d)  # cos, sin [P, B, 1, 1, d]
    q_near, q_far, *_ = turn_step(grouped(call.query, kv_heads), cos, sin, partner).unbind(0)  # R(m) q, R(f(m)) q
    new = turn_step(call.key.narrow(2, kv - 1, 1), cos, sin, partner).unbind(0)  # R(m) k, R(f(m)) k, R(g(m)) k
    near_k = near_keys(call, reach, new[0])
    far_k = far_keys(call, kv - 1, new[-1] if cos.shape[0] > 2 else None, stop=reach)
    near_value, far_value = call.value.narrow(2, reach, kv - reach), call.value.narrow(2, 0, reach)
    near = (q_near, near_k, near_value, padded_piece(padding, reach, kv))
    far = (q_far, far_k, far_value, padded_piece(padding, 0, reach))  # lse ~ -3e38 where all hidden
    return attend_union([near, far], scale).view(b, h, 1, -1)
