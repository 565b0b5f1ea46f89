"""``rerope``: ReRoPE, relative distance min(m - n, window).

Beyond the window the query is rotated by ``window`` and the key is not rotated at all.

Source: Jianlin Su 2023, "Rectified Rotary Position Embeddings" (blog https://kexue.fm/archives/9708; no arXiv
paper). Checked against bojone/rerope ``rerope_patch.py`` (``forward_with_rerope``): the near scores rotate q and k by
their positions, the far ones the query by ``window`` and the key not at all, the near ones taken where m - n <
window; the patch's query scaling max(1, log_L0(m + 1)) is ``attention_temperature="log"`` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...frequencies.common import plain_frequencies
from ...types.declare import RopeMethod
from ...types.registry import register
from .form import origin, two_bands
from .params import FAMILIES, TEMPERATURE, WINDOWED, check_window, far_window

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads this module
    from torch import Tensor


def far_query(m: Tensor, params: dict) -> Tensor:
    return m.new_full(m.shape, int(params["window"]))


METHOD = register(
    RopeMethod(
        name="rerope",
        kind="attention",
        frequencies=plain_frequencies,
        params={**WINDOWED, **TEMPERATURE},
        summary="ReRoPE: relative distance min(m-n, window)",
        check=check_window,
        families=FAMILIES,
        example={"window": 16},
        defaults=far_window,
        attention=two_bands(far_query, origin),
    )
)
