"""The portable export's numerical check: transformers' own rotary module on the stock config against the package's
on the original one (identical ``inv_freq`` as built and after a long forward, same attention factor), before
anything is written."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoConfig

from .._transformers.modules import rotary_class

# inv_freq may differ by the fp32 rounding of an equivalent formula (a longrope factor cannot always reproduce an
# fp32 inv_freq exactly: 1 ulp), about the rounding of fp32 angles themselves; no more than 8 ulp is accepted.
REL_TOLERANCE = 1e-6


class NotLowerable(ValueError):
    """The rope type has no exactly equivalent stock form."""


def check_equivalent(src: Path, stock: Path) -> float:
    """Largest relative inv_freq difference (as built and after a long forward); NotLowerable above REL_TOLERANCE."""
    old, new = AutoConfig.from_pretrained(src), AutoConfig.from_pretrained(stock)
    rotary = rotary_class(old.model_type)
    a, b = rotary(config=old), rotary(config=new)
    out_a, out_b = _rotary_outputs(a, old), _rotary_outputs(b, new)
    error = max(_rel_error(x, y) for x, y in zip(out_a, out_b, strict=True)) if len(out_a) == len(out_b) else math.inf
    scale_a, scale_b = _scalings(a), _scalings(b)
    same_scale = len(scale_a) == len(scale_b) and all(
        math.isclose(x, y, rel_tol=1e-12) for x, y in zip(scale_a, scale_b, strict=True)
    )
    if error > REL_TOLERANCE or not same_scale:
        raise NotLowerable(
            f"the stock form {new.rope_parameters!r} is not equivalent to {old.rope_parameters!r}: relative "
            f"difference {error:.3g} (allowed {REL_TOLERANCE:g}), attention factors {scale_a} vs {scale_b}"
        )
    return error


def _rotary_outputs(module, config) -> list:
    """Its inv_freq buffers as built, then after a forward at twice max_position_embeddings (dynamic updates)."""
    built = [b.clone() for n, b in sorted(module.named_buffers()) if n.endswith("inv_freq")]
    positions = torch.arange(2 * config.max_position_embeddings)[None]  # [1, 2 * max_position_embeddings]
    with torch.no_grad():
        module(torch.zeros(1, dtype=torch.float32), positions)
    return built + [b for n, b in sorted(module.named_buffers()) if n.endswith("inv_freq")]


def _rel_error(x, y) -> float:
    if x.shape != y.shape:
        return float("inf")
    return ((x - y).abs() / y.abs().clamp_min(1e-30)).max().item() if x.numel() else 0.0


def _scalings(module) -> list[float]:
    scaling = module.attention_scaling
    return [float(v) for _, v in sorted(scaling.items())] if isinstance(scaling, dict) else [float(scaling)]
