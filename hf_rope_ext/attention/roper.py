"""``roper``: RoPER (labml.ai), RoPE scores plus values rotated by their position n and the attention output
rotated back by the query position m, so the output is sum_n a_mn R((n - m) theta) v_n: relative only.

``value_rotary_factor`` f (labml's ``rope_value_percentage``, required: it is how the model was trained) turns the
first r_v = 2 floor(f r / 2) value dims, r the rotary dim of q/k, in pairs (j, j + r_v/2) with their own
frequencies theta_j = b^(-2j/r_v); value dims past r_v pass through."""

from __future__ import annotations

from ..registry import REQUIRED, Param, RopeMethod
from .params import FAMILIES, check_family
from .table import plain_rope, register_attention


def check_roper(params: dict, config) -> None:
    check_family(params, config)
    factor = params.get("value_rotary_factor")
    if factor is not None and not 0 < factor <= 1:
        raise ValueError(
            f"rope_parameters['value_rotary_factor']={factor!r} is invalid for rope_type='roper': allowed 0 < f <= 1"
        )


def roper_scorer():
    from .roper_scorer import RoperScorer  # torch: imported when the attention function first runs the type

    return RoperScorer()


METHOD = register_attention(
    RopeMethod(
        name="roper",
        kind="attention",
        frequencies=plain_rope,
        params={
            "value_rotary_factor": Param(
                default=REQUIRED,
                exclusive_minimum=0,
                help="fraction of the rotary dims whose values are turned too (labml's rope_value_percentage), <= 1",
            )
        },
        summary="RoPER: values rotated by position, output rotated back by the query's (needs training)",
        check=check_roper,
        families=FAMILIES,
        training_free=False,
        example={"value_rotary_factor": 1.0},
    ),
    roper_scorer,
)
