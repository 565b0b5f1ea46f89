"""Converting a flat state dict (model, checkpoint shard or LoRA adapter) from one layout to the other."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..models import Family, HeadShape, check_layout
from .keys import projection_of
from .permute import block_rows, permute_rows


def check_direction(source: str, to: str, what: str) -> None:
    check_layout(to, "to")
    check_layout(source, "source layout")
    if source == to:
        raise ValueError(
            f"{what} is already in rope_layout={source!r}; converting it to {to!r} again would permute q/k twice"
        )


def convert_tensors(
    state_dict: Mapping[str, torch.Tensor], family: Family, shape: HeadShape, source: str, to: str
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A new dict with q/k rows (weights, biases, lora_B, DoRA magnitudes) moved to ``to``, and the moved keys.

    Every other tensor is passed through as the same object.
    """
    check_direction(source, to, "the state dict")
    index = {p: block_rows(p.blocks, shape, to) for p in family.projections}
    out, moved = {}, []
    for key, tensor in state_dict.items():
        projection = projection_of(key, family)
        if projection is None:
            out[key] = tensor
            continue
        out[key] = permute_rows(tensor, index[projection], key, projection.blocks, shape)
        moved.append(key)
    return out, moved
