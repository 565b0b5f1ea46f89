"""The reference engine: every declared band as an explicit score matrix, per query chunk (the tests' oracle).

It is what ``attn_implementation="eager"`` runs, and what ``"sdpa"`` falls back to where the fast engine does not
apply (dropout while training, a device without a kernel). For a chunk of query rows (at most SCORE_BUDGET scores
per band, so memory is bounded whatever the length): each band's queries rotated by its query positions (and
xPos-scaled) against all keys rotated by its key positions, one [B, H, c, kv] score matrix per band, each pair
taking the score of the band whose key range holds it (``in_band``); then the family's softcap, the mask, an fp32
softmax as transformers' eager_attention_forward, dropout, the (RoPER: rotated) values, and RoPER's turn back.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..methods.form import Band, origin
from ..rotation import rotate
from .call import Call, chunk_mask
from .decay_and_value_turns import (
    decay_rows,
    key_log_scale,
    query_log_scale,
    segments,
    turn_output_back,
    value_inv_freq,
)

SCORE_BUDGET = 2**26  # score elements per band and query chunk (256 MiB in float32), whatever the input length


def in_band(band: Band, call: Call, rows: slice) -> torch.Tensor | None:
    """[B, 1, c, kv] bool: the pairs of query rows ``rows`` in the band's key range (None: all)."""
    if callable(band.keys):  # a declared range, e.g. by chunk gap
        return band.keys(call.q_pos[:, rows, None], call.k_pos[:, None, :], call.params)[:, None]
    if band.keys == "all":
        return None
    d = call.q_pos[:, rows, None] - call.k_pos[:, None, :]
    inside = d < int(call.params["window"])
    return (inside if band.keys == "window" else ~inside)[:, None]


def positions(position_fn, p: torch.Tensor, params: dict) -> torch.Tensor:
    return p if position_fn is None else position_fn(p, params)


def band_keys(call: Call) -> list[torch.Tensor]:
    """Each band's keys [B, Hkv, kv, d], rotated by its key positions (rotated once per call, shared by chunks; at
    ``origin``, as cached; by a key position in ``call.state["turned"]``, the keys given there)."""
    if "keys" not in call.state:
        done = {origin: call.key, **call.state.get("turned", {})}
        for band in call.form.bands:  # bands sharing a key position (Dual Chunk Attention's) share the rotation
            if band.key_position not in done:
                at = positions(band.key_position, call.k_pos, call.params)
                done[band.key_position] = rotate(call.key, at, call.inv_freq)
        call.state["keys"] = [done[band.key_position] for band in call.form.bands]
    return call.state["keys"]


def grouped_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [B, H, c, n] @ b [B, Hkv, n, e] -> [B, H, c, e], query head h reading kv head h // (H / Hkv) (as
    transformers' repeat_kv), the heads of a kv head taken as rows of one product: no copy of b per head."""
    batch, heads, c, n = a.shape
    kv_heads = b.shape[1]
    rows = a.reshape(batch, kv_heads, heads // kv_heads * c, n)
    return (rows @ b).view(batch, heads, c, b.shape[-1])


def band_scores(call: Call, index: int, rows: slice) -> torch.Tensor:
    """q k^T [B, H, c, kv] of one band (xPos: both factors relative to the chunk's largest position r)."""
    band, m = call.form.bands[index], call.q_pos[:, rows]
    q = rotate(call.query[:, :, rows], positions(band.query_position, m, call.params), call.inv_freq)
    k = band_keys(call)[index]
    if call.form.decay is not None:
        ref = m.max(dim=-1, keepdim=True).values  # [B, 1]
        q = scale_pairs(q, query_log_scale(call, m, ref))
        k = scale_pairs(k, key_log_scale(call, call.k_pos, ref))
    return grouped_product(q, k.transpose(-1, -2))


def scale_pairs(x: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    """Each rotary pair of x [B, H, L, head_dim] times exp(log_scale) [B, 1, L, r/2]; other dims unchanged."""
    s = torch.exp(torch.cat((log_scale, log_scale), dim=-1)).float()
    d = s.shape[-1]
    scaled = (x[..., :d].float() * s).to(x.dtype)
    return torch.cat((scaled, x[..., d:]), dim=-1) if x.shape[-1] > d else scaled


def chunk_scores(call: Call, rows: slice) -> torch.Tensor:
    """[B, H, c, kv]: each pair scored in its band (later bands override the first where their range holds)."""
    scores = band_scores(call, 0, rows)
    for index in range(1, len(call.form.bands)):
        inside = in_band(call.form.bands[index], call, rows)
        if inside is None:
            scores = band_scores(call, index, rows)
        elif torch.compiler.is_compiling() or bool(inside.any()):  # a band no pair reaches is not scored (eager)
            scores = torch.where(inside, band_scores(call, index, rows), scores)
    return scores


def values(call: Call) -> torch.Tensor:
    """Values [B, Hkv, kv, dv], RoPER's rotated by their positions."""
    value = call.value
    return value if call.form.values is None else rotate(value, call.k_pos, value_inv_freq(call))


def chunks(call: Call) -> list[slice]:
    """Query row slices: within the segments, at most SCORE_BUDGET scores per band, xPos's row limit. Every row in
    one slice where they fit: what torch.compile then assumes of symbolic lengths is a bound, not a value."""
    b, h, q_len, _ = call.query.shape
    if q_len == 1:
        return [slice(0, 1)]
    size = max(1, SCORE_BUDGET // (b * h * call.key.shape[2] * len(call.form.bands)))
    size = min(size, decay_rows(call)) if call.form.decay is not None else size
    spans = segments(call)
    if len(spans) == 1 and q_len <= size:
        return [slice(0, q_len)]
    return [slice(i, min(i + size, stop)) for start, stop in spans for i in range(start, stop, size)]


def additive(mask: torch.Tensor | None, dtype) -> torch.Tensor | None:
    """A bool mask (True = attend) as 0 / finfo.min; float masks are already additive."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def weights(scores, mask, scale: float, dropout: float, training: bool, softcap, dtype) -> torch.Tensor:
    """As transformers' eager_attention_forward: scale, softcap (Gemma 2), mask, fp32 softmax, dropout; in ``dtype``
    (the values')."""
    scores = scores * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + additive(mask, scores.dtype)
    return F.dropout(F.softmax(scores, dim=-1, dtype=torch.float32).to(dtype), p=dropout, training=training)


def softmax_output(scores, value, mask, scale: float, dropout: float, training: bool, softcap=None):
    """The weights of ``scores`` (:func:`weights`) @ value."""
    return grouped_product(weights(scores, mask, scale, dropout, training, softcap, value.dtype), value)


def run(call: Call, mask, causal: bool, scale: float, dropout=0.0, training=False, softcap=None) -> torch.Tensor:
    """The attention output [B, H, q, dv], one query chunk at a time."""
    q_len, kv_len, value, outputs = call.query.shape[2], call.key.shape[2], values(call), []
    for rows in chunks(call):
        rows_mask = chunk_mask(mask, causal, rows, q_len, kv_len, call.query.device)
        out = softmax_output(chunk_scores(call, rows), value, rows_mask, scale, dropout, training, softcap)
        outputs.append(turn_output_back(call, out, rows))
    return torch.cat(outputs, dim=2)
