"""``rerope``: ReRoPE, relative distance min(m - n, window).

Beyond the window the query is rotated by ``window`` and the key is not rotated at all.
"""

from __future__ import annotations

import torch

from ..registry import RopeMethod
from .params import FAMILIES, WINDOWED, check_window
from .rotation import plain_rope
from .scoring import register_attention
from .windowed import WindowedScorer


def far_query(m: torch.Tensor, params: dict) -> torch.Tensor:
    return torch.full_like(m, int(params["window"]))


def far_key(n: torch.Tensor, params: dict) -> torch.Tensor:
    return torch.zeros_like(n)


METHOD = register_attention(
    RopeMethod(
        name="rerope",
        kind="attention",
        frequencies=plain_rope,
        params=dict(WINDOWED),
        summary="ReRoPE: relative distance min(m-n, window)",
        check=check_window,
        families=FAMILIES,
        example={"window": 16},
    ),
    WindowedScorer(far_query, far_key),
)
