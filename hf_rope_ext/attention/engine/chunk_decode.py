"""The fast engine's decode step of the chunked forms (Dual Chunk Attention): one query after a cache (its mask, if any,
hiding only each row's first keys: left padding, ``padding``), its three bands as the rows of one kernel call over every
key, each row seeing its band's keys through a mask built on the device, the rows merged by their log-sum-exps. Nothing
is read back from the device (the prefill's plan, ``chunk_bands``, reads the chunk boundaries; a step needs none).

The query at m, r = m mod c, meets the key at distance t = m - n (keys consecutive up to the query, as a step without
a mask has them: ``call``) in chunk gap ceil((t - r) / c) clamped to 2: band 0 where t <= r, band 1 where r < t <= r
+ c, band 2 beyond. Every key is rotated by n mod c (remembered across steps); the query of band b by the band's
query position.

On a CPU (``HOST_BANDS``), where reading a value back costs no wait on a queue, a step of one batch row without
padding reads r once (shared by the layers) and runs each band as a piece of its own rows over its own keys, with
no mask (``host_bands``): the kernel then scores each key for one band's rows, not for all three bands' (at 8192
cached tokens on SmolLM2's shape, 3 pieces of 3 rows took 0.54 ms a layer against 0.70 ms for one call of 9 rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rotation import rotate
from . import rotated_cache, static_rows
from .call import Call
from .kernels import attend_piece
from .padding import Padding
from .piece import Piece
from .step_turns import partner_index, per_step, signed_freq, step_cos_sin, turn_step
from .union import attend_union

BANDS = 3  # chunk gaps 0, 1 and >= 2
HOST_BANDS = {"cpu"}  # device types on which a step reads its chunk boundary on the host (``host_bands``)


def band_positions(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, 1, 3] positions of the query in each band, the first of them [B, 1]: r = m mod c, also the new key's)."""
    m, bands = call.q_pos, call.form.bands
    positions = [band.query_position(m, call.params) for band in bands]
    return torch.cat(positions, dim=1).view(m.shape[0], 1, BANDS), positions[0]


def columns(call: Call) -> torch.Tensor:
    """[kv] int64: 0 .. kv - 1 (a view of a layer constant that grows as needed)."""
    kv = call.key.shape[2]
    held = call.constants.get(("columns", call.key.device))
    if held is None or held.shape[0] < kv:
        held = call.constants["columns", call.key.device] = torch.arange(2 * kv, device=call.key.device)
    return held.narrow(0, 0, kv)


@dataclass(eq=False)
class BandRule:
    """The bands of one step's query rows (``piece.Rule``): row block b (``rows`` rows) sees the key at index j
    when t - r = anchor - j is in band b (``bucketize`` by [0, c]; t = kv - 1 - j the key's distance, r = m mod c,
    anchor [B, 1] = kv - 1 - r). Only tensors change from step to step (a compiled flex keeps one variant)."""

    anchor: torch.Tensor
    chunk: int
    rows: int
    constants: dict  # the layer's: columns, bounds, row bands, the dtype's 0 and minimum (``rule_constants``)
    padding: Padding | None = None  # keys before a row's first seen one hidden too
    dense: torch.Tensor | None = None

    def mask_mod(self, b, h, row, column):
        t = self.anchor[b, 0] - column
        band = (t > 0).to(torch.int64) + (t > self.chunk).to(torch.int64) == row // self.rows
        return band if self.padding is None else band & (column >= self.padding.first[b, 0])

    def additive(self) -> torch.Tensor:
        """[B, 1, 3 rows, kv], formed once (the layers of a step share the rule)."""
        if self.dense is None:
            held = self.constants
            band = torch.bucketize(self.anchor - held["columns"], held["bounds"])  # [B, kv]
            allowed = band.view(band.shape[0], 1, 1, -1) == held["row_band"]  # [B, 1, 3 rows, kv]
            self.dense = torch.where(allowed, held["zero"], held["low"])
            if self.padding is not None:  # both 0 or the minimum: the smaller hides
                self.dense = torch.minimum(self.dense, self.padding.additive)
        return self.dense


def rule_constants(call: Call, rows: int) -> dict:
    """What a step's ``BandRule`` reads besides r, kept with the layer."""
    device, dtype, c = call.query.device, call.query.dtype, call.form.chunks(call.params)

    def compute():
        low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
        row_band = torch.arange(BANDS, device=device).repeat_interleave(rows).view(-1, 1)
        return {"bounds": torch.tensor([0, c], device=device), "row_band": row_band, "low": low, "zero": low * 0}

    return {**call.constant(("band_rule", rows, dtype), compute), "columns": columns(call)}


def chunk_keys_step(call: Call, new: torch.Tensor) -> torch.Tensor:
    """Keys [B, Hkv, kv, d] rotated by n mod c, the new one given (``new``), the others remembered."""
    key_position = call.form.bands[0].key_position
    held = static_rows.kept(call, key_position)  # a static cache layer's, the new row written already
    if held is not None:
        return held

    def turn(x, positions):
        return rotate(x, key_position(positions, call.params), call.inv_freq)

    kv = call.key.shape[2]
    return rotated_cache.rotated(call.memory, "chunk_key", call.tag, call.key, call.key_positions, kv - 1, turn, 0, new)


def step_angles_and_rule(call: Call, freq: torch.Tensor, rows: int, padding: Padding | None):
    """(cos, sin [B, 1, 3, 1, d] of the bands' query positions, those of band 0 [B, 1, 1, d]: the new key's, the
    bands' ``BandRule``) of a step."""
    positions, r = band_positions(call)  # [B, 1, 3], [B, 1]
    anchor = (call.key.shape[2] - 1) - r
    rule = BandRule(anchor, call.form.chunks(call.params), rows, rule_constants(call, rows), padding)
    cos, sin = step_cos_sin(positions, freq)
    return cos, sin, cos[:, :, 0], sin[:, :, 0], rule


def chunk_decode(call: Call, scale: float, padding: Padding | None = None) -> torch.Tensor:
    """One query after a cache, [B, H, 1, dv] (module docstring); ``padding``: keys before a row's first hidden."""
    b, h, _, d = call.query.shape
    kv, kv_heads = call.key.shape[2], call.key.shape[1]
    groups = h // kv_heads
    freq = signed_freq(call, call.inv_freq, "key", d)
    key = ("chunks", d, kv, groups, call.query.dtype, None if padding is None else id(padding))  # a step's mask
    cos, sin, key_cos, key_sin, rule = per_step(call, key, lambda: step_angles_and_rule(call, freq, groups, padding))
    partner = partner_index(call, call.inv_freq.shape[-1], d)
    q = turn_step(call.query.view(b, kv_heads, 1, groups, d), cos, sin, partner)  # [B, Hkv, 3, g, d]
    new = turn_step(call.key.narrow(2, kv - 1, 1), key_cos, key_sin, partner)  # by r = m mod c
    keys = chunk_keys_step(call, new)
    if padding is None and b == 1 and call.query.device.type in HOST_BANDS:
        return host_bands(call, q, keys, scale).view(b, h, 1, -1)
    out, lse = attend_piece(q.view(b, kv_heads, BANDS * groups, d), keys, call.value, Piece(rule=rule), scale)
    weights = torch.softmax(lse.view(b, kv_heads, BANDS, groups, 1), dim=2)  # [B, Hkv, 3, g, 1] float32
    merged = (out.view(b, kv_heads, BANDS, groups, -1) * weights).sum(2)
    return merged.to(out.dtype).view(b, h, 1, -1)


def band_spans(call: Call) -> list[tuple[int, int]]:
    """The key index ranges [lo, hi) of bands 0, 1 and 2 of a one-row step, read on the host once a step: with
    a = kv - 1 - r, band 0 holds keys [a, kv) (distance <= r), band 1 [a - c, a), band 2 [0, a - c); clipped at 0."""
    c, kv = call.form.chunks(call.params), call.key.shape[2]
    r = per_step(call, ("chunk_r", c), lambda: int(call.q_pos[0, 0]) % c)
    bounds = [max(0, kv - 1 - r - c), max(0, kv - 1 - r), kv]
    return [(bounds[1], kv), (bounds[0], bounds[1]), (0, bounds[0])]


def host_bands(call: Call, q: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """One row's step (module docstring, ``HOST_BANDS``): q [1, Hkv, 3, g, d] (band b's rows at index b), keys
    [1, Hkv, kv, d] turned by n mod c -> [1, Hkv, g, dv], each non-empty band a piece, merged by softmax over their
    log-sum-exps (``union``)."""
    spans = band_spans(call)
    pieces = [
        (q[:, :, band], keys[:, :, lo:hi], call.value[:, :, lo:hi], Piece())
        for band, (lo, hi) in enumerate(spans)
        if hi > lo
    ]
    return attend_union(pieces, scale)  # [1, Hkv, g, dv]
