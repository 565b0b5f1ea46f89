"""CPU twins of the CUDA path's kernel (``kernels.KERNELS["cuda"]``: compiled flex_attention over the block mask
``engine.flex`` builds for a piece), written here independently of the package. A twin takes the kernel's
arguments (q [B, H, c, d], k / v [B, Hkv, kv, *], a ``Piece``, the scale) and returns (out [B, H, c, dv], lse
[B, H, c] float32), a row that sees no key giving out 0 and lse -inf:
- ``dense_kernel``: the piece's key range and mask applied to every (row, column);
- ``fused_kernel(backend)``: the CUDA kernel's own code (``kernels.fused_first``) with torch's fused op of
  ``backend`` as sdpa's choice, the op a twin of its meaning in its own output form (``FUSED_ATEN``: cuDNN's lse
  [B, H, c, 1], memory-efficient attention's padded to a multiple of 32 rows, flash's [B, H, c]; each refuses a
  causal piece that is not square, as the real ones do), and ``block_list_kernel`` for the pieces it leaves;
- ``block_list_kernel``: compiled flex_attention's meaning. It reads the block mask the CUDA kernel builds
  (``flex.kernel_block_mask``) as the compiled kernel does: it visits only the blocks listed for each query block,
  calls ``mask_mod`` inside the partly listed ones only, takes fully listed ones whole and never looks at an
  unlisted block, so a wrong block list changes its output (uncompiled flex_attention calls ``mask_mod`` on every
  pair and ignores the lists).
Both are differentiable (float32 scores with autograd).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from unittest import mock

import torch
from torch.nn.attention import SDPBackend

from hf_rope_ext.attention.engine import dense_ops, flex, kernels
from hf_rope_ext.attention.engine.piece import Piece


def attend_allowed(q, k, v, allowed: torch.Tensor, scale: float):
    """(out, lse) of softmax over the keys ``allowed`` [B or 1, 1, c, kv] lets each row see; a row that sees none
    gives out 0 and lse -inf. Computed in float32 with autograd; out in q's dtype."""
    groups = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(groups, 1).float(), v.repeat_interleave(groups, 1).float()
    scores = (q.float() @ keys.transpose(-1, -2) * scale).masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(scores, -1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return (weights @ values).to(q.dtype), lse


def dense_kernel(q, k, v, piece: Piece, scale: float):
    """The kernel's meaning, written out: the piece's key range and mask over every (row, column)."""
    c, kv = q.shape[2], k.shape[2]
    rows = torch.arange(piece.row0, piece.row0 + c)[:, None] - torch.arange(piece.column0, piece.column0 + kv)
    allowed = (rows >= piece.low) & (rows < piece.high)
    mask = piece.dense_mask()
    if mask is not None:
        allowed = allowed & (mask > torch.finfo(mask.dtype).min / 2)
    return attend_allowed(q, k, v, allowed, scale)


def listed_blocks(block_mask) -> torch.Tensor:
    """[B, 1, rows, columns] bool: the pairs compiled flex attends under ``block_mask``, read block by block from
    its lists as the kernel reads them (fully listed: every pair inside the sequence lengths; partly listed:
    ``mask_mod`` of the block's pairs; unlisted: none). A block listed twice would be attended twice: refused."""
    rows, columns = block_mask.seq_lengths
    q_block, kv_block = block_mask.BLOCK_SIZE
    batch = block_mask.kv_num_blocks.shape[0]
    allowed = torch.zeros(batch, 1, rows, columns, dtype=torch.bool)
    visits = torch.zeros(batch, block_mask.kv_num_blocks.shape[-1], -(-columns // kv_block), dtype=torch.int64)
    lists = ((block_mask.kv_num_blocks, block_mask.kv_indices, True),)
    if block_mask.full_kv_num_blocks is not None:
        lists += ((block_mask.full_kv_num_blocks, block_mask.full_kv_indices, False),)
    for counts, indices, partly in lists:
        for b in range(batch):
            for i in range(counts.shape[-1]):
                for j in indices[b, 0, i, : int(counts[b, 0, i])].tolist():
                    visits[b, i, j] += 1
                    a = torch.arange(i * q_block, min((i + 1) * q_block, rows))[:, None]
                    n = torch.arange(j * kv_block, min((j + 1) * kv_block, columns))[None, :]
                    seen = block_mask.mask_mod(torch.tensor(b), torch.tensor(0), a, n) if partly else True
                    allowed[b, 0, a, n] = seen
    assert int(visits.max()) <= 1, "a key block listed twice for one query block"
    return allowed


def block_list_kernel(q, k, v, piece: Piece, scale: float):
    """Compiled flex_attention's meaning over the CUDA kernel's own block mask."""
    block_mask = flex.kernel_block_mask(q, k, v, piece)
    return attend_allowed(q, k, v, listed_blocks(block_mask), scale)


def fused_meaning(q, k, v, causal: bool, scale: float):
    """(out, lse [B, H, c]) of a fused op: every key seen, or a square seen causally from its top left."""
    c, kv = q.shape[2], k.shape[2]
    if causal and c != kv:
        raise RuntimeError("a fused op's causal flag on a piece that is not square")
    allowed = torch.ones(c, kv, dtype=torch.bool)
    with torch.no_grad():
        return attend_allowed(q, k, v, allowed.tril() if causal else allowed, scale)


def cudnn_twin(q, k, v, bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask, *, scale):
    assert bias is None and compute_log_sumexp and dropout_p == 0.0
    out, lse = fused_meaning(q, k, v, is_causal, scale)
    return out, lse[..., None], None, None, q.shape[2], k.shape[2], None, None, None


def flash_twin(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale):
    assert dropout_p == 0.0
    out, lse = fused_meaning(q, k, v, is_causal, scale)
    return out, lse, None, None, q.shape[2], k.shape[2], None, None, None


def efficient_twin(q, k, v, bias, compute_log_sumexp, dropout_p, is_causal, *, scale):
    assert bias is None and compute_log_sumexp and dropout_p == 0.0
    out, lse = fused_meaning(q, k, v, is_causal, scale)
    padded = torch.full((*lse.shape[:2], -(-lse.shape[2] // 32) * 32), math.inf)  # rows past c: not the lse
    padded[..., : lse.shape[2]] = lse
    return out, padded, None, None


FUSED_ATEN = SimpleNamespace(
    _scaled_dot_product_cudnn_attention=cudnn_twin,
    _scaled_dot_product_flash_attention=flash_twin,
    _scaled_dot_product_efficient_attention=efficient_twin,
)


def fused_kernel(backend: SDPBackend, aten=FUSED_ATEN):
    """The CUDA kernel's code with ``backend`` as torch's choice and the ops' twins (``aten``), the block-list twin
    of compiled flex for the pieces no fused op takes."""
    kernel = kernels.fused_first(block_list_kernel, "flex")

    def run(q, k, v, piece: Piece, scale: float):
        with mock.patch.object(dense_ops, "aten", aten), mock.patch.object(dense_ops, "choice", lambda *a: backend):
            return kernel(q, k, v, piece, scale)

    return run
