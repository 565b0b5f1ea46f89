"""``xpos``: xPos, ordinary RoPE scores times zeta_i^((m - n)/scale_base) per rotary pair i,
zeta_i = (2i/d + gamma) / (1 + gamma). How it is computed within the float range: ``xpos_scorer``.
"""

from __future__ import annotations

from ..registry import REQUIRED, Param, RopeMethod
from .params import FAMILIES, check_family
from .table import plain_rope, register_attention


def xpos_scorer():
    from .xpos_scorer import XposScorer  # torch: imported when the attention function first runs the type

    return XposScorer()


METHOD = register_attention(
    RopeMethod(
        name="xpos",
        kind="attention",
        frequencies=plain_rope,
        params={
            "scale_base": Param(
                default=REQUIRED,
                exclusive_minimum=0,
                help="positions per decay step s, as the model was trained with (the paper and torchscale use 512)",
            ),
            "gamma": Param(default=0.4, exclusive_minimum=0, help="zeta_i = (2i/d + gamma)/(1 + gamma)"),
        },
        summary="xPos: RoPE scores decayed by zeta_i^((m-n)/scale_base) per pair (needs a model trained with it)",
        check=check_family,
        families=FAMILIES,
        training_free=False,
        example={"scale_base": 512.0},
    ),
    xpos_scorer,
)
