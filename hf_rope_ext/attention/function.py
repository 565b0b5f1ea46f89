"""The attention function of the package's types: checks, positions, then the fast or the reference engine.

``attend`` is what transformers calls (through the functions ``_transformers.attention_interface`` registers
under each of ``IMPLEMENTATIONS``) for a module whose config names one of these types. Queries and keys arrive
unrotated (the rotary module got zero frequencies) and the KV cache holds unrotated keys, so each call rotates
with exact positions: ``"eager"`` runs the reference engine; ``"sdpa"``, flash-attention and flex run the fast
engine where it applies (on CUDA its kernel is compiled flex_attention, see ``engine.kernels``), their masks first
read into the engines' form (``mask_formats``). While torch.compile traces the call (transformers' compiled decode
of ``generate(cache_implementation="static")``, or a user's ``torch.compile``), ``attend_traced`` runs instead:
static shapes, nothing read back from the device, no state beside the tensors.
"""

from __future__ import annotations

import torch

from ..models import unsupported_reason
from ..types import registry
from .engine import fast, reference, rotated_cache, static_rows, traced_step
from .engine.call import Call, crop_empty_slots, query_positions
from .engine.temperature import temper
from .layer import Layer, resolve
from .mask_formats import FLASH, FLEX, causal_on_cache, engine_mask

IMPLEMENTATIONS = ("eager", "sdpa", FLEX, *FLASH)  # the attention implementations that run these types


def check_module(module, name: str, implementation: str) -> registry.RopeMethod:
    method = registry.get_method(name)
    model_type = getattr(module.config, "model_type", None)
    if method.families is not None and model_type not in method.families:
        raise ValueError(
            f"rope_type={name!r} does not support model_type={model_type!r} ({unsupported_reason(model_type)}); "
            f"supported: {list(method.families)}"
        )
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation={implementation!r} cannot apply rope_type={name!r} (the engine does not run "
            f"through it); use one of {sorted(IMPLEMENTATIONS)}"
        )
    return method


def refuse_extras(module, name: str, implementation: str, kwargs: dict) -> float | None:
    """The score softcap to apply (None: none); raises for what the engines cannot apply."""
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


def make_call(layer: Layer, module, query, key, value, mask, position_ids, memory) -> Call:
    """Positions of queries and keys, the frequencies the layer rotates by (kv heads as they come); the rotation's
    identity only where rows are remembered (``memory``)."""
    batch, _, q_len, _ = query.shape
    q_pos = query_positions(position_ids, batch, q_len)
    tagged = memory is not None
    inv_freq, score_scale, tag = layer.frequencies(module.config, q_pos, mask, key.shape[2], query.device, tagged)
    query = temper(query, q_pos, layer.params, module.config)  # attention temperature (none: unchanged)
    return Call(
        query,
        key,
        value,
        q_pos,
        mask,
        inv_freq,
        layer.params,
        layer.form,
        tag,
        score_scale,
        memory,
        constants=layer.constants,
    )


def causal_and_scale(module, call: Call, scaling, kwargs: dict) -> tuple[bool, float]:
    """(whether attention is causal where no mask says otherwise, the softmax scale with the layer's own factor)."""
    causal = kwargs.get("is_causal") if kwargs.get("is_causal") is not None else getattr(module, "is_causal", True)
    return causal, (scaling if scaling is not None else call.query.shape[-1] ** -0.5) * call.score_scale


def attend_traced(layer: Layer, implementation: str, module, query, key, value, mask, scaling, dropout, kwargs):
    """``attend_layer`` while torch.compile traces the call: nothing read back from the device, no Python state
    on tensors, shapes as they come (a static cache's unfilled slots stay, masked, never cut off). The reference
    engine scores every band, its masks built from positions on the device (a banded type's decode step:
    ``traced_step``, its near bands over the newest keys' slots alone, the last band over a static cache layer's
    turned rows where it keeps them: ``static_rows``, written here for the keys this update wrote)."""
    softcap = refuse_extras(module, layer.name, implementation, kwargs)
    mask = engine_mask(implementation, mask, query.shape[2], key.shape[2], kwargs, query.device, simplify=False)
    static, written = static_rows.attached(key, layer.kept_tag(query.device)), (key, value)
    if mask is None:  # an empty static cache (several queries, more keys): the slots after the queries are unfilled
        key, value, _ = crop_empty_slots(query, key, value, None)
    check_window_mask(module, layer.name, mask, key, kwargs.get("sliding_window"))
    call = make_call(layer, module, query, key, value, mask, kwargs.get("position_ids"), None)
    if static is not None:  # the keys this update wrote, turned into the static rows the step reads
        call.static = static
        static_rows.write(static, call, *written)
    causal, scale = causal_and_scale(module, call, scaling, kwargs)
    if traced_step.applies(call, dropout, module.training):  # a banded decode step: its near span gathered
        out = traced_step.run(call, mask, scale, dropout, module.training, softcap)
    else:
        out = reference.run(call, mask, causal, scale, dropout, module.training, softcap)
    return out.transpose(1, 2).contiguous(), None


def attend_layer(
    layer: Layer, implementation: str, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """``attend`` for a module already resolved to ``layer``."""
    check_module(module, layer.name, implementation)
    if torch.compiler.is_compiling():
        return attend_traced(layer, implementation, module, query, key, value, attention_mask, scaling, dropout, kwargs)
    softcap = refuse_extras(module, layer.name, implementation, kwargs)
    attention_mask = engine_mask(implementation, attention_mask, query.shape[2], key.shape[2], kwargs, query.device)
    memory = rotated_cache.kept_by_cache(key) or rotated_cache.beside(module)  # before cropping: the layer's keys
    key, value, attention_mask = crop_empty_slots(query, key, value, attention_mask)
    attention_mask = causal_on_cache(attention_mask, query.shape[2], key.shape[2])  # unmasked plans on a cache
    check_window_mask(module, layer.name, attention_mask, key, kwargs.get("sliding_window"))
    call = make_call(layer, module, query, key, value, attention_mask, kwargs.get("position_ids"), memory)
    if memory.layer is not None:  # a cache layer's own keys: its static rows written and read (a static cache's)
        call.static = memory.layer.keep_static(call)
    causal, scale = causal_and_scale(module, call, scaling, kwargs)
    out = None
    if implementation != "eager":
        out = fast.run(call, module, attention_mask, causal, scale, dropout, module.training)
    if out is None:
        out = reference.run(call, attention_mask, causal, scale, dropout, module.training, softcap)
    return out.transpose(1, 2).contiguous(), None


def attend(implementation: str, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature; returns (output [B, q, H, dv], None: no weights kept)."""
    layer = resolve(module)
    if layer is None:
        raise ValueError(f"{type(module).__name__} names no rope_type of this package that rotates in attention")
    return attend_layer(layer, implementation, module, query, key, value, attention_mask, scaling, dropout, **kwargs)
