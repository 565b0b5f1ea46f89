"""Phi-3: one fused ``qkv_proj`` whose rows are [q heads | k heads | v heads]; partial rotary allowed."""

from .family import Family, Projection, register_family

ATTENTION = (Projection("self_attn.qkv_proj", ("q", "k", "v")),)

PHI3 = register_family(Family(model_types=("phi3",), projections=ATTENTION, attention=True))
