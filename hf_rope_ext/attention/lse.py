"""Attention pieces that return their log-sum-exp, and merging pieces by it (the fast path's kernel layer).

Kernel choice (measured on this project's 2-core AMD EPYC CPU, one thread, torch 2.13, 32 query / 8 kv heads,
head_dim 64, 4096 tokens; min of 3 interleaved runs): ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``
is the kernel ``F.scaled_dot_product_attention`` itself dispatches to on CPU, and it also returns the log-sum-exp:
causal 1.10 s (GQA kv heads read in place, no expansion) against 1.12 s for ``F.scaled_dot_product_attention``
(fp32; bf16 1.16 s vs 1.13 s). An additive float mask of the query dtype costs the same per key as no mask, so
the window band runs as query blocks over only the keys in reach with a small [block, block + window] mask.
``flex_attention`` was not taken: on CPU it needs ``torch.compile`` (a compile per shape and mask, tens of
seconds, counted in every test run), and without compiling it materializes the full score matrix.

Its log-sum-exp output carries no gradient, so with autograd :class:`FlashLse` wraps forward and backward: the
backward of (out, lse) with upstream (dO, dL) is the flash backward of an output whose value rows carry one more
column of ones (see :func:`FlashLse.backward`). Other devices (CUDA) take the reference path (not measured here).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class FlashLse(torch.autograd.Function):
    """(out [B, H, c, dv], lse [B, H, c] float32) of softmax(q k^T * scale + mask) v, differentiable in both."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal: bool, scale: float):
        out, lse = _flash(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        """d score_ij = P_ij (dO_i . v_j - dO_i . o_i + dL_i): the flash backward of q, k with a zero column,
        v with a column of ones, the output with a zero column and dO with dL appended computes exactly that."""
        q, k, v, mask, out, lse = ctx.saved_tensors
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
        return gq[..., :-1], gk[..., :-1], gv[..., :-1], None, None, None


def needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def attention_lse(q, k, v, mask, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention piece: (out [B, H, c, dv], lse [B, H, c] float32). k/v may have fewer (kv) heads (GQA)."""
    b, heads, c, _ = q.shape
    groups = heads // k.shape[1]
    if c == 1 and groups > 1 and not causal and (mask is None or mask.shape[1] == 1) and not needs_grad(q, k, v):
        # one query (decode): the query heads of a kv head become rows of one problem (1.4x faster measured)
        out, lse = _flash(q.reshape(b, k.shape[1], groups, -1), k, v, 0.0, False, attn_mask=mask, scale=scale)
        return out.reshape(b, heads, 1, -1), lse.reshape(b, heads, 1)
    if needs_grad(q, k, v):
        if k.shape[1] != q.shape[1]:  # the backward sums kv-head gradients only for equal head counts
            k, v = expand_heads(k, q.shape[1]), expand_heads(v, q.shape[1])
        return FlashLse.apply(q, k, v, mask, causal, scale)
    return _flash(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)


def expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, Hkv, L, d] -> [B, H, L, d], query head h reading kv head h // (H / Hkv) (as transformers' repeat_kv)."""
    b, kv_heads, length, d = x.shape
    if heads == kv_heads:
        return x
    return x[:, :, None].expand(b, kv_heads, heads // kv_heads, length, d).reshape(b, heads, length, d)


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
    a's output (float32 outputs only; others take the float32 path and are copied back).
    """
    (o1, l1), (o2, l2) = a, b
    w1, w2, lse = merge_weights(l1, l2)
    if o1.dtype == torch.float32:
        out = o1.mul_(w1).addcmul_(o2, w2) if inplace else torch.addcmul(o1 * w1, o2, w2)
    else:
        out = torch.addcmul(o1.float() * w1, o2.float(), w2).to(o1.dtype)
        out = o1.copy_(out) if inplace else out
    return out, lse


def causal_lse(q, k, v, first: int, scale: float):
    """Rows a = 0..c-1 of q see keys j <= first + a of k/v (which hold at least first + c keys): (out, lse).

    Two pieces without any mask: keys [0, first) seen by every row, and the square [first, first + c) with
    torch's top-left causal flag; one piece when c == 1 or first == 0.
    """
    c = q.shape[2]
    if c == 1:
        return attention_lse(q, k[:, :, : first + 1], v[:, :, : first + 1], None, False, scale)
    square = attention_lse(q, k[:, :, first : first + c], v[:, :, first : first + c], None, True, scale)
    if first == 0:
        return square
    full = attention_lse(q, k[:, :, :first], v[:, :, :first], None, False, scale)
    return merge(full, square, inplace=not needs_grad(q, k, v))
