"""Rotated rows in static buffers: a static cache layer's keys (and RoPER's values) turned once, when they are
written, so that a compiled decode step (``traced_step``) reads the last band's keys as cached instead of turning the
whole cache again at every step.

A static cache layer (``_transformers.cache_layers.RotatingStaticLayer``) holds, beside transformers' keys and values,
one :class:`StaticRows`: buffers as long as its keys (``max_cache_len`` rows, on their device, marked static as
transformers marks its own), holding each written key turned by the last band's key position (Self-Extend's
floor(n/g), leaky ReRoPE's n/f, STRING's and RoPER's n, Dual Chunk Attention's n mod c) and RoPER's values turned by
their positions. Types whose last band reads keys as cached (ReRoPE), whose key factor follows the query (xPos) or
whose frequencies follow the length (the dynamic types) keep none.

- an eager call (a prefill, an uncompiled step) writes its new rows, or every row of its keys where the buffers are
  new or stale (:func:`fill`), and its engine reads them there (:func:`kept`) instead of turning and remembering
  the same rows again;
- a traced call writes the rows its update just wrote, at the slots the layer's own counter names
  (``index_copy_``, as ``StaticLayer.update``): same shapes and addresses every step, nothing read back.

The buffers are reached from the keys tensor itself (attribute :data:`STATIC`, set on the layer's static keys, which
torch.compile reads and guards like any attribute); keys transformers replaces (``offload``, a new initialization)
carry none, and the step then turns the cache as before (``traced_scores``). Rows are turned at the positions the
engine gives cached keys (``call.key_positions``): consecutive up to the newest query's, skipping the hidden ones.

Beside them, a two-band type's near table (:func:`near_table`): with those positions the i-th newest visible key
stands at distance i from the query, so the near band's R(m) q . R(m - i) k = q . R(-i) k, a turn by distance alone;
the step turns the window's keys by the table's cos and -sin, forming no angle (ReRoPE, which keeps no rows, keeps
this table alone). One table per rotation and window, shared by the layers.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..methods.form import PLAIN, Band
from ..rotation import cos_sin, rotate
from .call import Call
from .decay_and_value_turns import value_inv_freq
from .piece import needs_grad
from .reference import positions as band_positions
from .step_turns import partner_index, per_step, signed_freq, step_cos_sin, turn_step

STATIC = "_hf_rope_ext_static_rows"  # attribute of a static cache layer's keys tensor: its StaticRows


@dataclass
class StaticRows:
    tag: tuple  # the rotation's identity (type, frequencies, parameters) the rows were turned under
    length: torch.Tensor  # 0-dim int64: the layer's count of written rows (its own counter, moved in place)
    keys: torch.Tensor | None  # [B, Hkv, max_cache_len, d]: each key turned by the last band's key position
    values: torch.Tensor | None  # [B, Hkv, max_cache_len, dv]: RoPER's values turned by their positions
    valid: bool = True  # False: some written row was not turned (the step turns the cache itself)
    near: torch.Tensor | None = None  # [2, w, r/2] float32: cos, -sin of distances 0 .. w - 1 (``near_table``)


_TABLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (tag, device) -> near table, while held


def wanted(call: Call) -> tuple[bool, bool, bool]:
    """(keys, values, near): whether ``call``'s form has keys turned by their own positions to keep (its last band's
    keys not read as cached, no decay, fixed frequencies), values turned (RoPER) and a near table (two bands, the
    near one plain RoPE in the window)."""
    if call.form is PLAIN or call.tag is None:  # a frequency type rotated here, a dynamic one: nothing kept
        return False, False, False
    form = call.form  # a two-band form's bands: (Band("window"), its far band)
    return (*form.kept_turns, form.far is not None and form.bands[0] == Band("window"))


def near_table(call: Call) -> torch.Tensor:
    """[2, w, r/2] float32: cos and -sin of each distance 0 .. w - 1 (w the window) at the call's frequencies, kept
    static; the same tensor for every layer of one rotation on one device while any holds it."""
    key = (call.tag, call.query.device)
    table = _TABLES.get(key)
    if table is None:
        cos, sin = cos_sin(torch.arange(int(call.params["window"]), device=call.query.device), call.inv_freq)
        table = _TABLES[key] = torch.stack((cos, -sin))
        torch._dynamo.mark_static_address(table)
    return table


def kept(call: Call, position, values: bool = False) -> torch.Tensor | None:
    """An eager call's keys [B, Hkv, kv, d] turned by ``position`` (a band's key position; None: their own), or
    (``values``) RoPER's values turned, as the call's static cache layer keeps them (``call.static``); None where it
    keeps no such rows (none kept, another turn, autograd): the engine then turns and remembers them itself
    (``rotated_cache``), a second copy of the same rows."""
    rows = call.static
    held = None if rows is None else rows.values if values else rows.keys
    if held is None or needs_grad(call.query, call.key, call.value):
        return None
    if not values and call.form.bands[-1].key_position is not position:
        return None
    return held.narrow(2, 0, call.key.shape[2])


def turned_keys(call: Call, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """keys [B, Hkv, n, d] at positions [B, n] turned by the last band's key positions."""
    at = band_positions(call.form.bands[-1].key_position, positions, call.params)
    return rotate(keys, at, call.inv_freq)


def turned_values(call: Call, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """values [B, Hkv, n, dv] at positions [B, n] turned by them (RoPER's value frequencies)."""
    return rotate(values, positions, value_inv_freq(call))


def buffer(like: torch.Tensor, old: torch.Tensor | None) -> torch.Tensor:
    """``old`` where it has ``like``'s shape, dtype and device (its address kept), else new zeros marked static."""
    if old is not None and (old.shape, old.dtype, old.device) == (like.shape, like.dtype, like.device):
        return old
    new = torch.zeros_like(like)
    torch._dynamo.mark_static_address(new)
    return new


def fitting(rows: StaticRows | None, call: Call, keys: torch.Tensor, values: torch.Tensor, length) -> bool:
    """Whether ``rows`` still hold every written row of ``keys`` [B, Hkv, L, d] and ``values`` for ``call``."""
    if rows is None or not rows.valid or rows.tag != call.tag or rows.length is not length:
        return False
    if getattr(keys, STATIC, None) is not rows or held(rows) != wanted(call):
        return False
    return all(b is None or b.shape == x.shape for b, x in ((rows.keys, keys), (rows.values, values)))


def held(rows: StaticRows) -> tuple[bool, bool, bool]:
    """What ``rows`` keep, in ``wanted``'s order."""
    return rows.keys is not None, rows.values is not None, rows.near is not None


def build(call: Call, keys: torch.Tensor, values: torch.Tensor, length, old: StaticRows | None) -> StaticRows:
    """Buffers for ``keys`` [B, Hkv, L, d] and ``values`` (``old``'s where they fit), linked from ``keys``, every row
    of ``call``'s keys written (:func:`fill`), and the near table where the form has one."""
    want_keys, want_values, want_near = wanted(call)
    held_keys, held_values = (old.keys, old.values) if old is not None else (None, None)
    rows = StaticRows(
        call.tag,
        length,
        buffer(keys, held_keys) if want_keys else None,
        buffer(values, held_values) if want_values else None,
        near=near_table(call) if want_near else None,
    )
    fill(rows, call)
    setattr(keys, STATIC, rows)
    return rows


def fill(rows: StaticRows, call: Call) -> None:
    """Write every row of ``call``'s keys [B, Hkv, kv, d] (eager: the filled slots), at their positions."""
    kv = call.key.shape[2]
    if rows.keys is not None:
        rows.keys[:, :, :kv] = turned_keys(call, call.key, call.k_pos)
    if rows.values is not None:
        rows.values[:, :, :kv] = turned_values(call, call.value, call.k_pos)


def new_positions(call: Call, slots: torch.Tensor) -> torch.Tensor:
    """[B, q]: the positions of the keys at ``slots`` [q], the ones this call's update wrote (a single query's key is
    at the query's position; several queries' keys at the positions the engine gives them)."""
    batch, q_len = call.q_pos.shape
    if q_len == 1 or call.key.shape[2] == q_len:
        return call.q_pos
    return call.k_pos.gather(1, slots.expand(batch, q_len))


def write(rows: StaticRows, call: Call, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Turn and write the rows the update just wrote into ``keys`` [B, Hkv, L, d] and ``values`` (slots
    length - q .. length - 1 of the layer's counter, on the device)."""
    q_len = call.query.shape[2]
    if q_len == 1 and not torch.compiler.is_compiling():
        write_step(rows, call, keys, values)
        return
    slots = rows.length - q_len + torch.arange(q_len, device=rows.length.device)  # [q] int64
    at = new_positions(call, slots)
    if rows.keys is not None:
        rows.keys.index_copy_(2, slots, turned_keys(call, keys.index_select(2, slots), at))
    if rows.values is not None:
        rows.values.index_copy_(2, slots, turned_values(call, values.index_select(2, slots), at))


def write_step(rows: StaticRows, call: Call, keys: torch.Tensor, values: torch.Tensor) -> None:
    """``write`` for an eager decode step (one query, its key at the query's position): the new row turned by the
    step's angles, formed in the first layer and shared by the others (``step_turns``), a few operations a layer."""
    slot = (rows.length - 1).view(1)  # [1] int64
    if rows.keys is not None:
        key_position = call.form.bands[-1].key_position
        write_row(call, rows.keys, keys, slot, ("static_key", call.inv_freq, key_position))
    if rows.values is not None:
        write_row(call, rows.values, values, slot, ("static_value", value_inv_freq(call), None))


def write_row(call: Call, held: torch.Tensor, source: torch.Tensor, slot: torch.Tensor, turn: tuple) -> None:
    """Write ``source``'s row ``slot`` [1] into ``held``, turned by ``turn`` = (name, frequencies [r/2], position
    function of the new row: None, its own) at the step's query position."""
    name, inv_freq, position = turn
    width = source.shape[-1]
    freq = signed_freq(call, inv_freq, name, width)

    def angles():
        return step_cos_sin(band_positions(position, call.q_pos, call.params), freq)  # [B, 1, 1, width] each

    cos, sin = per_step(call, (name, width), angles)
    partner = partner_index(call, inv_freq.shape[-1], width)
    held.index_copy_(2, slot, turn_step(source.index_select(2, slot), cos, sin, partner))


def select(rows: StaticRows, index: torch.Tensor) -> None:
    """Keep batch rows ``index`` (beam search's reorder), in place (the buffers keep their addresses)."""
    for held in (rows.keys, rows.values):
        if held is not None:
            held.copy_(held.index_select(0, index.to(held.device)))


def attached(keys: torch.Tensor, tag: tuple | None) -> StaticRows | None:
    """While torch.compile traces: the rows linked from ``keys`` [B, Hkv, L, d] when they hold every written row under
    rotation ``tag``; rows that do not (another rotation in force) are marked stale, as this step will not write
    them."""
    rows = getattr(keys, STATIC, None)
    if rows is None or not rows.valid:
        return None
    usable = tag is not None and rows.tag == tag
    usable = usable and all(b is None or b.shape[:3] == keys.shape[:3] for b in (rows.keys, rows.values))
    if not usable:
        rows.valid = False
        return None
    return rows
