"""Llama: separate q/k/v projections (optional biases via ``attention_bias``), GQA, explicit head_dim."""

from .family import Family, Projection, register_family

ATTENTION = (Projection("self_attn.q_proj", ("q",)), Projection("self_attn.k_proj", ("k",)))

LLAMA = register_family(Family(model_types=("llama",), projections=ATTENTION, attention=True))
