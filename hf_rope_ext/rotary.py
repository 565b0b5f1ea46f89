"""Rotating tensors by RoPE angles, in either layout, with angles computed in fp32.

Layouts of one head's rotary dims (d of them, d/2 pairs, pair i turns at frequency theta_i):
- ``"half"``: pairs (i, i + d/2), as GPT-NeoX and transformers' ``rotate_half``;
- ``"interleaved"``: pairs (2i, 2i+1), as GPT-J, Meta's LLaMA, RoFormer.
"""

from __future__ import annotations

import torch


def angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """positions [..., L] (any dtype) x inv_freq [d/2] -> angles [..., L, d/2] in fp32, autocast off."""
    with torch.autocast(device_type=positions.device.type, enabled=False):
        return positions[..., None].to(torch.float32) * inv_freq.to(device=positions.device, dtype=torch.float32)


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0, layout: str = "half"):
    """cos and sin per rotary dim, shape [..., L, d], ordered for ``layout``; fp32."""
    a = angles(positions, inv_freq)
    a = torch.cat((a, a), dim=-1) if layout == "half" else a.repeat_interleave(2, dim=-1)
    return a.cos() * scale, a.sin() * scale


def rotate_pairs(x: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """The 90-degree turn of every pair: (a, b) -> (-b, a), in the given layout; x [..., d]."""
    if layout == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """Rotate the first cos.shape[-1] dims of x [..., d_head]; the rest (partial rotary) pass through.

    cos/sin broadcast against x's leading dims; the product is formed in fp32 and cast back to x's dtype.
    """
    d = cos.shape[-1]
    rot, rest = x[..., :d], x[..., d:]
    out = rot.float() * cos + rotate_pairs(rot.float(), layout) * sin
    return torch.cat((out.to(x.dtype), rest), dim=-1) if rest.shape[-1] else out.to(x.dtype)
