"""``self_extend``: Self-Extend (LongLM) grouped attention (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM
Context Window Without Tuning", arXiv 2401.01325).

Distance m - n inside the neighbour window; beyond it m//g - n//g + window - window//g (g = ``group_size``):
the query is rotated by m//g + window - window//g, the key by n//g.

``authors_defaults`` picks window and group for a target of s x L0 by the authors' empirical rule (datamllab/LongLM
README, "How to choose the group_size and neighbor_window"): (1/2 ~ 2/3) L0 > W + (N - W) / G, i.e. only the
relative positions up to about 2/3 of L0 are well trained.

Checked against datamllab/LongLM ``self_extend_patch/Llama.py`` (``self_extend_forward``, ``group_size_1`` = g,
``group_size_2`` = window): neighbour scores where m - n < window, grouped ones with the query at m // g + window -
window / g and the key at n // g. Here the query takes window // g, as ``flash_self_extend_forward``'s decode step
does; the two agree whenever g divides the window. Its optional query scaling (``scale_base`` = L0) is
``attention_temperature="log"`` here.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from ...frequencies.common import plain_frequencies
from ...types.declare import RopeMethod
from ...types.registry import register
from .form import two_bands
from .params import FAMILIES, GROUP_SIZE, TEMPERATURE, WINDOWED, check_window

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads this module
    from torch import Tensor


def far_query(m: Tensor, params: dict) -> Tensor:
    g, w = int(params["group_size"]), int(params["window"])
    return m.div(g, rounding_mode="floor") + (w - w // g)


def far_key(n: Tensor, params: dict) -> Tensor:
    return n.div(int(params["group_size"]), rounding_mode="floor")


WINDOW_FRACTION = 4  # neighbour window L0/4 (the authors' 512..1536 for a 4k model; their example 1024)
WELL_TRAINED = Fraction(2, 3)  # the farthest grouped distance W + (N - W)/G at most this fraction of L0


def authors_defaults(factor: float, pretrained: int) -> dict:
    """{"window": W, "group_size": G} for N = factor x L0 tokens: W = L0/4, G the smallest group with
    W + (N - W)/G <= 2/3 L0 (at least 1)."""
    window = max(1, pretrained // WINDOW_FRACTION)
    reach = WELL_TRAINED * pretrained - window  # grouped distances available beyond the window
    group = math.ceil((Fraction(factor) * pretrained - window) / reach)  # exact: a fit on the bound stays
    return {"window": window, "group_size": max(1, group)}


METHOD = register(
    RopeMethod(
        name="self_extend",
        kind="attention",
        frequencies=plain_frequencies,
        params={"group_size": GROUP_SIZE, **WINDOWED, **TEMPERATURE},
        summary="Self-Extend: exact inside the window, floor(pos/group_size) beyond",
        check=check_window,
        families=FAMILIES,
        example={"window": 16, "group_size": 4},
        defaults=lambda pretrained, factor: authors_defaults(factor or 1.0, pretrained),
        attention=two_bands(far_query, far_key),
    )
)
