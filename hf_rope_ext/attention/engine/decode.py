"""The fast engine's decode step of the two-band methods: one query after a cache longer than the window, as two
pieces over keys remembered across steps (``rotated_cache``), merged by their log-sum-exps.

With w = ``window``, m the query's position and f / g the far band's query / key positions, keys [0, kv - w) are
beyond the window and keys [kv - w, kv) inside it (regular positions):
- near piece: R(m) q against the window's keys R(n) k, of which each step rotates only the new one;
- far piece: R(f(m)) q against R(g(n)) k, of which each step rotates only the new one (ReRoPE: the cached keys
  themselves, no copy).
Each piece is one grouped-query kernel call; the two read the cache once between them, as plain decoding does.
The angles of a step (m and f(m) for the query, m and g(m) for the new key) are formed once, in one pass.
"""

from __future__ import annotations

import torch

from ..methods.form import origin
from ..rotation import cos_sin, turn
from .call import Call
from .kernels import attend_piece
from .piece import Piece, needs_grad
from .two_band import far_keys, near_keys


def decoding(call: Call) -> bool:
    """One query after a cache longer than the window, without autograd: ``two_band_decode`` applies."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    return q_len == 1 and kv > int(call.params["window"]) and not needs_grad(call.query, call.key, call.value)


def step_angles(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [P, B, 1, 1, r/2] at positions m, f(m) (the query's) and, unless the far keys stay unrotated, m, g(m)
    (the new key's): one leading row per position, so that each turned row is a contiguous [B, heads, 1, d]."""
    m, far = call.q_pos, call.form.far  # m [B, 1]
    positions = [m, far.query_position(m, call.params)]
    if far.key_position is not origin:
        positions += [m, far.key_position(m, call.params)]
    cos, sin = cos_sin(torch.cat(positions, dim=1)[:, None], call.inv_freq)  # [B, 1, P, r/2]; cat: the widest dtype
    return cos.permute(2, 0, 1, 3)[:, :, :, None], sin.permute(2, 0, 1, 3)[:, :, :, None]


def merge_two(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The softmax over both pieces' keys, neither empty: a's weight is sigmoid(l_a - l_b); [B, H, 1, dv]."""
    (o1, l1), (o2, l2) = a, b
    weight = torch.sigmoid(l1 - l2)[..., None]  # [B, H, 1, 1] float32
    return torch.lerp(o2.float(), o1.float(), weight).to(o1.dtype)


def two_band_decode(call: Call, scale: float) -> torch.Tensor:
    """Both bands of one query, [B, H, 1, dv] (module docstring)."""
    kv = call.key.shape[2]
    reach = kv - int(call.params["window"])  # keys [reach, kv) are in the window
    cos, sin = step_angles(call)
    q_near, q_far = turn(call.query.expand(2, -1, -1, -1, -1), cos[:2], sin[:2])  # R(m) q, R(f(m)) q
    new = call.key[:, :, -1:]  # [B, Hkv, 1, d], at position m
    if cos.shape[0] > 2:  # R(m) k and R(g(m)) k of the new key
        near_last, far_last = turn(new.expand(2, -1, -1, -1, -1), cos[2:], sin[2:])
    else:
        near_last, far_last = turn(new, cos[0], sin[0]), None
    near_k = near_keys(call, reach, near_last)
    far_k = far_keys(call, kv - 1, far_last)[:, :, :reach]
    near = attend_piece(q_near, near_k, call.value[:, :, reach:], Piece(), scale)
    far = attend_piece(q_far, far_k, call.value[:, :, :reach], Piece(), scale)
    return merge_two(near, far)
