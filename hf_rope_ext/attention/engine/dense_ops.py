"""torch's fused attention ops that return the log-sum-exp, for the pieces they can take (the CUDA kernel's first
choice, ``kernels.cuda_kernel``; compiled flex takes the rest).

A piece they take: no autograd (their lse has no gradient), no mask or rule, and either every key seen (a rectangle:
a far band's keys beyond the diagonal, a decode step's band) or a square seen causally from its top left (a band's
diagonal square). Those are the pieces that hold most of a long prefill's work: the far band of ReRoPE, leaky
ReRoPE, Self-Extend and STRING without a cache is one causal square. The op is the one torch's own
``scaled_dot_product_attention`` picks for the same shapes (``torch._fused_sdp_choice``: cuDNN on Hopper, flash or
memory-efficient attention elsewhere; grouped-query heads read in place, as sdpa passes them), called directly so
that it returns the lse. A choice with no such op (math) leaves the piece to flex.

Each op's output and lse are checked once per (op, causal flag, device, dtype, head counts and dims) against the
scores written out on a corner of the piece itself (``checked``): an op that disagrees or fails is not used for them,
with a warning, rather than merged wrongly.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend

from .piece import Piece, needs_grad
from .reference import grouped_product

aten = torch.ops.aten


def cudnn(q, k, v, causal: bool, scale: float):
    out, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
    return out, lse.reshape(q.shape[:3])  # lse [B, H, c, 1]


def flash(q, k, v, causal: bool, scale: float):
    return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]


def efficient(q, k, v, causal: bool, scale: float):
    out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)[:2]
    return out, lse[..., : q.shape[2]]  # lse [B, H, c rounded up to a multiple of 32]


Op = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (q, k, v, causal, scale) -> (out, lse [B, H, c] float32)
OPS: dict[SDPBackend, Op] = {
    SDPBackend.CUDNN_ATTENTION: cudnn,
    SDPBackend.FLASH_ATTENTION: flash,
    SDPBackend.EFFICIENT_ATTENTION: efficient,
}


def choice(q, k, v, causal: bool, scale: float) -> SDPBackend:
    """The backend torch's sdpa would run for these tensors (no mask, no dropout)."""
    gqa = q.shape[1] != k.shape[1]
    return SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=scale, enable_gqa=gqa))


def causal_flag(piece: Piece, rows: int, columns: int) -> bool | None:
    """Whether the op runs the piece causally (False: every key seen), or None where it cannot take it."""
    if piece.mask is not None or piece.rule is not None or rows == 0 or columns == 0:
        return None
    if not piece.cuts(rows, columns):
        return False
    return True if rows == columns and piece.top_left_causal() else None


def written_out(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in float32 from the scores written out: q [B, H, c, d], k / v [B, Hkv, kv, *]."""
    scores = grouped_product(q.float(), k.float().transpose(-1, -2)) * scale  # [B, H, c, kv]
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return grouped_product(torch.softmax(scores, -1), v.float()), scores.logsumexp(-1)


CHECK_ROWS, CHECK_COLUMNS = 8, 512  # the corner of a piece the check computes (a square: CHECK_ROWS of each)
CHECKED: dict[tuple, bool] = {}  # (backend, causal, device, dtype, head counts and dims) -> whether its op is used


def checked(backend: SDPBackend, q, k, v, causal: bool, scale: float) -> bool:
    """Whether ``backend``'s op gives the output and lse of the scores written out on the piece's first rows (once
    per op, causal flag, device, dtype, head counts and dims; a warning where it does not)."""
    key = (backend, causal, q.device, q.dtype, q.shape[1], k.shape[1], q.shape[-1], v.shape[-1])
    if key not in CHECKED:
        rows = min(CHECK_ROWS, q.shape[2])
        columns = rows if causal else min(CHECK_COLUMNS, k.shape[2])
        args = q[:1, :, :rows], k[:1, :, :columns], v[:1, :, :columns]
        CHECKED[key] = agrees(OPS[backend], args, causal, scale)
        if not CHECKED[key]:
            warnings.warn(
                f"hf_rope_ext: torch's {backend.name} op on {q.device} {q.dtype} does not give the softmax's output "
                "and log-sum-exp written out; its pieces go to flex_attention",
                stacklevel=3,
            )
    return CHECKED[key]


def agrees(op: Op, args: tuple, causal: bool, scale: float) -> bool:
    """Whether ``op`` on (q, k, v) ``args`` gives the output and lse of the scores written out (an error: no)."""
    q = args[0]
    try:
        out, lse = op(*args, causal, scale)
    except RuntimeError:
        return False
    want_out, want_lse = written_out(*args, causal, scale)
    tolerance = 1e-2 if q.dtype in (torch.float16, torch.bfloat16) else 1e-4
    if lse.shape != want_lse.shape or out.shape != want_out.shape:
        return False
    good = (lse.float() - want_lse).abs().max() <= tolerance * (1 + want_lse.abs().max())
    return bool(good & ((out.float() - want_out).abs().max() <= 4 * tolerance * (1 + want_out.abs().max())))


def attend(q, k, v, piece: Piece, scale: float, ran: Counter | None = None):
    """(out, lse) of the piece by torch's fused op, or None where none takes it; ``ran`` counts the op's name."""
    causal = causal_flag(piece, q.shape[2], k.shape[2])
    if causal is None or needs_grad(q, k, v):
        return None
    backend = choice(q, k, v, causal, scale)
    if backend not in OPS or not checked(backend, q, k, v, causal, scale):
        return None
    if ran is not None:
        ran[backend.name.lower()] += 1
    return OPS[backend](q, k, v, causal, scale)
