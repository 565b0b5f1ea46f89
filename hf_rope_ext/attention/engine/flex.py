"""The CUDA kernel of ``kernels.KERNELS``: flex_attention over a block mask built from a piece's key range.

flex_attention reads only the key blocks its block mask lists for each query block, and evaluates the mask
function only inside blocks listed as partly allowed. For a piece whose key range is a band of distances
(low <= row index - column index < high: a window, causal, shifted causal) the lists come from arithmetic over
[rows / BLOCK, columns / BLOCK] blocks, so no [c, kv] mask is ever built; a piece with a given mask tensor (the
masked path: padding, packed sequences) is turned into a block mask of that tensor's own size. Row a of a piece is
flex's query index a, column j its key index j. On CUDA the kernel is ``torch.compile(flex_attention,
dynamic=True)`` (the piece offsets enter as tensors, not as constants, so pieces share compiled variants; the
variants a model still meets are kept under ``util.recompile_limit``). The tests run the same
function uncompiled on CPU, where flex_attention has a forward-only reference implementation; it applies the mask
function to every pair and ignores the block lists, so the lists are checked against the dense mask separately.
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, create_block_mask, flex_attention

from ...util.recompile_limit import with_recompile_limit
from .piece import Piece, needs_grad

BLOCK = 128  # flex_attention's block size, rows and columns
FAR = 2**40  # a distance beyond any sequence: stands for an unbounded end of a piece's range


def range_blocks(piece: Piece, rows: int, columns: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(partly, fully) [n_row_blocks, n_column_blocks] bool: blocks with some / every (row, column) in range."""
    a0 = torch.arange(0, rows, BLOCK, device=device)  # first row of each row block
    a1 = (a0 + BLOCK).clamp(max=rows) - 1  # its last row
    j0 = torch.arange(0, columns, BLOCK, device=device)
    j1 = (j0 + BLOCK).clamp(max=columns) - 1
    offset = piece.row0 - piece.column0
    smallest = offset + a0[:, None] - j1[None, :]  # row index - column index over each block
    largest = offset + a1[:, None] - j0[None, :]
    fully = (smallest >= piece.low) & (largest < piece.high)
    some = (largest >= piece.low) & (smallest < piece.high)
    return some & ~fully, fully


def ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[nq, nk] bool -> (count [1, 1, nq] int32, indices [1, 1, nq, nk] int32: each row's True columns first)."""
    count = blocks.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count[None, None], indices[None, None]


def range_mask_mod(piece: Piece, device):
    """flex's mask function of the piece's key range (the bounds as tensors, so a compiled kernel is reused)."""
    # torch.full writes each bound on the device (torch.tensor would copy it from the host and wait for the device)
    offset = torch.full((), piece.row0 - piece.column0, device=device)
    low = torch.full((), int(max(piece.low, -FAR)), device=device)
    high = torch.full((), int(min(piece.high, FAR)), device=device)

    def mask_mod(b, h, a, j):
        d = a - j + offset
        return (d >= low) & (d < high)

    return mask_mod


def tensor_block_mask(mask: torch.Tensor, batch: int) -> BlockMask:
    """A block mask of an additive mask [B or 1, 1, c, kv] (allowed where above half the dtype's minimum)."""
    allowed = (mask[:, 0] > torch.finfo(mask.dtype).min / 2).expand(batch, *mask.shape[2:])  # [B, c, kv]
    rows, columns = mask.shape[2], mask.shape[3]
    # indexed by the mask function's tensors only: torch 2.9's vmap refused a constant index among them
    return create_block_mask(
        lambda b, h, a, j: allowed[b, a, j], batch, None, rows, columns, device=mask.device, BLOCK_SIZE=BLOCK
    )


def full_block_lists(row_blocks: int, column_blocks: int, device: torch.device, batch: int = 1):
    """The lists of a block mask listing every key block of every query block as full and none as partial: (partial
    counts [batch, 1, nq] int32 of 0, partial indices [batch, 1, nq, nk], full counts [batch, 1, nq] of nk, full
    indices 0..nk-1 in each row). Made outside inference mode, so that a later backward may save kept ones. No two of
    the four are one tensor: dynamo guards compiled flex's inputs against aliasing, and torch 2.9.0 raised a TypeError
    reporting that guard's failure."""
    with torch.inference_mode(False):
        indices = torch.arange(column_blocks, dtype=torch.int32, device=device).repeat(batch, 1, row_blocks, 1)
        counts = torch.zeros(batch, 1, row_blocks, dtype=torch.int32, device=device)
        return counts, indices.clone(), counts + column_blocks, indices


# the lists of one row block kept per shape and device: a decode step's pieces cut no key and meet the same shape
# for BLOCK steps in a row (at most 32 KiB each, up to a million keys); longer pieces build theirs, a prefill's
# kernel time dwarfing it
kept_full_block_lists = functools.lru_cache(maxsize=64)(full_block_lists)


def every_block_lists(rows: int, columns: int, device, batch: int = 1) -> tuple[torch.Tensor, ...]:
    """``full_block_lists`` of a rows x columns piece (one row block's kept, ``kept_full_block_lists``)."""
    return (kept_full_block_lists if rows <= BLOCK else full_block_lists)(
        -(-rows // BLOCK), -(-columns // BLOCK), torch.device(device), batch
    )


def rule_block_mask(piece: Piece, batch: int, rows: int, columns: int, device, backward: bool) -> BlockMask:
    """A piece with a rule: every key block listed as partly seen, the rule deciding inside (lists per batch row:
    the rule depends on it)."""
    *_, counts, indices = every_block_lists(rows, columns, device, batch)
    options = dict(BLOCK_SIZE=BLOCK, mask_mod=piece.rule.mask_mod, seq_lengths=(rows, columns))
    return BlockMask.from_kv_blocks(counts, indices, **options, compute_q_blocks=backward)


def piece_block_mask(piece: Piece, batch: int, rows: int, columns: int, device, backward: bool = False) -> BlockMask:
    """The block mask of a piece, also of one that sees every key (every block listed as full): given no block
    mask, compiled flex builds its own inside the graph, and its kernel took 22x longer on a decode step's single
    query row than with a block mask given to it (1.05 ms against 47 us after 32k keys on an H200). The lists by
    key block that only the backward reads are built for ``backward`` only: transposing the lists took 58 of a
    decode step's 103 operations of building the mask."""
    if piece.rule is not None:
        return rule_block_mask(piece, batch, rows, columns, device, backward)
    if piece.mask is not None:
        return tensor_block_mask(piece.mask, batch)
    if not piece.cuts(rows, columns):  # every block full, mask_mod never called
        lists = every_block_lists(rows, columns, device)
        return BlockMask.from_kv_blocks(
            *lists, BLOCK_SIZE=BLOCK, seq_lengths=(rows, columns), compute_q_blocks=backward
        )
    partly, fully = range_blocks(piece, rows, columns, device)
    return BlockMask.from_kv_blocks(
        *ordered(partly),
        *ordered(fully),
        BLOCK_SIZE=BLOCK,
        mask_mod=range_mask_mod(piece, device),
        seq_lengths=(rows, columns),
        compute_q_blocks=backward,
    )


def kernel_block_mask(q, k, v, piece: Piece) -> BlockMask:
    """The block mask the kernel gives flex for queries q [B, H, c, d] against keys k / values v [B, Hkv, kv, *]."""
    return piece_block_mask(piece, q.shape[0], q.shape[2], k.shape[2], q.device, needs_grad(q, k, v))


def flex_kernel(flex=flex_attention):
    """A kernel (``kernels.Kernel``) running ``flex`` (flex_attention, compiled or not) over pieces."""

    def kernel(q, k, v, piece: Piece, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        block_mask = kernel_block_mask(q, k, v, piece)
        gqa = q.shape[1] != k.shape[1]
        out, aux = flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa, return_aux=AuxRequest(lse=True))
        return out, aux.lse

    return kernel


@functools.cache
def compiled_flex_kernel():
    """The CUDA kernel, compiled on first use."""
    return flex_kernel(with_recompile_limit(torch.compile(flex_attention, dynamic=True)))
