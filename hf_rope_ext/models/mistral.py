"""Mistral: the Llama attention layout (q_proj/k_proj, GQA, explicit head_dim), sliding window aside."""

from .family import Family, Projection, register_family

ATTENTION = (Projection("self_attn.q_proj", ("q",)), Projection("self_attn.k_proj", ("k",)))

MISTRAL = register_family(Family(model_types=("mistral",), projections=ATTENTION, attention=True))
