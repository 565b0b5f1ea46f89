"""RoFormer: query/key (with biases) rotate whole heads; its native layout is interleaved.

Its runtime (hf_rope_ext.attention.roformer) rotates the layout its config records, so a live RoFormer holds
that layout in memory: converting one permutes its tensors in place of a load-time op. Its own rotation runs the
dynamic frequency types statelessly; the attention function does not serve it (RoPER runs in its own runtime).
"""

from .family import Family, HeadShape, Projection, checked, register_family


def roformer_head_shape(config) -> HeadShape:
    heads = config.num_attention_heads
    if config.hidden_size % heads:
        raise ValueError(f"hidden_size={config.hidden_size} is not a multiple of num_attention_heads={heads}")
    head_dim = config.hidden_size // heads
    return checked(HeadShape(heads, heads, head_dim, head_dim))


ATTENTION = (Projection("attention.self.query", ("q",)), Projection("attention.self.key", ("k",)))

ROFORMER = register_family(
    Family(
        model_types=("roformer",),
        projections=ATTENTION,
        default_layout="interleaved",
        loads_to_half=False,
        head_shape=roformer_head_shape,
        own_dynamic=True,
    )
)
