"""Softmax attention of one query chunk over one or two score "bands", as ``eager`` or ``sdpa``.

A band is a (queries, keys) pair of rotated tensors. Two-band methods (ReRoPE-like, Self-Extend) score a query
against a key with the second band where ``far`` is True (relative distance at or past the window) and with the
first band elsewhere. Both implementations give the same softmax:
- eager: both score matrices [B, H, c, kv], ``torch.where``, additive mask, fp32 softmax (as transformers' eager);
- sdpa: one call over 2*kv keys: query [q0 | q1] (2d dims), keys [k0 | 0] then [0 | k1], values twice,
  and a mask that lets each key column through only in its own band.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass
class Bands:
    queries: list[torch.Tensor]  # 1 or 2 x [B, H, c, d]
    keys: list[torch.Tensor]  # as many x [B, H, kv, d]
    far: torch.Tensor | None = None  # [B, 1, c, kv] bool: True where the second band scores the pair


def additive(mask: torch.Tensor | None, dtype) -> torch.Tensor | None:
    """A bool mask (True = attend) as 0 / finfo.min; float masks are already additive."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def eager(bands: Bands, value, mask, scale: float, dropout: float, training: bool, softcap=None) -> torch.Tensor:
    """Explicit scores, as transformers' eager_attention_forward; returns [B, H, c, dv].

    ``softcap`` (Gemma 2's attn_logit_softcapping): each scaled score s becomes softcap * tanh(s / softcap).
    """
    scores = bands.queries[0] @ bands.keys[0].transpose(-1, -2)
    if bands.far is not None:
        scores = torch.where(bands.far, bands.queries[1] @ bands.keys[1].transpose(-1, -2), scores)
    scores = scores * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + additive(mask, scores.dtype)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(bands.queries[0].dtype)
    return F.dropout(weights, p=dropout, training=training) @ value


def band_mask(mask: torch.Tensor | None, far: torch.Tensor) -> torch.Tensor:
    """The mask over [near keys | far keys]: each column allowed in its band only, [B, 1, c, 2 kv]."""
    if mask is None or mask.dtype == torch.bool:
        allowed = torch.ones_like(far) if mask is None else mask.expand_as(far)
        return torch.cat((allowed & ~far, allowed & far), dim=-1)
    low = torch.finfo(mask.dtype).min
    mask = mask.expand(far.shape)
    return torch.cat((mask.masked_fill(far, low), mask.masked_fill(~far, low)), dim=-1)


def stack_bands(bands: Bands, value: torch.Tensor):
    """Two bands as one sdpa problem: q [B,H,c,2d], k [B,H,2kv,2d], v [B,H,2kv,dv]."""
    (q0, q1), (k0, k1) = bands.queries, bands.keys
    query = torch.cat((q0, q1), dim=-1)
    key = torch.cat((torch.cat((k0, torch.zeros_like(k1)), -1), torch.cat((torch.zeros_like(k0), k1), -1)), dim=-2)
    return query, key, torch.cat((value, value), dim=-2)


def sdpa(bands: Bands, value, mask, scale: float, dropout: float, training: bool, is_causal=False) -> torch.Tensor:
    """torch's scaled_dot_product_attention on the same problem; returns [B, H, c, dv]."""
    dropout = dropout if training else 0.0
    if bands.far is None:
        q, k, v = bands.queries[0], bands.keys[0], value
    else:
        q, k, v = stack_bands(bands, value)
        mask = band_mask(mask, bands.far)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale, is_causal=is_causal)


KERNELS = {"eager": eager, "sdpa": sdpa}
