"""A banded plan's pieces under autograd as one function, flash-style: the forward keeps q, k, v as given (unrotated),
the output and the log-sum-exp of every row, nothing else; the backward rotates again what it needs.

A plan is a list of :class:`Span`: query rows of one :class:`Band` (its query and key rotations) against a range of
keys, seen as a :class:`Piece` allows. The forward runs each span as a piece of the CPU kernel without autograd and
merges it into the rows' output by the lse (``lse.merge``, in place). The backward of softmax attention over a union
of disjoint key sets splits by set: with the union's output O and lse L, each piece's gradients are what the kernel's
own backward gives for that piece when handed O and L in place of its own (P = exp(S - L) is the piece's share of
the union's softmax, and dS = P (dP - rowsum(dO * O)) needs only O). So each span's flash backward, on the rotated
queries and keys, is summed into per-band gradients of the rotated tensors, and those go back through the rotations by
autograd once per band.

Autograd through the pieces saves each piece's rotated queries, output, mask and lse, and the merges' weights and
outputs: Self-Extend's LoRA step then held far more than plain attention's (docs/results/lora-memory.md). The CPU
kernel only (``applies``): on CUDA the pieces' kernels keep their own autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import kernels
from .lse import merge
from .piece import Piece, expand_heads

QueryTurn = Callable[[torch.Tensor, slice], torch.Tensor]  # (query [B, H, q, d], rows) -> the rows turned
KeyTurn = Callable[[torch.Tensor], torch.Tensor]  # key [B, Hkv, kv, d] -> keys [first, kv) turned


@dataclass(frozen=True)
class Band:
    """How one band turns queries and keys; ``first``: the index of the first key ``keys`` returns. Bands whose
    ``keys`` is the same function share one rotated copy (and its gradient)."""

    queries: QueryTurn
    keys: KeyTurn
    first: int = 0


@dataclass(frozen=True)
class Span:
    """Query rows ``rows`` of band ``band`` against keys [lo, hi) (indices into the call's keys), as ``piece``."""

    band: int
    rows: slice
    lo: int
    hi: int
    piece: Piece


def applies(device: torch.device) -> bool:
    """Whether the device's kernel is the CPU flash kernel, whose backward op the spans run."""
    return kernels.KERNELS.get(device.type) is kernels.cpu_flash


def causal_spans(band: int, rows: slice, first: int, base: int = 0) -> list[Span]:
    """``lse.causal_lse`` as spans: rows a = 0..c-1 see keys base + j, j <= first + a (keys [base, base + first)
    whole, then a square seen causally)."""
    c = rows.stop - rows.start
    if c == 1:
        return [Span(band, rows, base, base + first + 1, Piece())]
    square = Span(band, rows, base + first, base + first + c, Piece(low=0))
    return [Span(band, rows, base, base + first, Piece()), square] if first > 0 else [square]


def banded(query, key, value, bands: list[Band], spans: list[Span], scale: float) -> torch.Tensor:
    """The output [B, H, q, dv] of the spans merged, differentiable in query, key and value."""
    return BandedAttention.apply(query, key, value, bands, spans, scale)


class _Turned:
    """Each band's rotated keys, computed once per key function, and the last span's rotated queries."""

    def __init__(self, bands: list[Band], query, key):
        self.bands, self.query, self.key, self.keys, self.last = bands, query, key, {}, None

    def span(self, span: Span):
        band = self.bands[span.band]
        if id(band.keys) not in self.keys:
            self.keys[id(band.keys)] = band.keys(self.key)
        if self.last is None or self.last[0] != (span.band, span.rows.start, span.rows.stop):
            self.last = ((span.band, span.rows.start, span.rows.stop), band.queries(self.query, span.rows))
        k = self.keys[id(band.keys)][:, :, span.lo - band.first : span.hi - band.first]
        return self.last[1], k


def piece_arguments(q, k, piece: Piece):
    """(causal, additive mask or None) of a piece, as ``kernels.cpu_flash`` passes them to the kernel."""
    c, kv = q.shape[2], k.shape[2]
    causal, mask = piece.top_left_causal(), piece.dense_mask()
    if mask is None and not causal and piece.cuts(c, kv):
        allowed = piece.allowed(c, kv, q.device)
        mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf"))
    return causal, mask


class BandedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, bands, spans, scale: float):
        b, h, q_len, _ = query.shape
        out = query.new_zeros(b, h, q_len, value.shape[-1])
        lse = torch.full((b, h, q_len), float("-inf"), dtype=torch.float32, device=query.device)
        turned = _Turned(bands, query, key)
        for span in spans:
            q, k = turned.span(span)
            piece = kernels.cpu_flash(q, k, value[:, :, span.lo : span.hi], span.piece, scale)
            rows = (slice(None), slice(None), span.rows)
            lse[rows] = merge((out[rows], lse[rows]), piece, inplace=True)[1]  # out's rows written in place
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.bands, ctx.spans, ctx.scale = bands, spans, scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        query, key, value, out, lse = ctx.saved_tensors
        bands, heads = ctx.bands, query.shape[1]
        turned = _Turned(bands, query, key)
        d_q = {}  # band -> gradient of its turned queries [B, H, q, d]
        d_k = {}  # id(keys function) -> gradient of the turned keys [B, Hkv, kv - first, d]
        d_v = torch.zeros_like(value)
        for span in ctx.spans:
            q, k = turned.span(span)
            v = value[:, :, span.lo : span.hi]
            causal, mask = piece_arguments(q, k, span.piece)
            rows = (slice(None), slice(None), span.rows)
            gq, gk, gv = kernels._flash_backward(
                d_out[rows].contiguous(),
                q.contiguous(),
                expand_heads(k, heads).contiguous(),
                expand_heads(v, heads).contiguous(),
                out[rows].contiguous(),
                lse[rows].contiguous(),
                0.0,
                causal,
                attn_mask=mask,
                scale=ctx.scale,
            )
            band = bands[span.band]
            if span.band not in d_q:
                d_q[span.band] = torch.zeros_like(query)
            d_q[span.band][rows] += gq
            if id(band.keys) not in d_k:
                d_k[id(band.keys)] = torch.zeros_like(turned.keys[id(band.keys)])
            d_k[id(band.keys)][:, :, span.lo - band.first : span.hi - band.first] += kernels.sum_heads(gk, key.shape[1])
            d_v[:, :, span.lo : span.hi] += kernels.sum_heads(gv, key.shape[1])
        del turned
        return (*through_turns(query, key, bands, d_q, d_k), d_v, None, None, None)


def through_turns(query, key, bands: list[Band], d_q: dict, d_k: dict):
    """(d query, d key): the turned tensors' gradients taken back through each band's rotations by autograd."""
    with torch.enable_grad():
        q, k = query.detach().requires_grad_(), key.detach().requires_grad_()
        outputs, grads, direct, done = [], [], [], set()
        for index, band in enumerate(bands):
            if index in d_q:
                outputs.append(band.queries(q, slice(0, query.shape[2])))
                grads.append(d_q[index])
            if id(band.keys) in d_k and id(band.keys) not in done:
                done.add(id(band.keys))
                turned = band.keys(k)
                full = _full_keys(d_k[id(band.keys)], band.first, key.shape[2])
                if turned is k or turned.grad_fn is None:  # keys as given (ReRoPE's far band): no rotation
                    direct.append(full)
                else:
                    outputs.append(turned)
                    grads.append(d_k[id(band.keys)])
        found = torch.autograd.grad(outputs, (q, k), grads, allow_unused=True) if outputs else (None, None)
    d_query = found[0] if found[0] is not None else torch.zeros_like(query)
    d_key = found[1] if found[1] is not None else torch.zeros_like(key)
    for extra in direct:
        d_key = d_key + extra
    return d_query, d_key


def _full_keys(grad: torch.Tensor, first: int, kv: int) -> torch.Tensor:
    """The gradient of keys [first, kv) as one of all kv keys (zeros before ``first``)."""
    if first == 0:
        return grad
    return torch.cat((grad.new_zeros(*grad.shape[:2], first, grad.shape[-1]), grad), dim=2)
