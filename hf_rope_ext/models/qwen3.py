"""Qwen3: q_proj/k_proj plus q_norm/k_norm, RMSNorms over head_dim applied before RoPE: their weight
[head_dim] is one head's rotary dims, so it moves with the rows."""

from .family import Family, Projection, register_family

ATTENTION = (
    Projection("self_attn.q_proj", ("q",)),
    Projection("self_attn.k_proj", ("k",)),
    Projection("self_attn.q_norm", ("n",)),
    Projection("self_attn.k_norm", ("n",)),
)

QWEN3 = register_family(Family(model_types=("qwen3",), projections=ATTENTION, attention=True))
