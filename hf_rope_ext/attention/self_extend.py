"""``self_extend``: Self-Extend (LongLM) grouped attention.

Distance m - n inside the neighbour window; beyond it m//g - n//g + window - window//g (g = ``group_size``):
the query is rotated by m//g + window - window//g, the key by n//g.
"""

from __future__ import annotations

import torch

from ..registry import RopeMethod
from .params import FAMILIES, GROUP_SIZE, WINDOWED, check_window
from .rotation import plain_rope
from .scoring import register_attention
from .windowed import WindowedScorer


def far_query(m: torch.Tensor, params: dict) -> torch.Tensor:
    g, w = int(params["group_size"]), int(params["window"])
    return torch.div(m, g, rounding_mode="floor") + (w - w // g)


def far_key(n: torch.Tensor, params: dict) -> torch.Tensor:
    return torch.div(n, int(params["group_size"]), rounding_mode="floor")


METHOD = register_attention(
    RopeMethod(
        name="self_extend",
        kind="attention",
        frequencies=plain_rope,
        params={"group_size": GROUP_SIZE, **WINDOWED},
        summary="Self-Extend: exact inside the window, floor(pos/group_size) beyond",
        check=check_window,
        families=FAMILIES,
        example={"window": 16, "group_size": 4},
    ),
    WindowedScorer(far_query, far_key),
)
