"""A decode step of an attention-level type while torch.compile traces it: the bands near the query over the few key
slots that can hold them, gathered by indices computed on the device, the last band over every slot, one softmax.

The reference engine scores every band against every key slot (a StaticCache's whole ``max_cache_len``), so a traced
step would rotate the whole cache once per band and score it once per band. A single query's near bands reach only
its N newest visible keys (cached keys hold consecutive positions over the visible ones, ``call.key_positions``): a
two-band type's window (N = w: keys at distance < w), Dual Chunk Attention's same and previous chunk (N = 2c: a key
at distance >= 2c is two or more chunks back). Beyond N every pair is in the last band (``"beyond"``, Dual Chunk
Attention's inter-chunk band). So here:

- the N newest visible keys' slots are found from the running count of visible keys (``torch.searchsorted``: the
  slot where the count reaches total - r holds the r-th newest visible key), so left padding, a static cache's
  unfilled end and any hole in the mask are served alike; min(N, kv) slots, a static shape under static shapes
  (nothing read back);
- the gathered keys are scored by every band as the reference engine scores them (``reference.chunk_scores`` on the
  call cut to those keys; a two-band type's window on a static cache layer by distance alone, from the layer's near
  table: ``window_scores``), the last band alone on every slot: ReRoPE's keys as cached, a static cache layer's keys as
  it keeps them turned by the band's key positions, written when each key was (``static_rows``), and elsewhere
  scored turned without writing the turned keys (``traced_scores.turned_scores``);
- each part's scores are masked by the mask and by its own range (a slot within N in the far part, a gathered slot
  that repeats because fewer than N keys are visible: hidden), then one float32 softmax over [far | near] weighs the
  whole cache's values and the gathered ones (:func:`reference.weights`, as the reference engine's).

A one-band form (xPos, RoPER, a frequency type rotated in attention) is that last band alone: xPos's key factors
zeta^((m - n)/s) scale the turned keys' pairs (the query's factor is 1 for its own position), RoPER's values are read
as a static cache layer keeps them turned or summed turned (``traced_scores.turned_values``), and the sum turned back
by the query's position.

Pairs are scored and weighed as the reference engine scores them; the order of the sums differs, and keys (RoPER's
values) turned for the whole cache are not rounded to the cache's dtype before their products (a static cache layer's
kept rows are, as the reference engine's).
"""

from __future__ import annotations

import dataclasses

import torch

from ..methods.form import origin
from ..rotation import rotate, turn
from .call import Call, visible_keys
from .decay_and_value_turns import key_log_scale, turn_output_back, value_inv_freq
from .reference import additive, chunk_scores, grouped_product, positions, weights
from .traced_scores import turned_scores, turned_values


def near_span(call: Call) -> int | None:
    """N: a single query's bands other than the last reach only keys at distance < N (None: no such bound)."""
    form = call.form
    if form.chunks is not None:
        return 2 * form.chunks(call.params)
    return int(call.params["window"]) if form.far is not None and form.bands[-1] is form.far else None


def applies(call: Call, dropout: float, training: bool) -> bool:
    """Whether this step plan runs ``call``: one query of a banded form with a near span (no decay, no value turn)
    or of a one-band form (xPos's decay and RoPER's value turn too); dropout while training stays with the reference
    engine."""
    form = call.form
    banded = form.decay is None and form.values is None and near_span(call) is not None
    one_band = len(form.bands) == 1 and form.chunks is None
    return call.query.shape[2] == 1 and (banded or one_band) and not (training and dropout > 0)


def near_slots(visible: torch.Tensor, n) -> tuple[torch.Tensor, torch.Tensor]:
    """visible [B, kv] bool -> (slots [B, n] int64 of the n newest visible keys, newest first; present [B, n]
    bool: False where fewer than n keys are visible, the slot then repeating the oldest one)."""
    count = visible.long().cumsum(-1)  # [B, kv]: visible keys up to and including each slot
    rank = count[:, -1:] - torch.arange(n, device=visible.device)  # [B, n]: the rank-th visible key
    slots = torch.searchsorted(count, rank.clamp(min=1))  # the first slot whose count reaches the rank
    return slots.clamp(max=visible.shape[1] - 1), rank >= 1


def gather_slots(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """x [B or 1, Hx, kv, e] at key slots [B, n] -> [B, Hx, n, e]."""
    batch, n = slots.shape
    x = x.expand(batch, *x.shape[1:])
    return x.gather(2, slots[:, None, :, None].expand(batch, x.shape[1], n, x.shape[3]))


def mask_at(mask: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """mask [B or 1, Hm, 1, kv] at key slots [B, n] -> [B, Hm, 1, n]."""
    batch, n = slots.shape
    mask = mask.expand(batch, *mask.shape[1:])
    return mask.gather(3, slots[:, None, None, :].expand(batch, mask.shape[1], 1, n))


def band_mask(mask, band: torch.Tensor, dtype) -> torch.Tensor:
    """The additive mask [B, Hm, 1, n] of one part: ``mask`` (None, bool or additive, [.., 1, n]) with the pairs
    outside ``band`` [B, n] bool hidden."""
    base = additive(mask, dtype) if mask is not None else torch.zeros((), dtype=dtype, device=band.device)
    return base.masked_fill(~band[:, None, None, :], torch.finfo(base.dtype).min)


def far_scores(call: Call) -> torch.Tensor:
    """q k^T [B, H, 1, kv] of the last band against every key slot, at the band's positions (keys at ``origin``: as
    cached; a static cache layer's keys turned as they were written, ``static_rows``; the others scored turned,
    ``turned_scores``, xPos's key factors zeta^((m - n)/s) with them)."""
    band = call.form.bands[-1]
    q = rotate(call.query, positions(band.query_position, call.q_pos, call.params), call.inv_freq)
    if band.key_position is origin:
        return grouped_product(q, call.key.transpose(-1, -2))
    if call.static is not None and call.static.keys is not None:  # turned as they were written
        return grouped_product(q, call.static.keys.narrow(2, 0, call.key.shape[2]).transpose(-1, -2))
    log_scale = None if call.form.decay is None else key_log_scale(call, call.k_pos, call.q_pos)  # query's: 1
    return turned_scores(q, call.key, positions(band.key_position, call.k_pos, call.params), call.inv_freq, log_scale)


def far_values(call: Call, w: torch.Tensor) -> torch.Tensor:
    """weights [B, H, 1, kv] times every slot's value: [B, H, 1, dv] (RoPER: the values turned by their positions,
    as written into a static cache layer's rows or summed turned, the sum turned back by the query's)."""
    if call.form.values is None:
        return grouped_product(w, call.value)
    if call.static is not None and call.static.values is not None:  # turned as they were written
        out = grouped_product(w, call.static.values.narrow(2, 0, call.value.shape[2]))
    else:
        out = turned_values(w, call.value, call.k_pos, value_inv_freq(call))
    return turn_output_back(call, out, slice(0, 1))


def near_scores(call: Call, slots: torch.Tensor) -> torch.Tensor:
    """q k^T [B, H, 1, n] of the keys at ``slots``, each pair in its band (the reference engine's choice); a near
    band turning keys as the last band does (Dual Chunk Attention's, all at n mod c) reads a static cache layer's
    kept rows at those slots instead of turning the gathered keys; a two-band type's window, by a static cache
    layer's near table (:func:`window_scores`)."""
    if call.static is not None and call.static.near is not None:
        return window_scores(call, slots)
    state = {"k_pos": call.k_pos.gather(1, slots)}
    if call.static is not None and call.static.keys is not None:
        kept = call.static.keys.narrow(2, 0, call.key.shape[2])
        state["turned"] = {call.form.bands[-1].key_position: gather_slots(kept, slots)}
    near = dataclasses.replace(call, key=gather_slots(call.key, slots), state=state, memory=None)
    return chunk_scores(near, slice(0, 1))


def window_scores(call: Call, slots: torch.Tensor) -> torch.Tensor:
    """q k^T [B, H, 1, n] of a two-band type's window, ``slots`` [B, n] its n newest visible keys, newest first: the
    i-th stands at distance i (consecutive positions over the visible keys), in the near band, so R(m) q . R(m - i) k
    = q . R(-i) k, the gathered keys turned by the near table's row i (``static_rows.near_table``), no angle formed.
    Slots that repeat (fewer than n keys visible) are scored wrong and hidden by ``run``."""
    cos, neg_sin = call.static.near.narrow(1, 0, slots.shape[1]).unbind(0)  # [n, r/2] each
    keys = turn(gather_slots(call.key, slots), cos, neg_sin)  # [B, Hkv, n, d]
    return grouped_product(call.query, keys.transpose(-1, -2))


def run(call: Call, mask, scale: float, dropout=0.0, training=False, softcap=None) -> torch.Tensor:
    """The step's output [B, H, 1, dv]; ``mask`` None or [B or 1, 1 or H, 1, kv] (bool or additive)."""
    batch, kv, span = call.query.shape[0], call.key.shape[2], near_span(call)
    if span is None:  # one band: every slot
        return far_values(call, weights(far_scores(call), mask, scale, dropout, training, softcap, call.value.dtype))
    visible = visible_keys(mask, batch, kv, call.query.device)
    slots, present = near_slots(visible, torch.sym_min(span, kv))
    far = call.q_pos - call.k_pos >= span  # [B, kv]: keys beyond the near bands' reach
    scores = torch.cat((far_scores(call), near_scores(call, slots)), dim=-1)  # [B, H, 1, kv + n]
    near_mask = None if mask is None else mask_at(mask, slots)
    masks = torch.cat((band_mask(mask, far, scores.dtype), band_mask(near_mask, present, scores.dtype)), dim=-1)
    w = weights(scores, masks, scale, dropout, training, softcap, call.value.dtype)
    return far_values(call, w[..., :kv]) + grouped_product(w[..., kv:], gather_slots(call.value, slots))
