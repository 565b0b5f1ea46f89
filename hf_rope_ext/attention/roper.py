"""``roper``: RoPER (labml.ai), RoPE scores plus values rotated by their position n and the attention output
rotated back by the query position m, so the output is sum_n a_mn R((n - m) theta) v_n: relative only."""

from __future__ import annotations

import torch

from ..registry import RopeMethod
from .params import FAMILIES, check_family
from .rotation import plain_rope, rotate
from .scoring import Call, Scorer, register_attention


class RoperScorer(Scorer):
    def prepare(self, call: Call) -> None:
        super().prepare(call)
        rotary_dim = 2 * call.inv_freq.shape[-1]
        if call.value.shape[-1] < rotary_dim:
            raise ValueError(f"roper rotates values: value head dim {call.value.shape[-1]} < rotary dim {rotary_dim}")
        call.state["value"] = rotate(call.value, call.k_pos, call.inv_freq)

    def finish(self, call: Call, out: torch.Tensor, rows: slice) -> torch.Tensor:
        return rotate(out, -call.q_pos[:, rows], call.inv_freq)


METHOD = register_attention(
    RopeMethod(
        name="roper",
        kind="attention",
        frequencies=plain_rope,
        summary="RoPER: values rotated by position, output rotated back by the query's (needs training)",
        check=check_family,
        families=FAMILIES,
        training_free=False,
    ),
    RoperScorer(),
)
