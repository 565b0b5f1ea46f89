"""A decode step's pieces merged once: the softmax over the union of several pieces' disjoint keys, each piece scoring
the same output rows with queries of its own (a two-band type's near and far bands, Dual Chunk Attention's three
bands, a one-band type's keys alone), from the pieces' log-sum-exps.

On a CPU the pieces of a step are decode pieces of the CPU kernel (queries grouped by kv head as rows, no autograd,
no causal flag or window), and a piece whose keys ``split_keys`` splits hands on its parts unmerged: every part of
every piece is merged in one softmax over their lse, where a merge per piece and one between pieces took a dozen
operations each. Where no piece is split, and on other devices (each piece as ``kernels.attend_piece`` runs it),
whole pieces merge as before (``merge_two`` for two: the operations a CUDA step launches are unchanged).
"""

from __future__ import annotations

import torch

from . import split_keys
from .kernels import KERNELS, RAN, _flash, attend_piece, cpu_flash
from .piece import Piece, needs_grad

Parts = tuple[torch.Tensor, torch.Tensor]  # (out [P, B, H, c, dv], lse [P, B, H, c] float32): P parts, unmerged


def cpu_decode_piece(q, k, v, piece: Piece) -> bool:
    """Whether (q, k, v, piece) is a decode piece ``cpu_parts`` takes: on a device whose kernel is the CPU one, q
    [B, Hkv, c, d] grouped by kv head (as many heads as k), no autograd, no causal flag or window (the piece's mask,
    if any, a rule's or padding's)."""
    c, kv = q.shape[2], k.shape[2]
    plain = not piece.top_left_causal() and (piece.dense_mask() is not None or not piece.cuts(c, kv))
    cpu = KERNELS.get(q.device.type) is cpu_flash
    return cpu and q.shape[1] == k.shape[1] and plain and not needs_grad(q, k, v)


def cpu_parts(q, k, v, piece: Piece, scale: float) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One CPU decode piece (``cpu_decode_piece``): (out, lse, split) with its keys split (``split_keys.parts``) its
    parts unmerged (``Parts``, split True), else its own (out [B, H, c, dv], lse [B, H, c], False)."""
    RAN["cpu_flash"] += 1
    mask, count = piece.dense_mask(), split_keys.parts(q, k, False)
    if count == 1:
        return *_flash(q, k, v, 0.0, False, attn_mask=mask, scale=scale)[:2], False
    RAN["cpu_flash_split"] += 1
    out, lse = split_keys.split_parts(_flash, q, k, v, mask, scale, count)  # a batch row's parts: [P, H, c, *]
    return out[:, None], lse[:, None], True


def merge_two(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The softmax over both pieces' keys, neither empty: a's weight is sigmoid(l_a - l_b); [B, H, c, dv]. The
    weight in the outputs' dtype: lerp forms o_b + w (o_a - o_b) in float32 whatever its operands' dtype, so half
    precision loses only the weight's rounding (at most its last bit), as the outputs already lost theirs."""
    (o1, l1), (o2, l2) = a, b
    weight = torch.sigmoid(l1 - l2)[..., None]  # [B, H, c, 1] float32
    return torch.lerp(o2, o1, weight.to(o1.dtype))


def merged(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """out [P, B, H, c, dv] of P disjoint key sets weighted by softmax over their lse [P, B, H, c]: [B, H, c, dv] in
    out's dtype (the weights and the sum in float32)."""
    weights = torch.softmax(lse, dim=0)[..., None]  # [P, B, H, c, 1] float32
    return (out * weights).sum(0).to(out.dtype)


def attend_union(pieces: list[tuple], scale: float) -> torch.Tensor:
    """out [B, H, c, dv] over the union of ``pieces`` (q, k, v, piece), each with a key at least (module docstring)."""
    if not all(cpu_decode_piece(*p) for p in pieces):
        return union_of([attend_piece(*p, scale) for p in pieces])
    found = [cpu_parts(*p, scale) for p in pieces]
    if not any(split for *_, split in found):
        return union_of([(out, lse) for out, lse, _ in found])
    outs, lses = zip(*((o, s) if split else (o[None], s[None]) for o, s, split in found), strict=True)
    return merged(torch.cat(outs), torch.cat(lses))  # every part of every piece at once


def union_of(found: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The merge of whole pieces' (out [B, H, c, dv], lse [B, H, c]): one piece's out, two by ``merge_two``, more by
    ``merged``."""
    if len(found) == 1:
        return found[0][0]
    if len(found) == 2:
        return merge_two(*found)
    return merged(torch.stack([out for out, _ in found]), torch.stack([lse for _, lse in found]))
