"""``xpos``: xPos, ordinary RoPE scores times zeta_i^((m - n)/scale_base) per rotary pair i,
zeta_i = (2i/d + gamma) / (1 + gamma). How the engine keeps it within the float range: ``engine.decay_and_value_turns``.

Paper: Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv 2212.10554. Checked against microsoft/torchscale
``torchscale/component/xpos_relative_position.py`` (``XPOS``: scale (2i + 0.4 d) / (1.4 d) to the power position /
``scale_base``, queries times it, keys divided by it) and lucidrains/rotary-embedding-torch
``rotary_embedding_torch/rotary_embedding_torch.py`` (``use_xpos``, the same scale, ``xpos_scale_base`` 512); both
centre the positions, an offset that cancels in the scores. gamma = 0.4 is their constant.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...frequencies.common import plain_frequencies
from ...types.declare import REQUIRED, Param, RopeMethod
from ...types.registry import register
from .form import AttentionForm, Decay
from .params import FAMILIES, TEMPERATURE, check_family

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads this module
    from torch import Tensor


def log_zeta(two_i_over_d: Tensor, params: dict) -> Tensor:
    """log zeta_i for the d/2 rotary pairs (2i/d [d/2] float64), all < 0."""
    gamma = float(params["gamma"])
    return ((two_i_over_d + gamma) / (1.0 + gamma)).log()


def scale_base(params: dict) -> float:
    return float(params["scale_base"])


def steepest(params: dict) -> float:
    """-log zeta_0 = log((1 + gamma) / gamma): pair 0 decays fastest."""
    gamma = float(params["gamma"])
    return math.log((1.0 + gamma) / gamma)


METHOD = register(
    RopeMethod(
        name="xpos",
        kind="attention",
        frequencies=plain_frequencies,
        params={
            "scale_base": Param(
                default=REQUIRED,
                exclusive_minimum=0,
                help="positions per decay step s, as the model was trained with (the paper and torchscale use 512)",
            ),
            "gamma": Param(default=0.4, exclusive_minimum=0, help="zeta_i = (2i/d + gamma)/(1 + gamma)"),
            **TEMPERATURE,
        },
        summary="xPos: RoPE scores decayed by zeta_i^((m-n)/scale_base) per pair (needs a model trained with it)",
        check=check_family,
        families=FAMILIES,
        training_free=False,
        example={"scale_base": 512.0},
        attention=AttentionForm(decay=Decay(log_zeta, scale_base, steepest)),
    )
)
