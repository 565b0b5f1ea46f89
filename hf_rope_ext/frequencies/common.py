"""What every frequency function needs from a config: its rope parameters, rotary dim, base and L0.

All frequencies are computed in fp32 (or fp64 when asked) with autocast off; callers cast afterwards.
torch is imported inside the functions that compute, so that the method modules (and ``hf-rope-ext list``, which
reads their table) import without it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..models.family import head_dim_of

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RopeSetup:
    params: dict  # the flat rope_parameters of this layer type
    dim: int  # rotary dimension d (head_dim * partial_rotary_factor)
    base: float  # rope_theta b
    original_max: int  # L0: original_max_position_embeddings, defaults to max_position_embeddings
    max_position_embeddings: int


def rope_setup(config, layer_type: str | None = None) -> RopeSetup:
    """Read the rope parameters (nested per layer type when ``layer_type`` is given) and derived sizes."""
    params = config.rope_parameters[layer_type] if layer_type is not None else config.rope_parameters
    partial = params.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", None) or 1.0
    dim = int(head_dim_of(config) * partial)
    original = params.get("original_max_position_embeddings") or config.max_position_embeddings
    if params.get("rope_theta") is None:
        raise KeyError(f"rope_parameters['rope_theta'] is missing (rope_type={params.get('rope_type')!r})")
    return RopeSetup(params, dim, float(params["rope_theta"]), int(original), int(config.max_position_embeddings))


def exponents(dim: int, device=None, dtype=None) -> torch.Tensor:
    """2i/d for i = 0 .. d/2-1, shape [d/2], in ``dtype`` (float32 when None)."""
    import torch

    return torch.arange(0, dim, 2, device=device, dtype=torch.int64).to(dtype or torch.float32) / dim


def inv_freq_for_base(base: float, dim: int, device=None, dtype=None) -> torch.Tensor:
    """theta_i = base^(-2i/d), shape [d/2], in ``dtype`` (float32 when None), computed with autocast off."""
    import torch

    with torch.autocast(device_type="cpu", enabled=False):
        return 1.0 / (base ** exponents(dim, device, dtype))


@functools.lru_cache(maxsize=64)
def inv_freq64(base: float, dim: int, device: str) -> torch.Tensor:
    """theta_i [d/2] float64 on ``device`` (a name), one tensor per (base, dim, device): shared, read only (the
    attention engine tells frequency sets apart by identity)."""
    import torch

    return inv_freq_for_base(base, dim, device, dtype=torch.float64)


def correction_dim(rotations: float, dim: int, base: float, length: int) -> float:
    """The (fractional) pair index i whose wavelength turns ``rotations`` times in ``length`` positions."""
    return dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))


def correction_range(fast: float, slow: float, dim: int, base: float, length: int, truncate: bool = True):
    """Pair indices [low, high] between which a ramp runs: below ``low`` the pairs turn more than ``fast`` times."""
    low = correction_dim(fast, dim, base, length)
    high = correction_dim(slow, dim, base, length)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def ramp(low: float, high: float, n: int, device=None, dtype=None) -> torch.Tensor:
    """0 up to ``low``, 1 from ``high`` on, linear between; shape [n], float32 when ``dtype`` is None."""
    import torch

    if low == high:
        high += 0.001  # avoid dividing by zero when the ramp collapses to a step
    return ((torch.arange(n, device=device, dtype=dtype or torch.float32) - low) / (high - low)).clamp(0, 1)


def as_float(seq_len) -> float | None:
    """``seq_len`` arrives as None, an int or a 0-d tensor (transformers' dynamic updater)."""
    if seq_len is None:
        return None
    return float(seq_len.item() if hasattr(seq_len, "item") else seq_len)


def plain_frequencies(config, device=None, seq_len=None, layer_type=None):
    """Plain RoPE theta_i = b^(-2i/d) (float64, cast to float32) and attention factor 1, in ROPE_INIT_FUNCTIONS'
    signature: the frequencies the attention-level types rotate by."""
    import torch

    setup = rope_setup(config, layer_type)
    return inv_freq_for_base(setup.base, setup.dim, device, dtype=torch.float64).float(), 1.0
