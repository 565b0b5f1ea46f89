"""Rotating queries, keys, values and outputs by arbitrary (integer or fractional) positions.

Angles are formed in float64 (position * theta_i can reach 1e5 rad at 128k tokens, where float32 keeps only
~1e-2 rad), then cos/sin are cast to float32 and applied by :func:`hf_rope_ext.rotary.apply_rotary`. The in-model
layout is always ``"half"`` (pairs (i, i + d/2)); interleaved checkpoints are converted on load (layout.py).
"""

from __future__ import annotations

import functools

import torch

from ..frequencies.common import inv_freq_for_base, rope_setup
from ..rotary import apply_rotary

LAYOUT = "half"


def base_inv_freq(config, layer_type: str | None = None, device=None) -> torch.Tensor:
    """theta_i = b^(-2i/d) of plain RoPE for this config (rotary dim d), shape [d/2], float64 (shared: read only)."""
    setup = rope_setup(config, layer_type)
    return _inv_freq64(setup.base, setup.dim, str(torch.device(device or "cpu")))


@functools.lru_cache(maxsize=64)
def _inv_freq64(base: float, dim: int, device: str) -> torch.Tensor:
    return inv_freq_for_base(base, dim, device, dtype=torch.float64)


def cos_sin64(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, L] x inv_freq [d/2] -> cos, sin [B, 1, L, d] (half layout, head axis 1), float32."""
    if torch.is_autocast_enabled(positions.device.type):
        with torch.autocast(device_type=positions.device.type, enabled=False):
            return cos_sin64(positions, inv_freq)
    a = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device, torch.float64)
    a = torch.cat((a, a), dim=-1)[:, None]
    return a.cos().float(), a.sin().float()


ROWS = 2048  # rows per piece when rotating or scaling long tensors without autograd (bounds the temporaries)


def by_rows(function, x: torch.Tensor, per_row: torch.Tensor, axis: int, *args) -> torch.Tensor:
    """``function(x, per_row, *args)`` with x [B, H, L, ...] and per_row's ``axis`` of length L cut into pieces of
    ROWS rows written into one output (row-wise functions only), so float32 temporaries stay a few pieces large."""
    rows = x.shape[2]
    if rows <= ROWS or (torch.is_grad_enabled() and x.requires_grad):
        return function(x, per_row, *args)
    out = x.new_empty(x.shape)
    for i in range(0, rows, ROWS):
        out[:, :, i : i + ROWS] = function(x[:, :, i : i + ROWS], per_row.narrow(axis, i, min(ROWS, rows - i)), *args)
    return out


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, L, head_dim] by positions [B, L]; dims past the rotary dim pass through (partial rotary)."""
    return by_rows(_rotate, x, positions, 1, inv_freq)


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    cos, sin = cos_sin64(positions, inv_freq)
    return apply_rotary(x, cos, sin, LAYOUT)


def scale_pairs(x: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    """Multiply each rotary pair of x [B, H, L, head_dim] by exp(log_scale) [B, 1, L, d/2]; other dims unchanged."""
    return by_rows(_scale_pairs, x, log_scale, 2)


def _scale_pairs(x: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    s = torch.exp(torch.cat((log_scale, log_scale), dim=-1)).float()
    d = s.shape[-1]
    scaled = (x[..., :d].float() * s).to(x.dtype)
    return torch.cat((scaled, x[..., d:]), dim=-1) if x.shape[-1] > d else scaled
