"""The fast engine: every declared band as standard attention pieces that return their log-sum-exp, merged by
it, with no dense [q, kv] score or mask, on every device with a kernel in ``kernels.KERNELS`` (CPU, CUDA).

Which plan runs: one-band forms (xPos, RoPER, plain RoPE of the dynamic types) ``single_band``, or
``single_band_decode`` for one query on a cache; two-band forms (near band ``"window"`` at true positions, far band
``"beyond"``) ``decode.two_band_decode`` for one query after a long cache, ``two_band.two_band_regular`` for regular
positions without a mask, ``masked.two_band_masked`` otherwise; chunked forms (Dual Chunk Attention)
``chunk_decode`` for one query on a cache, ``chunk_bands.chunked`` without a mask on increasing positions
(consecutive, or skip-wise as PoSE trains), the same in every row. The one-query plans take no mask or one hiding
only each row's first keys (left padding: ``padding``). Not taken (``run`` returns None, the reference engine runs):
dropout while training, a device without a kernel, a declaration none of these plans covers, a chunked form with
another mask or positions that do not increase.
"""

from __future__ import annotations

import functools

import torch

from ..mask_formats import is_step_mask, step_padding
from ..methods.form import AttentionForm, Band
from .call import Call
from .chunk_bands import chunked, positions_if_chunked
from .chunk_decode import chunk_decode
from .decode import decoding, two_band_decode
from .kernels import kernel_for
from .masked import two_band_masked
from .padding import Padding, step_padding_of
from .single_band import rotated_keys, single_band
from .single_band_decode import decode_step
from .two_band import two_band_regular


@functools.cache
def plan_of(form: AttentionForm) -> str | None:
    """The fast plan of a declaration: "single", "two", "chunks" or None (none); computed once per declaration."""
    bands = form.bands
    if form.chunks is not None and len(bands) == 3 and len({b.key_position for b in bands}) == 1:
        return "chunks" if form.decay is None and form.values is None else None
    if len(bands) == 1 and bands[0].keys == "all" and bands[0].query_position is bands[0].key_position is None:
        return "single"
    if len(bands) == 2 and bands[0] == Band("window") and bands[1].keys == "beyond" and form.far is bands[1]:
        return "two" if form.decay is None and form.values is None else None
    return None


def regular(call: Call, mask) -> bool:
    """Each row's key positions consecutive, the queries being the newest keys (kv - q_len on)."""
    q_len, kv = call.query.shape[2], call.key.shape[2]
    if mask is None and (kv > q_len or q_len == 1):  # key_positions made them consecutive up to the last query
        return q_len == 1 or bool((call.q_pos[:, 1:] - call.q_pos[:, :-1] == 1).all())
    base = call.k_pos - torch.arange(kv, device=call.k_pos.device)
    start = base[:, :1]
    queries = call.q_pos - torch.arange(kv - q_len, kv, device=call.q_pos.device)
    return bool((base == start).all() and (queries == start).all())


def left_padded_step(call: Call, mask, causal: bool) -> Padding | None:
    """The ``Padding`` of a decode step whose mask hides only keys before each row's first seen one, else None."""
    step = causal and is_step_mask(mask, call.query.shape[2])
    if not step or step_padding(mask)[1] != "left":  # read once a step (crop_empty_slots read it)
        return None
    return step_padding_of(mask, call.query.shape[0], call.query.dtype)


def run(call: Call, module, mask, causal: bool, scale: float, dropout: float, training: bool):
    """The output [B, H, q, dv], or None where the fast engine does not apply."""
    kind = plan_of(call.form)
    if kind is None or kernel_for(call.query.device) is None or (training and dropout > 0):
        return None
    padding = left_padded_step(call, mask, causal)
    one_step = call.query.shape[2] == 1 and causal and (mask is None or padding is not None)
    if kind == "single":
        return decode_step(call, scale, padding) if one_step else single_band(call, mask, causal, scale)
    if kind == "chunks" and one_step:
        return chunk_decode(call, scale, padding)
    if kind == "chunks":
        positions = positions_if_chunked(call) if mask is None and causal else None
        return None if positions is None else chunked(call, *positions, scale)
    if padding is not None and decoding(call):
        return two_band_decode(call, scale, padding)
    if mask is None and causal and regular(call, mask):
        return two_band_decode(call, scale) if decoding(call) else two_band_regular(call, scale)
    offset = call.key.shape[2] - call.query.shape[2]
    return two_band_masked(call, rotated_keys(call, offset), mask, causal, scale)
