"""A two-band type's decode step while torch.compile traces it: the near band over the few key slots that can hold
it, gathered by indices computed on the device, the far band over every slot, one softmax over both.

The reference engine scores every band against every key slot (a StaticCache's whole ``max_cache_len``), so a
traced step would rotate the whole cache for the near band and score it twice. A single query's near band holds at
most its w newest visible keys (w = ``rope_parameters["window"]``; cached keys hold consecutive positions over the
visible ones, ``call.key_positions``), so here:

- their slots are found from the running count of visible keys (``torch.searchsorted``: the slot where the count
  reaches total - r holds the r-th newest visible key), so left padding, a static cache's unfilled end and any hole
  in the mask are served alike; n = min(w, kv) slots, a static shape under static shapes (nothing read back);
- the near band's queries and the n gathered keys are rotated by their own positions, the far band's queries by
  the band's query position against every key rotated by its key position (ReRoPE's keys are read as cached);
- each band's scores are masked by the mask and by its own range (a far key within the window, a near slot that
  repeats because fewer than w keys are visible: hidden), then one float32 softmax over [far | near] weighs the
  whole cache's values and the gathered ones (:func:`reference.weights`, as the reference engine's).

Pairs are scored and weighed as the reference engine scores them; only the order of the value sums differs.
"""

from __future__ import annotations

import torch

from ..methods.form import origin
from ..rotation import rotate
from .call import Call, visible_keys
from .reference import additive, grouped_product, positions, weights


def applies(call: Call, dropout: float, training: bool) -> bool:
    """Whether this step plan runs ``call``: one query of a two-band form (a near ``"window"`` band then a far
    ``"beyond"`` one, no decay, no value turn); dropout while training stays with the reference engine."""
    bands = call.form.bands
    two = len(bands) == 2 and bands[0].keys == "window" and bands[1].keys == "beyond"
    plain = call.form.decay is None and call.form.values is None and call.form.chunks is None
    return call.query.shape[2] == 1 and two and plain and not (training and dropout > 0)


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
    """The additive mask [B, Hm, 1, n] of one band: ``mask`` (None, bool or additive, [.., 1, n]) with the pairs
    outside ``band`` [B, n] bool hidden."""
    base = additive(mask, dtype) if mask is not None else torch.zeros((), dtype=dtype, device=band.device)
    return base.masked_fill(~band[:, None, None, :], torch.finfo(base.dtype).min)


def scored(call: Call, index: int, keys: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
    """q k^T [B, H, 1, n] of band ``index``: the query and ``keys`` [B, Hkv, n, d] (at positions key_pos [B, n])
    rotated by the band's positions (keys at ``origin``: as they are)."""
    band = call.form.bands[index]
    q = rotate(call.query, positions(band.query_position, call.q_pos, call.params), call.inv_freq)
    if band.key_position is not origin:
        keys = rotate(keys, positions(band.key_position, key_pos, call.params), call.inv_freq)
    return grouped_product(q, keys.transpose(-1, -2))


def run(call: Call, mask, scale: float, dropout=0.0, training=False, softcap=None) -> torch.Tensor:
    """The step's output [B, H, 1, dv]; ``mask`` None or [B or 1, 1 or H, 1, kv] (bool or additive)."""
    batch, kv = call.query.shape[0], call.key.shape[2]
    visible = visible_keys(mask, batch, kv, call.query.device)
    slots, present = near_slots(visible, torch.sym_min(int(call.params["window"]), kv))
    far = call.q_pos - call.k_pos >= int(call.params["window"])  # [B, kv]: keys beyond the window
    near = scored(call, 0, gather_slots(call.key, slots), call.k_pos.gather(1, slots))  # [B, H, 1, n]
    scores = torch.cat((scored(call, 1, call.key, call.k_pos), near), dim=-1)  # [B, H, 1, kv + n]
    near_mask = None if mask is None else mask_at(mask, slots)
    masks = torch.cat((band_mask(mask, far, scores.dtype), band_mask(near_mask, present, scores.dtype)), dim=-1)
    w = weights(scores, masks, scale, dropout, training, softcap, call.value.dtype)
    near_values = gather_slots(call.value, slots)
    return grouped_product(w[..., :kv], call.value) + grouped_product(w[..., kv:], near_values)
