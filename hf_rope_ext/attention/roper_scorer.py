"""The scorer of ``roper`` (declared in ``roper``): values rotated by their position n with their own
frequencies, the attention output rotated back by the query position m."""

from __future__ import annotations

import functools

import torch

from ..frequencies.common import inv_freq_for_base
from . import rotated_cache
from .rotation import rotate
from .scoring import Call, Scorer


def value_inv_freq(call: Call) -> torch.Tensor:
    """theta_j [r_v/2] float64 of the value dims RoPER turns (see ``roper``'s comment), once per call."""
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
    return _inv_freq64(float(call.params["rope_theta"]), rotary_dim, str(call.value.device))


@functools.lru_cache(maxsize=64)
def _inv_freq64(base: float, dim: int, device: str) -> torch.Tensor:
    """Shared between calls and layers (read only): computed once per model, not at every decode step."""
    return inv_freq_for_base(base, dim, device, torch.float64)


class RoperScorer(Scorer):
    def prepare(self, call: Call) -> None:
        super().prepare(call)
        call.state["value"] = rotate(call.value, call.k_pos, value_inv_freq(call))

    def fast_values(self, module, call: Call, old_rows: int) -> torch.Tensor:
        """Values [B, Hkv, kv, dv] rotated by their positions, remembered across decode steps."""
        inv_freq = value_inv_freq(call)
        tag = ("value", tuple(inv_freq.tolist()))
        turn = lambda x, p: rotate(x, p, inv_freq)  # noqa: E731
        return rotated_cache.rotated(call.memory, "value", tag, call.value, call.k_pos, old_rows, turn)

    def finish(self, call: Call, out: torch.Tensor, rows: slice) -> torch.Tensor:
        return rotate(out, -call.q_pos[:, rows], value_inv_freq(call))
