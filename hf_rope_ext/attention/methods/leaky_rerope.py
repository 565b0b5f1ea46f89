"""``leaky_rerope``: distance m - n inside the window, window + (m - n - window) / factor beyond it.

Far band: query rotated by m/factor + window - window/factor, key by n/factor (fractional positions).

Source: Jianlin Su 2023, the leaky variant of "Rectified Rotary Position Embeddings" (blog
https://kexue.fm/archives/9708; no arXiv paper). Checked against bojone/rerope ``leaky_rerope_patch.py``
(``forward_with_leaky_rerope``): the far scores use positions divided by ``scaling_factor``, the query at
m + window (factor - 1) and the key at n, i.e. the rotations above; its query scaling is ReRoPE's
(``attention_temperature="log"`` here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...frequencies.common import plain_frequencies
from ...types.declare import RopeMethod
from ...types.registry import register
from .form import two_bands
from .params import FACTOR, FAMILIES, TEMPERATURE, WINDOWED, check_window, far_window

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads this module
    from torch import Tensor


def far_query(m: Tensor, params: dict) -> Tensor:
    w, f = float(params["window"]), float(params["factor"])
    return m.double() / f + (w - w / f)


def far_key(n: Tensor, params: dict) -> Tensor:
    return n.double() / float(params["factor"])


def extension_defaults(pretrained: int, factor: float | None) -> dict:
    """Window L0/4 and, for s x L0 tokens, the slope k that just fits them: window + (s L0 - window) / k = L0."""
    params = far_window(pretrained)
    if factor is not None:
        params["factor"] = max(1.0, (factor * pretrained - params["window"]) / (pretrained - params["window"]))
    return params


METHOD = register(
    RopeMethod(
        name="leaky_rerope",
        kind="attention",
        frequencies=plain_frequencies,
        params={"factor": FACTOR, **WINDOWED, **TEMPERATURE},
        summary="leaky ReRoPE: m-n inside the window, window + (m-n-window)/factor beyond",
        check=check_window,
        families=FAMILIES,
        example={"window": 16, "factor": 4.0},
        defaults=extension_defaults,
        attention=two_bands(far_query, far_key),
    )
)
