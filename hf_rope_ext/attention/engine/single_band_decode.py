"""The fast engine's decode step of the one-band forms (xPos, RoPER, plain RoPE of the dynamic types): one query after a
cache, every key seen (or all but each row's first: left padding, ``padding``); the query and the new key (and RoPER's
new value) turned at the query's position m in one pass each (``step_turns``), the cached rows remembered
(``rotated_cache``), one kernel call with the query heads of each kv head as its rows. On a cache layer's rows nothing
is read back from the device.

xPos's reference is a key index, not a position: keys are held scaled by zeta^((R - j)/s), j the key's index and R
the multiple of ``decay_half`` just above the newest index, and the query by zeta^((kv - 1 - R)/s); with positions
consecutive up to the query (what a decode step without a mask has: ``call``) their product is zeta^((m - n)/s),
and R, known on the host, moves on every ``decay_half`` steps (then the rows are scaled anew).
"""

from __future__ import annotations

import torch

from ..rotation import rotate
from . import rotated_cache
from .call import Call
from .decay_and_value_turns import key_log_scale, log_zeta, value_inv_freq
from .decode import grouped
from .padding import Padding, padded_piece
from .single_band import decay_half, rotated_keys, rotated_values
from .step_turns import partner_index, per_step, signed_freq, step_cos_sin, turn_step
from .union import attend_union


def angles(call: Call, inv_freq: torch.Tensor, name: str, width: int):
    """(cos, sin [B, 1, 1, width] float32, partner [width]) of the query's position for a frequency set (the first
    layer of a step computes them, ``per_step``)."""
    freq = signed_freq(call, inv_freq, name, width)
    cos, sin = per_step(call, ("one_band", name, width), lambda: step_cos_sin(call.q_pos, freq))
    return cos, sin, partner_index(call, inv_freq.shape[-1], width)


def full_log_zeta(call: Call, width: int) -> torch.Tensor:
    """[width] float64: log zeta_i at both members of pair i, 0 past the rotary dims (their factor stays 1)."""

    def compute():
        half = log_zeta(call)
        return torch.cat((half, half, half.new_zeros(width - 2 * half.shape[-1])))

    return call.constant(("full_log_zeta", width), compute)


def decayed(call: Call, q, new, cos, sin, partner):
    """xPos: (the query turned and scaled [B, Hkv, g, d], the keys [B, Hkv, kv, d] turned and scaled) with the
    index reference of the module docstring."""
    kv, half, width = call.key.shape[2], decay_half(call), q.shape[-1]
    reference = ((kv - 1) // half + 1) * half
    exponent = (kv - 1 - reference) / call.form.decay.scale(call.params)  # <= 0

    def scales():  # the query's factor, >= 1 and at most zeta_0^(-half / s): within the exponent bound; the key's
        q_scale = (full_log_zeta(call, width) * exponent).exp().float()
        return q_scale, q_scale.reciprocal()

    q_scale, k_scale = per_step(call, ("xpos_scales", width, exponent), scales)

    def scaled(x, n):  # rows at positions n: the reference as a position, m - (kv - 1) + R
        return rotate(x, n, call.inv_freq, key_log_scale(call, n, call.q_pos - (kv - 1 - reference)))

    last = turn_step(new, cos * k_scale, sin * k_scale, partner)
    tag = ("xpos_key", call.tag, "index", reference)
    keys = rotated_cache.rotated(call.memory, "xpos_key", tag, call.key, call.key_positions, kv - 1, scaled, 0, last)
    return turn_step(q, cos * q_scale, sin * q_scale, partner), keys


def decode_step(call: Call, scale: float, padding: Padding | None = None) -> torch.Tensor:
    """One query after a cache, every key seen (``padding``: but those before a row's first): [B, H, 1, dv]."""
    b, h, _, d = call.query.shape
    old_rows = call.key.shape[2] - 1
    q, new = grouped(call.query, call.key.shape[1]), call.key.narrow(2, old_rows, 1)
    cos, sin, partner = angles(call, call.inv_freq, "key", d)
    if call.form.decay is None:
        q, keys = turn_step(q, cos, sin, partner), rotated_keys(call, old_rows, turn_step(new, cos, sin, partner))
    else:
        q, keys = decayed(call, q, new, cos, sin, partner)
    piece = padded_piece(padding, 0, old_rows + 1)
    if call.form.values is None:
        return attend_union([(q, keys, call.value, piece)], scale).view(b, h, 1, -1)
    dv, value_freq = call.value.shape[-1], value_inv_freq(call)
    shared = value_freq is call.inv_freq and dv == d  # the values turn as the keys: the same angles
    v_cos, v_sin, v_partner = (cos, sin, partner) if shared else angles(call, value_freq, "value", dv)
    values = rotated_values(call, old_rows, turn_step(call.value.narrow(2, old_rows, 1), v_cos, v_sin, v_partner))
    out = attend_union([(q, keys, values, piece)], scale)  # [B, Hkv, g, dv]
    return turn_step(out, v_cos, v_sin, v_partner, back=True).view(b, h, 1, -1)
