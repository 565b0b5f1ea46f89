"""The chunks of tokens ``lean_norm.LeanRMSNorm`` computes over, so that its fp32 temporaries are one chunk's whatever
the row's length; ``moments`` counts the same bytes."""

from __future__ import annotations

import torch

FP32 = 4  # bytes of an fp32 element
# The chunk rule. A chunk of tokens holds at most CHUNK_FP32 fp32 (chunk, D) temporaries at once: in the input
# gradient ``h``, ``grad_normed`` and their product (summed over D for the gradient of ``r``); in the forward ``h`` and
# ``h * r`` beside its half cast; in the weight gradient's factor ``h`` and ``h * r``. CHUNK_BYTES bounds them: 256 MiB
# is 0.3% of an 80 GiB GPU, against the row-wide temporaries it replaces (46 GiB for Llama 3.1 8B at 512k tokens),
# and still 5456 tokens at D = 4096 (22M elements, tens of MB an op), so each of a chunk's kernels runs long beside
# its launch and the loop over chunks costs the step little. ``model.norm_chunk_bytes`` reads the same rule.
CHUNK_BYTES = 256 * 2**20
CHUNK_FP32 = 3
# A chunk has a multiple of MIN_CHUNK rows, and a last piece shorter than MIN_CHUNK joins the chunk before it: a sum
# over D (the mean, the gradient of r) must add each token's D values in the order the whole row's does, and fewer
# rows can change it (one row is a reduction to one value, which a CPU splits across threads when D >= 32768; under
# 16 rows CUDA's reduction spreads a row over a wider block); multiples of 16 rows also keep each chunk's rows at the
# alignment (mod 64 bytes) they have in a tensor of the whole row.
MIN_CHUNK = 16


def chunk_tokens(hidden: int) -> int:
    """Tokens per chunk of a norm of size ``hidden``: the most, in multiples of :data:`MIN_CHUNK` (at least one),
    whose :data:`CHUNK_FP32` fp32 temporaries fit :data:`CHUNK_BYTES` (read at each call: a test may set a smaller
    budget)."""
    fit = CHUNK_BYTES // (max(1, hidden) * FP32 * CHUNK_FP32)
    return max(MIN_CHUNK, fit // MIN_CHUNK * MIN_CHUNK)


def chunk_sizes(tokens: int, hidden: int) -> list[int]:
    """The chunks' tokens for a row of ``tokens``: :func:`chunk_tokens` each, the last shorter, a last piece under
    :data:`MIN_CHUNK` joined to the chunk before it (a row of fewer tokens: one chunk; none: no chunk)."""
    step = chunk_tokens(hidden)
    sizes = [min(step, tokens - start) for start in range(0, tokens, step)]
    if len(sizes) > 1 and sizes[-1] < MIN_CHUNK:
        sizes[-2:] = [sizes[-2] + sizes[-1]]
    return sizes


def largest_chunk(tokens: int, hidden: int) -> int:
    """The most tokens one chunk holds for a row of ``tokens`` (0 for none)."""
    return max(chunk_sizes(tokens, hidden), default=0)


def chunk_peak_bytes(tokens: int, hidden: int) -> int:
    """The bytes of the largest chunk's temporaries at the input gradient's peak for a row of ``tokens``:
    :data:`CHUNK_FP32` fp32 (chunk, D) and the fp32 gradient of ``r`` (chunk, 1) (``model.norm_chunk_bytes``)."""
    return largest_chunk(tokens, hidden) * (CHUNK_FP32 * hidden + 1) * FP32


def _chunks(tokens: int, hidden: int) -> list[slice]:
    """The row slices of :func:`chunk_sizes` that cover ``tokens`` rows, in order."""
    ends = [0]
    for size in chunk_sizes(tokens, hidden):
        ends.append(ends[-1] + size)
    return [slice(start, end) for start, end in zip(ends, ends[1:], strict=False)]


def _rows(t: torch.Tensor) -> torch.Tensor | None:
    """t (..., C) as a (tokens, C) view of its own storage, or None where its strides allow no such view."""
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


def _all_rows(*tensors: torch.Tensor) -> list[torch.Tensor] | None:
    """Every tensor as rows (:func:`_rows`), or None where one of them has no (tokens, C) view: then the caller runs
    the whole tensors as one chunk, in their own shapes and strides (temporaries of the whole row, bit for bit)."""
    rows = [_rows(t) for t in tensors]
    return None if any(r is None for r in rows) else rows
