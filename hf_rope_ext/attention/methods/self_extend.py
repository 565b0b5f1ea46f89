"""``self_extend``: Self-Extend (LongLM) grouped attention.

Distance m - n inside the neighbour window; beyond it m//g - n//g + window - window//g (g = ``group_size``):
the query is rotated by m//g + window - window//g, the key by n//g.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...declare import RopeMethod
from ...frequencies.common import plain_frequencies
from .form import two_bands
from .params import FAMILIES, GROUP_SIZE, TEMPERATURE, WINDOWED, check_window

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads this module
    from torch import Tensor


def far_query(m: Tensor, params: dict) -> Tensor:
    g, w = int(params["group_size"]), int(params["window"])
    return m.div(g, rounding_mode="floor") + (w - w // g)


def far_key(n: Tensor, params: dict) -> Tensor:
    return n.div(int(params["group_size"]), rounding_mode="floor")


METHOD = RopeMethod(
    name="self_extend",
    kind="attention",
    frequencies=plain_frequencies,
    params={"group_size": GROUP_SIZE, **WINDOWED, **TEMPERATURE},
    summary="Self-Extend: exact inside the window, floor(pos/group_size) beyond",
    check=check_window,
    families=FAMILIES,
    example={"window": 16, "group_size": 4},
    attention=two_bands(far_query, far_key),
)
