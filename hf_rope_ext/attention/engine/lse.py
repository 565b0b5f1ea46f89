"""Merging attention pieces by their log-sum-exps, and assembling a call's output from row blocks.

Two pieces over disjoint key sets, each (out, lse) of its own softmax, give the softmax over the union:
out = e^(l1 - l) o1 + e^(l2 - l) o2 with l = logaddexp(l1, l2) (``merge``). ``causal_lse`` plans causal
attention of a query block as two such pieces without any mask.
"""

from __future__ import annotations

import torch

from .kernels import attend_piece
from .piece import Piece, needs_grad


def merge_weights(l1: torch.Tensor, l2: torch.Tensor):
    """Normalized weights [B, H, c, 1] of two pieces and the union's lse, all float32 (see ``merge``)."""
    top = torch.maximum(l1, l2)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    w1, w2 = torch.exp(l1 - top), torch.exp(l2 - top)  # [B, H, c]; 0 where a set is empty
    total = w1 + w2
    norm = total.clamp(min=torch.finfo(torch.float32).tiny)
    return (w1 / norm)[..., None], (w2 / norm)[..., None], top + torch.log(total)


def merge(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], inplace: bool = False):
    """Softmax over the union of two disjoint key sets from each one's (out, lse): (out, lse) of the union.

    A row empty in one set (lse -inf, its output finite: the kernel writes 0) takes the other's output; a row
    empty in both gives 0. Weights in float32; the output in a's dtype. ``inplace`` (no autograd): written into
    a's output (half-precision outputs computed in float32 a slice of rows at a time: ``merge_into``).
    """
    (o1, l1), (o2, l2) = a, b
    w1, w2, lse = merge_weights(l1, l2)
    if o1.dtype == torch.float32:
        out = o1.mul_(w1).addcmul_(o2, w2) if inplace else torch.addcmul(o1 * w1, o2, w2)
    elif inplace:
        out = merge_into(o1, o2, w1, w2)
    else:
        out = torch.addcmul(o1.float() * w1, o2.float(), w2).to(o1.dtype)
    return out, lse


MERGE_ELEMENTS = 2**24  # float32 elements of one slice of an in-place merge of half-precision outputs (64 MiB)


def merge_into(o1, o2, w1, w2) -> torch.Tensor:
    """o1 [B, H, c, dv] (half precision) overwritten by w1 o1 + w2 o2, computed in float32 a slice of rows at a time.

    A whole band is one piece on CUDA, so c can be the whole prompt: three float32 copies of the output (3 GiB at 64k
    tokens, 32 heads, head_dim 128) were the merge's peak, four times plain attention's on an H200.
    """
    rows = max(1, MERGE_ELEMENTS // max(1, o1.numel() // max(1, o1.shape[2])))
    for r0 in range(0, o1.shape[2], rows):
        part = slice(r0, r0 + rows)
        o1[:, :, part] = torch.addcmul(o1[:, :, part].float() * w1[:, :, part], o2[:, :, part].float(), w2[:, :, part])
    return o1


def causal_lse(q, k, v, first: int, scale: float):
    """Rows a = 0..c-1 of q see keys j <= first + a of k/v (which hold at least first + c keys): (out, lse).

    Two pieces without any mask: keys [0, first) seen by every row, and the square [first, first + c) seen
    causally from its top left; one piece when c == 1 or first == 0.
    """
    c = q.shape[2]
    if c == 1:
        return attend_piece(q, k[:, :, : first + 1], v[:, :, : first + 1], Piece(), scale)
    square = attend_piece(q, k[:, :, first : first + c], v[:, :, first : first + c], Piece(low=0), scale)
    if first == 0:
        return square
    full = attend_piece(q, k[:, :, :first], v[:, :, :first], Piece(), scale)
    return merge(full, square, inplace=not needs_grad(q, k, v))


class Rows:
    """The result [B, H, q, dv] assembled from row blocks. Without autograd the blocks are written into one
    buffer laid out [B, q, H, dv], so the caller's ``transpose(1, 2).contiguous()`` copies nothing; with it
    they are concatenated (autograd cannot see through writes into a buffer)."""

    def __init__(self, query: torch.Tensor, value_dim: int, grad: bool):
        b, h, q_len, _ = query.shape
        shape, self.pieces = (b, q_len, h, value_dim), []
        self.buffer = None if grad else query.new_empty(shape).transpose(1, 2)

    def put(self, rows: slice, x: torch.Tensor) -> None:
        """Rows must come in order, each block once (or, for the buffer, overwrite earlier rows in place)."""
        if self.buffer is not None:
            self.buffer[:, :, rows] = x
        else:
            self.pieces.append(x)

    def result(self) -> torch.Tensor:
        return self.buffer if self.buffer is not None else torch.cat(self.pieces, dim=2)
