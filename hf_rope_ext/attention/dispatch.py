"""The attention function of the attention-level rope types: positions, heads, chunks, kernel, output.

``attend`` is what transformers calls (through the functions ``_transformers`` registers under ``"eager"`` and
``"sdpa"``) for a module whose config names one of these types. Queries and keys arrive unrotated (the rotary
module got zero frequencies) and the KV cache holds unrotated keys, so each call rotates with exact positions.
"""

from __future__ import annotations

import torch

from .. import registry
from . import rotated_cache
from .cache_layers import memory_of
from .fast import run as run_fast
from .kernel import KERNELS
from .params import is_nope_layer, unsupported_reason
from .positions import chunk_mask, key_positions, query_positions
from .scoring import SCORERS, Call, filled, routes_through_attention

SCORE_BUDGET = 2**26  # score elements per band and query chunk (256 MiB in float32), whatever the input length


def layer_rope(module) -> tuple[dict, str | None] | None:
    """(rope_parameters of this attention module's layer, layer_type or None when flat), or None when it has none.

    Nested per layer type (Gemma 3's local/global layers) when the entry of the module's ``layer_types[layer_idx]``
    is a dict, as the rotary module reads them; else flat (Qwen2 and Gemma 2 have ``layer_types`` but flat ones).
    """
    config = getattr(module, "config", None)
    params = getattr(config, "rope_parameters", None)
    if not params:
        return None
    layer_types = getattr(config, "layer_types", None)
    layer_idx = getattr(module, "layer_idx", None)
    if layer_types is not None and layer_idx is not None and layer_types[layer_idx] in params:
        layer_type = layer_types[layer_idx]
        refuse_flat_beside_nested(config, params)
        return params[layer_type] or None, layer_type  # None: a layer without RoPE
    if "rope_type" in params or "type" in params:
        return params, None
    return None


def refuse_flat_beside_nested(config, params: dict) -> None:
    """A package type given flat to a config with per-layer-type parameters would be ignored: refuse it."""
    stray = params.get("rope_type", params.get("type"))
    if stray is not None and stray in registry.available_rope_types():
        nested = sorted(k for k, v in params.items() if isinstance(v, dict))
        raise ValueError(
            f"rope_parameters['rope_type']={stray!r} is set beside the per-layer-type entries {nested} of "
            f"model_type={getattr(config, 'model_type', None)!r}, whose rotary module reads only those: put the type "
            f"in each layer type's dict, e.g. rope_parameters={{{nested[0]!r}: {{'rope_type': {stray!r}, ...}}, ...}}"
        )


def attention_type_of(module) -> str | None:
    """The package's attention-level rope_type that this module uses, or None (stock attention)."""
    found = layer_rope(module)
    if found is None or found[0] is None or is_nope_layer(module):
        return None
    name = found[0].get("rope_type", found[0].get("type"))
    return name if name in SCORERS and routes_through_attention(name, module.config) else None


def check_module(module, name: str, implementation: str) -> registry.RopeMethod:
    method = registry.get_method(name)
    model_type = getattr(module.config, "model_type", None)
    if method.families is not None and model_type not in method.families:
        raise ValueError(
            f"rope_type={name!r} does not support model_type={model_type!r} ({unsupported_reason(model_type)}); "
            f"supported: {list(method.families)}"
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


def make_call(module, name, query, key, value, mask, position_ids, memory) -> Call:
    """Positions of queries and keys, the frequencies the layer's scorer rotates by (kv heads as they come)."""
    rope, layer_type = layer_rope(module)
    batch, heads, q_len, _ = query.shape
    q_pos = query_positions(position_ids, batch, q_len)
    k_pos = key_positions(q_pos, mask, key.shape[2])
    inv_freq, score_scale = SCORERS[name].frequencies(module.config, layer_type, q_pos, k_pos, query.device)
    params = filled(rope, registry.get_method(name))
    return Call(query, key, value, q_pos, k_pos, inv_freq, params, score_scale, memory)


def refuse_extras(module, name: str, implementation: str, kwargs: dict) -> float | None:
    """The score softcap to apply (None: none); raises for what the kernels cannot apply."""
    model_type = getattr(module.config, "model_type", None)
    if kwargs.get("position_bias") is not None:
        raise ValueError(f"position_bias={kwargs['position_bias']!r} is not supported with rope_type={name!r}")
    softcap = kwargs.get("softcap")
    if softcap is not None and implementation != "eager":
        raise ValueError(
            f"model_type={model_type!r} caps attention scores (attn_logit_softcapping={softcap!r}), which "
            f"attn_implementation={implementation!r} cannot apply with rope_type={name!r}; "
            'load the model with attn_implementation="eager"'
        )
    return softcap


def check_window_mask(module, name: str, mask, key, sliding_window) -> None:
    """A sliding-window layer keeps its window through the mask: without one, every key must be inside it."""
    if mask is None and sliding_window is not None and key.shape[2] > sliding_window:
        raise ValueError(
            f"a sliding-window layer (sliding_window={sliding_window}) of model_type="
            f"{getattr(module.config, 'model_type', None)!r} got {key.shape[2]} keys and no attention mask; "
            f"rope_type={name!r} applies the window through the mask transformers builds for it"
        )


def crop_empty_slots(query, key, value, mask):
    """(key, value, mask) without the key slots no query may see at the end (a static cache's unfilled slots),
    and without a mask when a single query sees every key left (a static cache's decode step, as a dynamic
    cache's). No mask, several queries, more keys: an empty static cache, which sdpa crops to the first q_len slots.
    """
    q_len, kv = query.shape[2], key.shape[2]
    if mask is None:
        short = q_len > 1 and kv > q_len
        return (key[:, :, :q_len], value[:, :, :q_len], None) if short else (key, value, None)
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    seen = allowed.reshape(-1, allowed.shape[-1]).any(0)  # [kv]: some query may see the key
    end = kv - int(seen.flip(0).to(torch.uint8).argmax())  # past the last seen key (none seen: kv)
    if end < kv:
        key, value, mask, allowed = key[:, :, :end], value[:, :, :end], mask[..., :end], allowed[..., :end]
    return key, value, None if q_len == 1 and bool(allowed.all()) else mask


def run_chunks(
    implementation, scorer, call: Call, mask, causal: bool, scale: float, dropout: float, module, softcap=None
):
    """The attention output [B, H, q, dv]: ``fast.run`` for sdpa where it applies, else one query chunk at a time.
    ``softcap`` reaches eager only (``refuse_extras`` refuses it for sdpa)."""
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
        if softcap is not None:  # eager only (refuse_extras): families with attn_logit_softcapping (Gemma 2)
            extra["softcap"] = softcap
        rows_mask = None if fast else chunk_mask(mask, causal, rows, q_len, kv_len, call.query.device)
        out = KERNELS[implementation](bands, call.state["value"], rows_mask, scale, dropout, training, **extra)
        outputs.append(scorer.finish(call, out, rows))
    return torch.cat(outputs, dim=2)


def attend(implementation: str, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature; returns (output [B, q, H, dv], None: no weights kept)."""
    name = attention_type_of(module)
    check_module(module, name, implementation)
    softcap = refuse_extras(module, name, implementation, kwargs)
    memory = memory_of(key) or rotated_cache.beside(module)  # the cache layer's own, else compared (before cropping)
    key, value, attention_mask = crop_empty_slots(query, key, value, attention_mask)
    check_window_mask(module, name, attention_mask, key, kwargs.get("sliding_window"))
    call = make_call(module, name, query, key, value, attention_mask, kwargs.get("position_ids"), memory)
    scorer = SCORERS[name]
    causal = kwargs.get("is_causal") if kwargs.get("is_causal") is not None else getattr(module, "is_causal", True)
    scale = (scaling if scaling is not None else query.shape[-1] ** -0.5) * call.score_scale
    out = run_chunks(implementation, scorer, call, attention_mask, causal, scale, dropout, module, softcap)
    return out.transpose(1, 2).contiguous(), None
