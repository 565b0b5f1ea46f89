"""What one attention piece computes (:class:`Piece`), and helpers every kernel shares."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch


class Rule(Protocol):
    """Which columns each row of a piece sees, as a function of indices on the device (Dual Chunk Attention's bands
    while decoding: ``chunk_decode``), in the two forms the kernels take."""

    def mask_mod(self, b: torch.Tensor, h: torch.Tensor, row: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
        """flex_attention's form: whether row ``row`` of batch row ``b`` sees column ``column`` (bool)."""

    def additive(self) -> torch.Tensor:
        """The dense form: [B, 1, c, kv] in the query dtype, 0 where seen, its minimum where not."""


@dataclass(frozen=True)
class Piece:
    """Which keys each query row of one call sees. Row a (0..c-1) stands at index ``row0 + a`` of the key
    sequence, column j at ``column0 + j``: the row sees the column when low <= (row0 + a) - (column0 + j) < high
    and, if given, the additive ``mask`` [B, 1, c, kv] (0 allowed, a large negative number not) or the ``rule``
    lets it through."""

    row0: int = 0
    column0: int = 0
    low: float = -math.inf
    high: float = math.inf
    mask: torch.Tensor | None = None
    rule: Rule | None = None

    def dense_mask(self) -> torch.Tensor | None:
        """The additive mask [B, 1, c, kv] of ``mask`` or ``rule`` (None: neither)."""
        return self.rule.additive() if self.rule is not None else self.mask

    def distances(self, rows: int, columns: int) -> tuple[int, int]:
        """(smallest, largest) row index - column index over the piece."""
        return self.row0 - (self.column0 + columns - 1), self.row0 + rows - 1 - self.column0

    def cuts(self, rows: int, columns: int) -> bool:
        """Whether the key range hides some (row, column) of a rows x columns piece."""
        smallest, largest = self.distances(rows, columns)
        return smallest < self.low or largest >= self.high

    def top_left_causal(self) -> bool:
        """Row a sees columns j <= a: torch's ``is_causal`` on a square aligned at its top left."""
        plain = self.mask is None and self.rule is None
        return self.row0 == self.column0 and self.low == 0 and self.high == math.inf and plain

    def allowed(self, rows: int, columns: int, device) -> torch.Tensor:
        """[rows, columns] bool of the key range (the mask aside)."""
        d = torch.arange(self.row0, self.row0 + rows, device=device)[:, None]
        d = d - torch.arange(self.column0, self.column0 + columns, device=device)[None, :]
        return (d >= self.low) & (d < self.high)


def needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, Hkv, L, d] -> [B, H, L, d], query head h reading kv head h // (H / Hkv) (as transformers' repeat_kv)."""
    b, kv_heads, length, d = x.shape
    if heads == kv_heads:
        return x
    return x[:, :, None].expand(b, kv_heads, heads // kv_heads, length, d).reshape(b, heads, length, d)
