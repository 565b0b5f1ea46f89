"""The rotations of a decode step in as few operations as the host dispatches: a step turns one query (in each band)
and one new key by a handful of positions, where the work is tiny and each operation costs its dispatch (on a GPU,
a launch). The same turn as ``attention.rotation.turn`` (half layout: pairs (i, i + r/2)), written over the whole head:

    turned = x * cos + partner(x) * sin

with, per dim, cos of its pair's angle and sin of the *signed* angle (-theta_i for the pair's first member, +theta_i
for its second), partner(x) the other member of each pair (one ``index_select``), and dims past the rotary dim r
turning by angle 0 (cos 1, sin 0: passed through). Angles in float64 with autocast off, cos and sin cast to float32,
products in float32 (an operand in half precision is promoted by the multiply itself), the result cast back: the
precision rule of ``attention.rotation``.

What a step computes from the positions alone (the angles, DCA's band mask) is the same in every layer of a model
that shares a rotation (the tag: type, frequencies, parameters): ``per_step`` computes it in the first layer and
hands it to the others, for as long as the step's position tensor is the one the model passes to every layer.
"""

from __future__ import annotations

import weakref

import torch

from .call import Call

_STEP: list = [None, None, {}]  # [weak reference to a step's query positions, their version, key -> value]


def per_step(call: Call, key: tuple, compute):
    """``compute()`` once for all the layers of a step: kept under ``key`` (with the call's rotation tag) while the
    call's query positions are the same tensor, unchanged (its version, outside inference mode)."""
    positions = call.q_pos
    ref, version, values = _STEP
    now = None if positions.is_inference() else positions._version
    if ref is None or ref() is not positions or version != now:
        values = {}
        _STEP[:] = [weakref.ref(positions), now, values]
    key = (call.tag, *key)
    if key not in values:
        values[key] = compute()
    return values[key]


def signed_freq(call: Call, inv_freq: torch.Tensor, name: str, width: int) -> torch.Tensor:
    """[width] float64: -theta_i then +theta_i over the 2 x len(inv_freq) rotary dims, 0 past them; kept with the
    layer while its frequencies are the same tensor (a dynamic type's change with the length), ``name`` telling the
    layer's frequency sets apart (the keys', RoPER's values')."""
    key = ("signed_freq", name, width, inv_freq.device)
    held = call.constants.get(key)
    if held is None or held[0] is not inv_freq:
        zeros = inv_freq.new_zeros(width - 2 * inv_freq.shape[-1])
        held = call.constants[key] = (inv_freq, torch.cat((-inv_freq, inv_freq, zeros)).double())
    return held[1]


def partner_index(call: Call, pairs: int, width: int) -> torch.Tensor:
    """[width] int64: the dim each dim's pair partner sits at (dims past the rotary ones: themselves)."""

    def compute():
        dims = torch.arange(width, device=call.query.device)
        return torch.where(dims < pairs, dims + pairs, torch.where(dims < 2 * pairs, dims - pairs, dims))

    return call.constant(("partner_index", pairs, width), compute)


def step_cos_sin(positions: torch.Tensor, freq: torch.Tensor):
    """cos, sin [..., B, 1, 1, width] float32 of positions [..., B, 1] (int or float; e.g. [P, B, 1], one leading
    row per position a step turns by) against a signed frequency row [width] (``signed_freq``): broadcasting over
    heads and rows."""
    if torch.is_autocast_enabled(freq.device.type):
        with torch.autocast(device_type=freq.device.type, enabled=False):
            return step_cos_sin(positions, freq)
    angles = positions.view(*positions.shape, 1, 1).to(freq.dtype) * freq
    return angles.cos().float(), angles.sin().float()


def turn_step(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, partner: torch.Tensor, back: bool = False):
    """x [..., width] turned by each position's cos, sin (broadcast against x), in x's dtype; ``back``: by minus
    the angles (RoPER's output)."""
    turned = torch.addcmul(x * cos, x.index_select(-1, partner), sin, value=-1 if back else 1)
    return turned.to(x.dtype)
