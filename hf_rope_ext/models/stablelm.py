"""StableLM: q_proj/k_proj (optional biases), partial rotary (``partial_rotary_factor``, 0.25 by default).

Its optional per-head q/k LayerNorms (``qk_layernorm=True``) would need their own permutation: refused.
"""

from .family import Family, HeadShape, Projection, config_head_shape, register_family


def stablelm_head_shape(config) -> HeadShape:
    if getattr(config, "qk_layernorm", False):
        raise ValueError("qk_layernorm=True (per-head q/k LayerNorms) is not supported by RoPE layout conversion")
    return config_head_shape(config)


ATTENTION = (Projection("self_attn.q_proj", ("q",)), Projection("self_attn.k_proj", ("k",)))

STABLELM = register_family(
    Family(model_types=("stablelm",), projections=ATTENTION, head_shape=stablelm_head_shape, attention=True)
)
