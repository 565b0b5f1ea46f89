"""``roper``: RoPER (labml.ai), RoPE scores plus values rotated by their position n and the attention output
rotated back by the query position m, so the output is sum_n a_mn R((n - m) theta) v_n: relative only.

``value_rotary_factor`` f (labml's ``rope_value_percentage``, required: it is how the model was trained) turns the
first r_v = 2 floor(f r / 2) value dims, r the rotary dim of q/k, in pairs (j, j + r_v/2) with their own
frequencies theta_j = b^(-2j/r_v); value dims past r_v pass through."""

from __future__ import annotations

import torch

from ..frequencies.common import inv_freq_for_base
from ..registry import REQUIRED, Param, RopeMethod
from . import rotated_cache
from .params import FAMILIES, check_family
from .rotation import plain_rope, rotate
from .scoring import Call, Scorer, register_attention


def value_inv_freq(call: Call) -> torch.Tensor:
    """theta_j [r_v/2] float64 of the value dims RoPER turns (see the module's comment), once per call."""
    if "value_inv_freq" not in call.state:
        call.state["value_inv_freq"] = _value_inv_freq(call)
    return call.state["value_inv_freq"]


def _value_inv_freq(call: Call) -> torch.Tensor:
    factor = float(call.params["value_rotary_factor"])
    rotary_dim = 2 * int(factor * call.inv_freq.shape[-1])
    if rotary_dim < 2 or rotary_dim > call.value.shape[-1]:
        raise ValueError(
            f"rope_parameters['value_rotary_factor']={factor!r} turns {rotary_dim} value dims of "
            f"{call.value.shape[-1]} (rotary dim {2 * call.inv_freq.shape[-1]}): allowed a factor that turns at "
            "least one pair and at most the value head dim"
        )
    return inv_freq_for_base(float(call.params["rope_theta"]), rotary_dim, call.value.device, torch.float64)


def check_roper(params: dict, config) -> None:
    check_family(params, config)
    factor = params.get("value_rotary_factor")
    if factor is not None and not 0 < factor <= 1:
        raise ValueError(
            f"rope_parameters['value_rotary_factor']={factor!r} is invalid for rope_type='roper': allowed 0 < f <= 1"
        )


class RoperScorer(Scorer):
    def prepare(self, call: Call) -> None:
        super().prepare(call)
        call.state["value"] = rotate(call.value, call.k_pos, value_inv_freq(call))

    def fast_values(self, module, call: Call, old_rows: int) -> torch.Tensor:
        """Values [B, Hkv, kv, dv] rotated by their positions, remembered across decode steps."""
        inv_freq = value_inv_freq(call)
        tag = ("value", tuple(inv_freq.tolist()))
        turn = lambda x, p: rotate(x, p, inv_freq)  # noqa: E731
        return rotated_cache.rotated(module, "value", tag, call.value, call.k_pos, old_rows, turn)

    def finish(self, call: Call, out: torch.Tensor, rows: slice) -> torch.Tensor:
        return rotate(out, -call.q_pos[:, rows], value_inv_freq(call))


METHOD = register_attention(
    RopeMethod(
        name="roper",
        kind="attention",
        frequencies=plain_rope,
        params={
            "value_rotary_factor": Param(
                default=REQUIRED,
                exclusive_minimum=0,
                help="fraction of the rotary dims whose values are turned too (labml's rope_value_percentage), <= 1",
            )
        },
        summary="RoPER: values rotated by position, output rotated back by the query's (needs training)",
        check=check_roper,
        families=FAMILIES,
        training_free=False,
        example={"value_rotary_factor": 1.0},
    ),
    RoperScorer(),
)
