"""Attention pieces that return their log-sum-exp: one kernel per device, behind one table (``KERNELS``).

A piece is one call: queries q [B, H, c, d] against keys k / values v [B, Hkv, kv, *] (kv heads read in place,
GQA), seeing the keys a :class:`Piece` allows; it returns (out [B, H, c, dv], lse [B, H, c] float32), a row that
sees no key giving out 0 and lse -inf. The engine plans pieces and merges them by their lse (``lse.merge``); only
the kernel call below differs between devices, and the planning never needs a dense [q, kv] score or mask.

- CPU: ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``, the kernel ``F.scaled_dot_product_attention``
  itself runs on CPU, which also returns the lse, as fast as sdpa (docs/attention-methods.md gives the figures).
  An additive float mask of the query dtype costs what no mask costs, so a window piece takes a small [c, kv]
  mask. Its lse has no gradient: with autograd, :class:`FlashLse` supplies it (see its backward). A decode piece
  (one batch row, a few query rows, no autograd) has its keys split into parts laid as the batch of one call
  (``split_keys``: the kernel shares work among threads by batch row and head, and a step has few kv heads).
- CUDA: first torch's fused op that sdpa itself would run (cuDNN on Hopper, flash or memory-efficient attention
  elsewhere), called so that it returns the lse, for the pieces it takes (``dense_ops``: no autograd, no mask,
  every key seen or a square seen causally: a two-band type's far band, a decode step's bands); every other piece
  ``torch.nn.attention.flex_attention`` (compiled), with the piece's key range as a block mask built from block
  indices (``flex.piece_block_mask``: no [c, kv] mask either) and ``return_aux=AuxRequest(lse=True)``: the one
  kernel that takes every mask the bands need (window, shifted causal, a given padding mask, a rule) and returns
  the lse with gradients. Both are checked without a GPU: the choice and the ops' output forms through CPU twins,
  flex uncompiled on CPU for small shapes; ``benchmarks/gpu.sh`` checks and measures them on a GPU.
Devices not in the table (MPS) take the reference path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.nn import functional as F

from . import dense_ops, split_keys
from .flex import compiled_flex_kernel
from .piece import Piece, expand_heads, needs_grad

Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (q, k, v, piece, scale) -> (out, lse)
RAN: Counter[str] = Counter()  # pieces run per kernel name since the process started (benchmarks name them)

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class FlashLse(torch.autograd.Function):
    """(out [B, H, c, dv], lse [B, H, c] float32) of softmax(q k^T * scale + mask) v, differentiable in both.

    k and v may hold fewer heads (GQA, Hkv dividing H): they are saved as given, usually views of the call's whole
    keys and values (no storage of their own), and expanded to H heads only for the kernel calls, forward and
    backward, whose kv-head gradients are summed over each kv head's query heads. Saving the expanded copies kept
    one [B, H, kv, d] pair per piece alive until the backward: at 16k tokens, 16 query and 8 kv heads, 1.6 GiB per
    layer for Self-Extend's pieces, twice what plain attention keeps."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal: bool, scale: float):
        heads = q.shape[1]
        out, lse = _flash(q, expand_heads(k, heads), expand_heads(v, heads), 0.0, causal, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        """d score_ij = P_ij (dO_i . v_j - dO_i . o_i + dL_i): the flash backward of q, k with a zero column,
        v with a column of ones, the output with a zero column and dO with dL appended computes exactly that."""
        q, k, v, mask, out, lse = ctx.saved_tensors
        kv_heads = k.shape[1]
        k, v = expand_heads(k, q.shape[1]), expand_heads(v, q.shape[1])
        d_out = torch.zeros_like(out) if d_out is None else d_out
        d_lse = torch.zeros_like(lse) if d_lse is None else d_lse
        pad = [0, 1]
        ones = torch.ones(*v.shape[:-1], 1, dtype=v.dtype, device=v.device)
        gq, gk, gv = _flash_backward(
            torch.cat((d_out, d_lse[..., None].to(d_out.dtype)), -1).contiguous(),
            F.pad(q, pad),
            F.pad(k, pad),
            torch.cat((v, ones), -1),
            F.pad(out, pad),
            lse,
            0.0,
            ctx.causal,
            attn_mask=mask,
            scale=ctx.scale,
        )
        return gq[..., :-1], sum_heads(gk[..., :-1], kv_heads), sum_heads(gv[..., :-1], kv_heads), None, None, None


def sum_heads(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, H, L, d] gradients of expanded kv heads -> [B, Hkv, L, d]: each kv head's query heads summed (the
    transpose of ``expand_heads``)."""
    b, heads, length, d = grad.shape
    if heads == kv_heads:
        return grad
    return grad.reshape(b, kv_heads, heads // kv_heads, length, d).sum(2)


def cpu_flash(q, k, v, piece: Piece, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU kernel: the piece's key range as torch's causal flag, a small additive mask, or nothing."""
    c, kv = q.shape[2], k.shape[2]
    RAN["cpu_flash"] += 1
    causal, mask = piece.top_left_causal(), piece.dense_mask()
    windowed = mask is None and not causal and piece.cuts(c, kv)
    if windowed:  # hidden by -inf: a row hidden from a whole part would take lse 0 from the kernel, so never split
        allowed = piece.allowed(c, kv, q.device)
        mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf"))
    groups = q.shape[1] // k.shape[1]
    if c == 1 and groups > 1 and (mask is None or mask.shape[1] == 1) and not needs_grad(q, k, v):
        # one query (decode): the query heads of a kv head become rows of one problem, faster than one-row problems
        b = q.shape[0]
        out, lse = flash_no_grad(q.reshape(b, k.shape[1], groups, -1), k, v, mask, False, scale, not windowed)
        return out.reshape(b, q.shape[1], 1, -1), lse.reshape(b, q.shape[1], 1)
    if needs_grad(q, k, v):  # kv heads expanded inside (the kernel's backward takes equal head counts only)
        return FlashLse.apply(q, k, v, mask, causal, scale)
    return flash_no_grad(q, k, v, mask, causal, scale, not windowed)


def flash_no_grad(q, k, v, mask, causal: bool, scale: float, split: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU kernel's (out, lse) without autograd; a decode piece's keys split into parts (``split_keys``) where
    ``split`` allows (its mask, if any, hides with a finite minimum: the engine's rules and padding)."""
    count = split_keys.parts(q, k, causal) if split else 1
    if count > 1:
        RAN["cpu_flash_split"] += 1
        return split_keys.split_flash(_flash, q, k, v, mask, scale, count)
    return _flash(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)


def cuda_flex(q, k, v, piece: Piece, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """flex_attention, compiled on its first call, over the piece's block mask (``flex``)."""
    return compiled_flex_kernel()(q, k, v, piece, scale)


def fused_first(general: Kernel, name: str) -> Kernel:
    """A kernel running torch's fused op where one takes the piece (``dense_ops``), ``general`` elsewhere."""

    def kernel(q, k, v, piece: Piece, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        found = dense_ops.attend(q, k, v, piece, scale, RAN)
        if found is not None:
            return found
        RAN[name] += 1
        return general(q, k, v, piece, scale)

    return kernel


cuda_kernel = fused_first(cuda_flex, "flex")  # the CUDA kernel

KERNELS: dict[str, Kernel] = {"cpu": cpu_flash, "cuda": cuda_kernel}  # device type -> kernel
# device types whose kernel takes a whole band as one piece (a few past WHOLE_ROWS): compiled flex visits only the
# blocks its block mask lists, so a window over 64k queries costs what its blocks cost, while each call costs
# milliseconds of launching and block-mask building (on an H200, ReRoPE's 8k prefill in 79 pieces took 190 times
# plain sdpa's time)
WHOLE_BANDS = {"cuda"}
# On those devices a band of up to WHOLE_ROWS query rows is one piece, a longer one BAND_PARTS pieces: the calls stay
# as few at every length, and a piece's temporaries (its rotated queries, its output before the merge) a quarter of
# the band's; as one piece at 64k tokens they took the two-band types' peak to 1.64x plain sdpa's on an H200.
WHOLE_ROWS, BAND_PARTS = 8192, 4


def piece_rows(device: torch.device, rows: int, total: int) -> int:
    """Query rows per piece of a band of ``total`` rows on ``device``: ``rows`` where the kernel needs row blocks (the
    CPU kernel takes a window as a [c, kv] mask, so pieces stay small), the band in at most BAND_PARTS pieces of at
    least WHOLE_ROWS rows where it takes whole bands (``WHOLE_BANDS``)."""
    return max(WHOLE_ROWS, -(-total // BAND_PARTS)) if device.type in WHOLE_BANDS else rows


def kernel_for(device: torch.device) -> Kernel | None:
    return KERNELS.get(device.type)


def attend_piece(q, k, v, piece: Piece, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of one piece on q's device."""
    return KERNELS[q.device.type](q, k, v, piece, scale)
