"""Rotating queries, keys, values and outputs by arbitrary (integer or fractional) positions.

Angles are formed in float64 (position * theta_i can reach 1e5 rad at 128k tokens, where float32 keeps only
~1e-2 rad), then cos/sin of each pair's angle are cast to float32 and applied with products in float32, as
:func:`hf_rope_ext.rotary.apply_rotary` does, but without its temporaries of the tensor's size (without autograd,
two multiplies and two fused multiply-adds into one buffer; xPos's per-pair scale rides on cos/sin). The in-model
layout is always ``"half"`` (pairs (i, i + d/2)); interleaved checkpoints are converted on load (layout.py).
"""

from __future__ import annotations

import functools

import torch

from ..frequencies.common import inv_freq_for_base, rope_setup

LAYOUT = "half"  # pairs (i, i + r/2)


def base_inv_freq(config, layer_type: str | None = None, device=None) -> torch.Tensor:
    """theta_i = b^(-2i/d) of plain RoPE for this config (rotary dim d), shape [d/2], float64 (shared: read only)."""
    setup = rope_setup(config, layer_type)
    return _inv_freq64(setup.base, setup.dim, str(torch.device(device or "cpu")))


@functools.lru_cache(maxsize=64)
def _inv_freq64(base: float, dim: int, device: str) -> torch.Tensor:
    return inv_freq_for_base(base, dim, device, dtype=torch.float64)


def half_cos_sin64(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, L] x inv_freq [d/2] -> cos, sin [B, 1, L, d/2] of one half (pair i's angle), float32."""
    if torch.is_autocast_enabled(positions.device.type):
        with torch.autocast(device_type=positions.device.type, enabled=False):
            return half_cos_sin64(positions, inv_freq)
    a = positions.to(torch.float64)[:, None, :, None] * inv_freq.to(positions.device, torch.float64)
    return a.cos().float(), a.sin().float()


ROWS = 2048  # rows per piece when rotating or scaling long tensors without autograd (bounds the temporaries)


def by_rows(function, x: torch.Tensor, *per_row: tuple[torch.Tensor, int]) -> torch.Tensor:
    """``function(x, *tensors)`` with x [B, H, L, ...] and each (tensor, axis) of ``per_row`` (length L along axis)
    cut into pieces of ROWS rows written into one output (row-wise functions only), so float32 temporaries stay a
    few pieces large."""
    rows = x.shape[2]
    if rows <= ROWS or (torch.is_grad_enabled() and x.requires_grad):
        return function(x, *(t for t, _ in per_row))
    out = x.new_empty(x.shape)
    for i in range(0, rows, ROWS):
        n = min(ROWS, rows - i)
        out[:, :, i : i + n] = function(x[:, :, i : i + n], *(t.narrow(axis, i, n) for t, axis in per_row))
    return out


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, log_scale=None) -> torch.Tensor:
    """Rotate x [B, H, L, head_dim] by positions [B, L]; dims past the rotary dim pass through (partial rotary).
    ``log_scale`` [B, 1, L, d/2] (xPos): each rotary pair also multiplied by its exp, in the same pass."""
    if log_scale is None:
        return by_rows(lambda x, p: _rotate(x, p, inv_freq), x, (positions, 1))
    return by_rows(lambda x, p, s: _rotate(x, p, inv_freq, s), x, (positions, 1), (log_scale, 2))


def turn_pairs(x1, x2, cos, sin, out: torch.Tensor) -> torch.Tensor:
    """Write (x1 c - x2 s, x2 c + x1 s) into out[..., :2h] (x1, x2 [..., h] float32 halves; a multiply and a fused
    multiply-add per half, no temporaries); returns out."""
    h = x1.shape[-1]
    torch.mul(x1, cos, out=out[..., :h]).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=out[..., h : 2 * h]).addcmul_(x1, sin)
    return out


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, log_scale=None) -> torch.Tensor:
    cos, sin = half_cos_sin64(positions, inv_freq)  # [B, 1, L, r/2]
    if log_scale is not None:
        scale = torch.exp(log_scale).float()
        cos, sin = cos * scale, sin * scale
    return turn(x, cos, sin)


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, L, head_dim] turned by cos, sin [B, 1, L, r/2] (of ``half_cos_sin64``): (x1, x2) -> (x1 c - x2 s,
    x2 c + x1 s) per pair (i, i + r/2), in float32, cast back to x's dtype; dims past r pass through."""
    h = cos.shape[-1]
    x1, x2 = x[..., :h].float(), x[..., h : 2 * h].float()
    if torch.is_grad_enabled() and x.requires_grad:
        turned = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    else:  # written in place into one buffer: no temporaries of x's size
        turned = turn_pairs(x1, x2, cos, sin, x1.new_empty((*x.shape[:-1], 2 * h))).to(x.dtype)
    return torch.cat((turned, x[..., 2 * h :]), dim=-1) if x.shape[-1] > 2 * h else turned
