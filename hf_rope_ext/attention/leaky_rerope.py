"""``leaky_rerope``: distance m - n inside the window, window + (m - n - window) / factor beyond it.

Far band: query rotated by m/factor + window - window/factor, key by n/factor (fractional positions).
"""

from __future__ import annotations

import torch

from ..registry import RopeMethod
from .params import FACTOR, FAMILIES, WINDOWED, check_window
from .rotation import plain_rope
from .scoring import register_attention
from .windowed import WindowedScorer


def far_query(m: torch.Tensor, params: dict) -> torch.Tensor:
    w, f = float(params["window"]), float(params["factor"])
    return m.double() / f + (w - w / f)


def far_key(n: torch.Tensor, params: dict) -> torch.Tensor:
    return n.double() / float(params["factor"])


METHOD = register_attention(
    RopeMethod(
        name="leaky_rerope",
        kind="attention",
        frequencies=plain_rope,
        params={"factor": FACTOR, **WINDOWED},
        summary="leaky ReRoPE: m-n inside the window, window + (m-n-window)/factor beyond",
        check=check_window,
        families=FAMILIES,
        example={"window": 16, "factor": 4.0},
    ),
    WindowedScorer(far_query, far_key),
)
