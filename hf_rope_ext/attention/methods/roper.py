"""``roper``: RoPER (labml.ai), RoPE scores plus values rotated by their position n and the attention output
rotated back by the query position m, so the output is sum_n a_mn R((n - m) theta) v_n: relative only.

``value_rotary_factor`` f (labml's ``rope_value_percentage``, required: it is how the model was trained) turns the
first r_v = 2 floor(f r / 2) value dims, r the rotary dim of q/k, in pairs (j, j + r_v/2) with their own
frequencies theta_j = b^(-2j/r_v); value dims past r_v pass through.

Source: Georges Harik and Varuna Jayasiri 2022, "Rotary Positional Embeddings with Relative distances"
(https://research.labml.ai/RoPER.html; no arXiv paper). Checked against
labmlai/annotated_deep_learning_paper_implementations ``labml_nn/transformers/rope/value_pe/__init__.py``
(``RotaryValuePEMultiHeadAttention``: values turned by ``RotaryPositionalEmbeddings(d_rope_value)``, the weighted
sum turned back by ``ReverseRotaryPositionalEmbeddings``). labml turns ``int(d_k * rope_value_percentage)`` dims of
the head dim d_k with base 10000; here 2 floor(f r / 2) of the rotary dim r with the model's base b (the same dims
when r = d_k and f d_k is an even integer)."""

from __future__ import annotations

from ...frequencies.common import plain_frequencies
from ...types.declare import REQUIRED, Param, RopeMethod
from ...types.registry import register
from .form import AttentionForm, ValueTurn
from .params import FAMILIES, TEMPERATURE, check_family


def check_roper(params: dict, config) -> None:
    check_family(params, config)
    factor = params.get("value_rotary_factor")
    if factor is not None and not 0 < factor <= 1:
        raise ValueError(
            f"rope_parameters['value_rotary_factor']={factor!r} is invalid for rope_type='roper': allowed 0 < f <= 1"
        )


def value_dims(params: dict, rotary_dim: int, value_dim: int) -> int:
    """r_v = 2 floor(f r / 2): the value dims turned, at least one pair and at most the value head dim."""
    factor = float(params["value_rotary_factor"])
    dims = 2 * int(factor * (rotary_dim // 2))
    if dims < 2 or dims > value_dim:
        raise ValueError(
            f"rope_parameters['value_rotary_factor']={factor!r} turns {dims} value dims of {value_dim} (rotary dim "
            f"{rotary_dim}): allowed a factor that turns at least one pair and at most the value head dim"
        )
    return dims


METHOD = register(
    RopeMethod(
        name="roper",
        kind="attention",
        frequencies=plain_frequencies,
        params={
            "value_rotary_factor": Param(
                default=REQUIRED,
                exclusive_minimum=0,
                help="fraction of the rotary dims whose values are turned too (labml's rope_value_percentage), <= 1",
            ),
            **TEMPERATURE,
        },
        summary="RoPER: values rotated by position, output rotated back by the query's (needs training)",
        check=check_roper,
        families=FAMILIES,
        training_free=False,
        example={"value_rotary_factor": 1.0},
        attention=AttentionForm(values=ValueTurn(value_dims)),
    )
)
