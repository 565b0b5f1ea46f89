"""Rotating tensors by RoPE angles at arbitrary (integer or fractional) positions, in either layout: the one rotation
of the package (the attention engine's and RoFormer's).

Layouts of one head's rotary dims (r of them, r/2 pairs, pair i turns at frequency theta_i):
- ``"half"``: pairs (i, i + r/2), as GPT-NeoX and transformers' ``rotate_half`` (the engine's, always);
- ``"interleaved"``: pairs (2i, 2i + 1), as GPT-J, Meta's LLaMA, RoFormer.

The precision rule, one for every caller: angles position * theta_i are formed in float64 with autocast off
(position * theta_i reaches 1e5 rad at 128k tokens, where float32 keeps only ~1e-2 rad; float32 on MPS, which has
no float64), cos/sin of each pair's angle (times the caller's scale, still in float64) are cast to float32, and the
rotation's products are formed in float32 and cast back to the tensor's dtype. Without autograd the rotation writes
two multiplies and two fused multiply-adds into one buffer, with no temporaries of the tensor's size; long tensors
are rotated ROWS rows at a time (not while torch.compile traces: it fuses the plain form itself), except on the
devices of ``ONE_PASS`` (CUDA), where a long tensor is rotated in one pass by the plain form compiled (one fused kernel
per tensor, no float32 temporaries, a few operations whatever the length). Dims past the rotary dim r pass through
(partial rotary).
"""

from __future__ import annotations

import functools

import torch

from ..util.recompile_limit import with_recompile_limit

HALF, INTERLEAVED = "half", "interleaved"
ROWS = 2048  # rows per piece when rotating or scaling long tensors without autograd (bounds the temporaries)
ONE_PASS = {"cuda"}  # device types rotating a long tensor without autograd in one compiled pass (``one_pass``)


def angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """positions [...] x inv_freq [r/2] -> angles [..., r/2] in float64 (float32 on MPS), autocast off."""
    if torch.is_autocast_enabled(positions.device.type):
        with torch.autocast(device_type=positions.device.type, enabled=False):
            return angles(positions, inv_freq)
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    return positions.to(wide)[..., None] * inv_freq.to(positions.device, wide)


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [...] x inv_freq [r/2] -> cos * scale, sin * scale [..., r/2] of each pair's angle, float32
    (the engine passes positions [B, 1, L] for cos/sin [B, 1, L, r/2] that broadcast over heads)."""
    a = angles(positions, inv_freq)
    cos, sin = a.cos(), a.sin()
    if scale != 1.0:  # a number (1.0: no pass over the float64 angles for it)
        cos, sin = cos * scale, sin * scale
    return cos.float(), sin.float()


def pairs(x: torch.Tensor, h: int, layout: str = HALF) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the two members of each of the h pairs of x [..., >= 2h]: ([..., h], [..., h])."""
    if layout == HALF:
        return x[..., :h], x[..., h : 2 * h]
    return x[..., 0 : 2 * h : 2], x[..., 1 : 2 * h : 2]


def joined(first: torch.Tensor, second: torch.Tensor, layout: str = HALF) -> torch.Tensor:
    """The inverse of :func:`pairs`: first, second [..., h] -> [..., 2h] in ``layout``."""
    if layout == HALF:
        return torch.cat((first, second), dim=-1)
    return torch.stack((first, second), dim=-1).flatten(-2)


def turn_pairs(x1, x2, cos, sin, out: torch.Tensor, layout: str = HALF) -> torch.Tensor:
    """Write (x1 c - x2 s, x2 c + x1 s) into out[..., :2h] in ``layout`` (x1, x2 [..., h] float32 pair members; a
    multiply and a fused multiply-add per member, no temporaries); returns out."""
    first, second = pairs(out, x1.shape[-1], layout)
    torch.mul(x1, cos, out=first).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=second).addcmul_(x1, sin)
    return out


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = HALF) -> torch.Tensor:
    """x [..., head_dim] turned by cos, sin [..., r/2] (of :func:`cos_sin`, broadcast against x's leading dims):
    (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) per pair in ``layout``, in float32, cast back to x's dtype; dims past r
    pass through."""
    h = cos.shape[-1]
    x1, x2 = (part.float() for part in pairs(x, h, layout))
    if (torch.is_grad_enabled() and x.requires_grad) or torch.compiler.is_compiling():
        turned = joined(x1 * cos - x2 * sin, x2 * cos + x1 * sin, layout).to(x.dtype)
    else:  # written in place into one buffer: no temporaries of x's size
        shape = torch.broadcast_shapes(x1.shape, cos.shape)[:-1]
        turned = turn_pairs(x1, x2, cos, sin, x1.new_empty((*shape, 2 * h)), layout).to(x.dtype)
    return torch.cat((turned, x[..., 2 * h :]), dim=-1) if x.shape[-1] > 2 * h else turned


def by_rows(function, x: torch.Tensor, *per_row: tuple[torch.Tensor, int]) -> torch.Tensor:
    """``function(x, *tensors)`` with x [B, H, L, ...] and each (tensor, axis) of ``per_row`` (length L along axis)
    cut into pieces of ROWS rows written into one output (row-wise functions only), so float32 temporaries stay a
    few pieces large."""
    rows = x.shape[2]
    if rows <= ROWS or (torch.is_grad_enabled() and x.requires_grad) or torch.compiler.is_compiling():
        return function(x, *(t for t, _ in per_row))
    out = x.new_empty(x.shape)
    for i in range(0, rows, ROWS):
        n = min(ROWS, rows - i)
        out[:, :, i : i + n] = function(x[:, :, i : i + n], *(t.narrow(axis, i, n) for t, axis in per_row))
    return out


@functools.cache
def one_pass():
    """``_rotate`` compiled (dynamic shapes): its plain form, which inductor fuses into one kernel."""
    return with_recompile_limit(torch.compile(_rotate, dynamic=True))


def in_one_pass(x: torch.Tensor) -> bool:
    """Whether x [B, H, L, d] is rotated by ``one_pass``: longer than ROWS rows, on a ``ONE_PASS`` device, no
    autograd, not already being traced."""
    long = x.shape[2] > ROWS and x.device.type in ONE_PASS
    return long and not (torch.is_grad_enabled() and x.requires_grad) and not torch.compiler.is_compiling()


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, log_scale=None, layout: str = HALF):
    """Rotate x [B, H, L, head_dim] by positions [B, L]; dims past the rotary dim pass through (partial rotary).
    ``log_scale`` [B, 1, L, r/2] (xPos): each rotary pair also multiplied by its exp, in the same pass."""
    if in_one_pass(x):
        return one_pass()(x, positions, inv_freq, log_scale, layout)
    if log_scale is None:
        return by_rows(lambda x, p: _rotate(x, p, inv_freq, None, layout), x, (positions, 1))
    return by_rows(lambda x, p, s: _rotate(x, p, inv_freq, s, layout), x, (positions, 1), (log_scale, 2))


def scaled_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, log_scale=None):
    """:func:`cos_sin`, each pair's cos and sin also times exp(log_scale) [..., r/2] (xPos; None: unscaled)."""
    cos, sin = cos_sin(positions, inv_freq)
    if log_scale is None:
        return cos, sin
    scale = torch.exp(log_scale).float()
    return cos * scale, sin * scale


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, log_scale, layout: str):
    cos, sin = scaled_cos_sin(positions[:, None], inv_freq, log_scale)  # [B, 1, L, r/2]
    return turn(x, cos, sin, layout)
