"""The attention function of the attention-level rope types: positions, heads, chunks, kernel, output.

``attend`` is what transformers calls (through the functions ``_transformers`` registers under ``"eager"`` and
``"sdpa"``) for a module whose config names one of these types. Queries and keys arrive unrotated (the rotary
module got zero frequencies) and the KV cache holds unrotated keys, so each call rotates with exact positions.
"""

from __future__ import annotations

import torch

from .. import registry
from .fast import run as run_fast
from .kernel import KERNELS
from .positions import chunk_mask, key_positions, query_positions
from .scoring import SCORERS, Call, filled, routes_through_attention

SCORE_BUDGET = 2**26  # score elements per band and query chunk (256 MiB in float32), whatever the input length


def layer_rope(module) -> tuple[dict, str | None] | None:
    """(flat rope_parameters, layer_type) of this attention module, or None when it has none."""
    config = getattr(module, "config", None)
    params = getattr(config, "rope_parameters", None)
    if not params:
        return None
    if "rope_type" in params or "type" in params:
        return params, None
    layer_types = getattr(config, "layer_types", None)
    layer_idx = getattr(module, "layer_idx", None)
    if layer_types is None or layer_idx is None:
        return None
    layer_type = layer_types[layer_idx]
    return params.get(layer_type) or None, layer_type


def attention_type_of(module) -> str | None:
    """The package's attention-level rope_type that this module uses, or None (stock attention)."""
    found = layer_rope(module)
    if found is None or found[0] is None:
        return None
    name = found[0].get("rope_type", found[0].get("type"))
    return name if name in SCORERS and routes_through_attention(name, module.config) else None


def check_module(module, name: str, implementation: str) -> registry.RopeMethod:
    method = registry.get_method(name)
    model_type = getattr(module.config, "model_type", None)
    if method.families is not None and model_type not in method.families:
        raise ValueError(
            f"rope_type={name!r} does not support model_type={model_type!r}; supported: {list(method.families)}"
        )
    if implementation not in KERNELS:
        raise ValueError(
            f"attn_implementation={implementation!r} cannot apply rope_type={name!r} (it takes no score "
            f"modification); use one of {sorted(KERNELS)}"
        )
    return method


def chunk_rows(scorer, call: Call, bands: int) -> list[slice]:
    """Query row slices: within the scorer's segments, at most SCORE_BUDGET scores per band each."""
    b, h, _, _ = call.query.shape
    size = max(1, SCORE_BUDGET // (b * h * call.key.shape[2] * bands))
    size = min(size, scorer.chunk_limit(call) or size)
    return [slice(i, min(i + size, stop)) for start, stop in scorer.segments(call) for i in range(start, stop, size)]


def make_call(module, name, query, key, value, mask, position_ids) -> Call:
    """Positions of queries and keys, the frequencies the layer's scorer rotates by (kv heads as they come)."""
    rope, layer_type = layer_rope(module)
    batch, heads, q_len, _ = query.shape
    q_pos = query_positions(position_ids, batch, q_len)
    k_pos = key_positions(q_pos, mask, key.shape[2])
    inv_freq, score_scale = SCORERS[name].frequencies(module.config, layer_type, q_pos, k_pos, query.device)
    params = filled(rope, registry.get_method(name))
    return Call(query, key, value, q_pos, k_pos, inv_freq, params, score_scale)


def refuse_extras(name: str, kwargs: dict) -> None:
    for key in ("softcap", "position_bias"):
        if kwargs.get(key) is not None:
            raise ValueError(f"{key}={kwargs[key]!r} is not supported with rope_type={name!r}")


def crop_empty_slots(query, key, value, mask):
    """No mask, several queries, more keys: an empty static cache, which sdpa crops to the first q_len slots."""
    q_len = query.shape[2]
    if mask is None and q_len > 1 and key.shape[2] > q_len:
        return key[:, :, :q_len], value[:, :, :q_len]
    return key, value


def run_chunks(implementation, scorer, call: Call, mask, causal: bool, scale: float, dropout: float, module):
    """The attention output [B, H, q, dv]: ``fast.run`` for sdpa where it applies, else one query chunk at a time."""
    training = module.training
    if implementation == "sdpa":
        out = run_fast(scorer, module, call, mask, causal, scale, dropout, training)
        if out is not None:
            return out
    scorer.prepare(call)
    rows_list = chunk_rows(scorer, call, scorer.bands_count)
    q_len, kv_len, outputs = call.query.shape[2], call.key.shape[2], []
    for rows in rows_list:
        bands = scorer.bands(call, rows)
        fast = implementation == "sdpa" and mask is None and len(rows_list) == 1 and bands.far is None
        extra = {"is_causal": causal and q_len > 1} if fast else {}
        rows_mask = None if fast else chunk_mask(mask, causal, rows, q_len, kv_len, call.query.device)
        out = KERNELS[implementation](bands, call.state["value"], rows_mask, scale, dropout, training, **extra)
        outputs.append(scorer.finish(call, out, rows))
    return torch.cat(outputs, dim=2)


def attend(implementation: str, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature; returns (output [B, q, H, dv], None: no weights kept)."""
    name = attention_type_of(module)
    check_module(module, name, implementation)
    refuse_extras(name, kwargs)
    key, value = crop_empty_slots(query, key, value, attention_mask)
    call = make_call(module, name, query, key, value, attention_mask, kwargs.get("position_ids"))
    scorer = SCORERS[name]
    causal = kwargs.get("is_causal") if kwargs.get("is_causal") is not None else getattr(module, "is_causal", True)
    scale = (scaling if scaling is not None else query.shape[-1] ** -0.5) * call.score_scale
    out = run_chunks(implementation, scorer, call, attention_mask, causal, scale, dropout, module)
    return out.transpose(1, 2).contiguous(), None
