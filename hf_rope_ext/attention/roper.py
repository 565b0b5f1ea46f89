"""``roper``: RoPER (labml.ai), RoPE scores plus values rotated by their position n and the attention output
rotated back by the query position m, so the output is sum_n a_mn R((n - m) theta) v_n: relative only."""

from __future__ import annotations

import torch

from ..registry import RopeMethod
from . import rotated_cache
from .params import FAMILIES, check_family
from .rotation import plain_rope, rotate
from .scoring import Call, Scorer, register_attention


def check_value_dim(call: Call) -> None:
    rotary_dim = 2 * call.inv_freq.shape[-1]
    if call.value.shape[-1] < rotary_dim:
        raise ValueError(f"roper rotates values: value head dim {call.value.shape[-1]} < rotary dim {rotary_dim}")


class RoperScorer(Scorer):
    def prepare(self, call: Call) -> None:
        super().prepare(call)
        check_value_dim(call)
        call.state["value"] = rotate(call.value, call.k_pos, call.inv_freq)

    def fast_values(self, module, call: Call, old_rows: int) -> torch.Tensor:
        """Values [B, Hkv, kv, dv] rotated by their positions, remembered across decode steps."""
        check_value_dim(call)
        tag = ("value", tuple(call.inv_freq.tolist()))
        turn = lambda x, p: rotate(x, p, call.inv_freq)  # noqa: E731
        return rotated_cache.rotated(module, "value", tag, call.value, call.k_pos, old_rows, turn)

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
