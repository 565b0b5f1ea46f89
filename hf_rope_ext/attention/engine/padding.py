"""A decode step's left padding as the fast engine's decode plans take it: each row sees the keys from its first
seen index on (``mask_formats.step_padding`` says "left": left padding, a sliding window), so the plans of a step
without a mask hold as they are, each piece also hiding the columns before that index. With the queries the newest
keys, a key's distance from the query is then its distance in the cache, as without padding.

A piece gets it as a ``piece.Rule``: flex's mask function compares the column with the row's first index (a [B, 1]
tensor: its shape is the same at every step), the CPU kernel takes the slice of the step's additive mask. Both are
formed once a step for all the layers handed the same mask (``mask_formats.per_mask``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..mask_formats import per_mask, seen_keys
from .piece import Piece


@dataclass(eq=False)
class PaddingRule:
    """Columns j >= ``first[b]`` of batch row b are seen (``piece.Rule``); ``dense`` [B or 1, 1, 1, columns] is the
    same as an additive mask (0 seen, the dtype's minimum not)."""

    first: torch.Tensor  # [B, 1] int64, relative to the piece's first column (may be negative)
    dense: torch.Tensor

    def mask_mod(self, b, h, row, column):
        return column >= self.first[b, 0]

    def additive(self) -> torch.Tensor:
        return self.dense


@dataclass(eq=False)
class Padding:
    """Row b of a step sees keys [first[b], kv) of the cache."""

    first: torch.Tensor  # [B, 1] int64
    additive: torch.Tensor  # [B or 1, 1, 1, kv] in the query dtype: 0 seen, the dtype's minimum not

    def rule(self, start: int, stop: int) -> PaddingRule:
        """The rule of a piece over the cache's keys [start, stop)."""
        return PaddingRule(self.first - start if start else self.first, self.additive[..., start:stop])


def padded_piece(padding: Padding | None, start: int, stop: int) -> Piece:
    """The piece over the cache's keys [start, stop) of a step, hiding each row's padding (None: none)."""
    return Piece() if padding is None else Piece(rule=padding.rule(start, stop))


def step_padding_of(mask: torch.Tensor, batch: int, dtype: torch.dtype) -> Padding:
    """The ``Padding`` of a decode step's mask [B or 1, 1, 1, kv] found "left" (``step_padding``), once a step."""

    def compute() -> Padding:
        seen = seen_keys(mask)  # [B or 1, kv]: a suffix of each row
        first = (seen.shape[-1] - seen.sum(-1, keepdim=True)).expand(batch, 1)
        low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
        return Padding(first, torch.where(seen, low * 0, low).view(seen.shape[0], 1, 1, -1))

    return per_mask(mask, ("padding", batch, dtype), compute)
