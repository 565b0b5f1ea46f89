"""Qwen2: the Llama attention layout with q/k/v biases on by default."""

from .family import Family, Projection, register_family

ATTENTION = (Projection("self_attn.q_proj", ("q",)), Projection("self_attn.k_proj", ("k",)))

QWEN2 = register_family(Family(model_types=("qwen2",), projections=ATTENTION, attention=True))
