"""Attention temperature (``rope_parameters["attention_temperature"]``, every attention-level type): the queries
scaled before any engine runs, each by a factor of its own position alone, so a KV cache stays exact.

- ``"none"`` (default): unchanged;
- ``"constant"``: every query times (0.1 ln s + 1)^2, s = ``temperature_factor``: the scores times the square of
  YaRN's attention factor 0.1 ln s + 1, as transformers' ``yarn`` gives them (its ``attention_factor`` multiplies
  cos and sin, so both q and k); STRING's code uses s = 2, ChunkLlama's none;
- ``"log"``: the query at position m times log_L0(m + 1) where m + 1 > L0, else 1 (Qwen's ``use_logn_attn``:
  ``logn_list = [math.log(i, seq_length) if i > seq_length else 1 for i in range(1, 32768)]`` indexed by m).
"""

from __future__ import annotations

import math

import torch

from ..methods.params import pretrained_length


def constant_factor(s: float) -> float:
    """(0.1 ln s + 1)^2: YaRN's attention factor on q and k, as one factor of the scores."""
    return (0.1 * math.log(s) + 1.0) ** 2


def log_factors(q_pos: torch.Tensor, pretrained: int) -> torch.Tensor:
    """[B, q] float32: log_L0(m + 1) past L0, else 1."""
    m1 = (q_pos + 1).double()
    return (m1.log() / math.log(pretrained)).clamp(min=1.0).float()


def temper(query: torch.Tensor, q_pos: torch.Tensor, params: dict, config) -> torch.Tensor:
    """The queries [B, H, q, d] at positions q_pos [B, q] scaled as the layer's ``params`` ask (L0:
    ``original_max_position_embeddings``, else the config's ``max_position_embeddings``), in float32, cast back."""
    mode = params.get("attention_temperature") or "none"
    if mode == "none":
        return query
    if mode == "constant":
        return (query.float() * constant_factor(float(params["temperature_factor"]))).to(query.dtype)
    if mode == "log":
        factors = log_factors(q_pos, pretrained_length(params, config))  # [B, q]
        return (query.float() * factors[:, None, :, None]).to(query.dtype)
    raise ValueError(f"rope_parameters['attention_temperature']={mode!r}: allowed 'none', 'constant', 'log'")
