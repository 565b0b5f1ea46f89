"""A single query's scores against every key slot turned by its own angle, while torch.compile traces a decode step,
without writing the turned keys.

Turning the whole cache (``rotation.rotate``) writes a tensor of the cache's size at every step and, compiled, has
the float64 cos and sin of each key's angles formed again for every element of every head (inductor inlines them
into the turn). Here the angles' cos and sin are formed once, by an operation the compiler keeps whole
(``hf_rope_ext::cos_sin``: ``rotation.scaled_cos_sin`` as a custom op, so its float64 work runs once per key and
pair and its float32 results are kept), and the scores are written as the sum over the rotary pairs of

    q . R(a) k = cos a (q1 k1 + q2 k2) + sin a (q2 k1 - q1 k2)

(per pair: R(a) k = (k1 cos a - k2 sin a, k2 cos a + k1 sin a), the rotation of ``rotation.turn``), which inductor
fuses into one reduction reading each cached key once. Dims past the rotary dims (partial rotary) add q . k.
xPos's key factors scale each pair's cos and sin; RoPER's turned values are summed under the weights the same way
(``turned_values``).
"""

from __future__ import annotations

import torch

from ..rotation import HALF, pairs, scaled_cos_sin

SCHEMA = "(Tensor positions, Tensor inv_freq, Tensor? log_scale=None) -> (Tensor, Tensor)"  # not read from hints
TOP = __name__.split(".")[0]  # "hf_rope_ext", or the private name of a copy vendored into remote code
OP = "hf_rope_ext::cos_sin" + ("" if TOP == "hf_rope_ext" else TOP)  # a copy registers an op of its own


@torch.library.custom_op(OP, mutates_args=(), schema=SCHEMA)
def kept_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, log_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotation.scaled_cos_sin`` (positions [...] -> float32 [..., r/2] twice; with ``log_scale`` [..., r/2], xPos,
    both times its exp) as one opaque op."""
    return scaled_cos_sin(positions, inv_freq, log_scale)


@kept_cos_sin.register_fake
def _(positions: torch.Tensor, inv_freq: torch.Tensor, log_scale: torch.Tensor | None = None):
    shape = (*positions.shape, inv_freq.shape[-1])
    return positions.new_empty(shape, dtype=torch.float32), positions.new_empty(shape, dtype=torch.float32)


def kept_angles(positions: torch.Tensor, inv_freq: torch.Tensor, log_scale=None):
    """cos, sin [B, 1, 1, kv, r/2] of positions [B, kv] (``log_scale`` [B, 1, kv, r/2] or None), for the products
    below ([B, Hkv, group, kv, ...])."""
    cos, sin = kept_cos_sin(positions[:, None], inv_freq, log_scale)
    return cos[:, :, None], sin[:, :, None]


def turned_scores(query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, inv_freq, log_scale=None):
    """query [B, H, 1, d] (turned already) against key [B, Hkv, kv, d] turned by positions [B, kv] (half layout; xPos:
    each pair also times exp(log_scale) [B, 1, kv, r/2]): q k^T [B, H, 1, kv] in the query's dtype, query head h
    reading kv head h // (H / Hkv)."""
    batch, heads, _, dim = query.shape
    kv_heads, kv = key.shape[1], key.shape[2]
    cos, sin = kept_angles(positions, inv_freq, log_scale)
    h = cos.shape[-1]
    q = query.float().reshape(batch, kv_heads, heads // kv_heads, 1, dim)  # [B, Hkv, group, 1, d]
    k = key.float()[:, :, None]  # [B, Hkv, 1, kv, d]
    (q1, q2), (k1, k2) = pairs(q, h, HALF), pairs(k, h, HALF)
    scores = (cos * (q1 * k1 + q2 * k2) + sin * (q2 * k1 - q1 * k2)).sum(-1)  # [B, Hkv, group, kv]
    if dim > 2 * h:  # partial rotary: the dims past r as they are
        scores = scores + (q[..., 2 * h :] * k[..., 2 * h :]).sum(-1)
    return scores.reshape(batch, heads, 1, kv).to(query.dtype)


def turned_values(weights: torch.Tensor, value: torch.Tensor, positions: torch.Tensor, inv_freq) -> torch.Tensor:
    """weights [B, H, 1, kv] @ value [B, Hkv, kv, dv] turned by positions [B, kv] (RoPER's values; half layout over
    the first 2 * len(inv_freq) dims): [B, H, 1, dv] in the value's dtype, summed over the keys in float32."""
    batch, heads, _, kv = weights.shape
    kv_heads, dim = value.shape[1], value.shape[-1]
    cos, sin = kept_angles(positions, inv_freq)
    h = cos.shape[-1]
    w = weights.float().reshape(batch, kv_heads, heads // kv_heads, kv, 1)  # [B, Hkv, group, kv, 1]
    v = value.float()[:, :, None]  # [B, Hkv, 1, kv, dv]
    v1, v2 = pairs(v, h, HALF)
    parts = [(w * (v1 * cos - v2 * sin)).sum(-2), (w * (v2 * cos + v1 * sin)).sum(-2)]  # [B, Hkv, group, h] each
    if dim > 2 * h:
        parts.append((w * v[..., 2 * h :]).sum(-2))
    return torch.cat(parts, dim=-1).reshape(batch, heads, 1, dim).to(value.dtype)
