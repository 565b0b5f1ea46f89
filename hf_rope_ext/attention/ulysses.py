"""Ulysses sequence parallelism around an attention function: each of the N processes of a sequence group holds a
contiguous shard of every row's tokens; around the attention call, queries, keys and values go from sequence shards
to head shards (an all-to-all), the wrapped function attends over the whole row for heads/N of the heads, and its
output goes back to sequence shards. Position ids are all-gathered, so the function sees every query's and key's
position: an attention-level type rotates and bands exactly as on one process, and a dynamic type's length is the
row's.

The wrapped function is called with no mask: the shards are contiguous, so causality is by index over the whole row
(what ``"sdpa"``, flash-attention and the package's engines take a missing mask to mean). Rows are full (no padding).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# the attribute of an attention module that holds its sequence group (absent: no sequence parallelism)
GROUP = "_hf_rope_ext_sequence_group"
CAUSAL_WITHOUT_MASK = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4")


def sequence_group(module):
    """The process group ``module`` shares its rows' tokens with, or None."""
    return getattr(module, GROUP, None)


def all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Cut ``x`` into N equal pieces along ``scatter_dim`` and send piece j to rank j of ``group``; return the pieces
    received, concatenated in rank order along ``gather_dim``."""
    send = torch.stack(x.chunk(dist.get_world_size(group), dim=scatter_dim)).contiguous()  # (N, *piece)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """``all_to_all`` whose gradient is the all-to-all back (gather dim scattered, scatter dim gathered)."""

    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


def heads_of_row(x: torch.Tensor, group) -> torch.Tensor:
    """(batch, heads, shard, dim) -> (batch, heads/N, row, dim): this rank's heads over the whole row (rank j holds
    heads [j*heads/N, (j+1)*heads/N); the row's tokens in rank order)."""
    return _AllToAll.apply(x, group, 1, 2)


def shard_of_heads(x: torch.Tensor, group) -> torch.Tensor:
    """(batch, row, heads/N, dim), an attention output -> (batch, shard, heads, dim): every head, this rank's tokens."""
    return _AllToAll.apply(x, group, 1, 2)


def gather_row(x: torch.Tensor, group) -> torch.Tensor:
    """(batch, shard) -> (batch, row): the shards of every rank in rank order (no gradient: position ids)."""
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return torch.cat(pieces, dim=1)


def check_shapes(module, query: torch.Tensor, key: torch.Tensor, size: int, kwargs: dict) -> None:
    """What the all-to-all cannot carry: heads that do not split over the group, a sliding window, no position ids."""
    if query.shape[1] % size or key.shape[1] % size:
        raise ValueError(
            f"sequence_parallel={size} must divide the attention heads: {query.shape[1]} query and {key.shape[1]} "
            f"key-value heads of model_type={getattr(module.config, 'model_type', None)!r}"
        )
    window, row = kwargs.get("sliding_window"), query.shape[2] * size
    if window is not None and window < row:  # the window lives in the mask, which the row's call goes without
        raise ValueError(
            f"sequence_parallel={size}: a sliding-window layer (sliding_window={window}) shorter than the row "
            f"({row} tokens) is not supported"
        )
    if kwargs.get("position_ids") is None:
        raise ValueError(f"sequence_parallel={size}: the attention call got no position_ids to gather")


def ulysses_attention(inner, implementation: str, module, query, key, value, attention_mask, *args, **kwargs):
    """``inner`` (an attention function of transformers' interface) over the whole row of a sequence-sharded call:
    query, key, value (batch, heads, shard, dim) in, (batch, shard, heads, dim) out; the mask transformers built for
    the shard is dropped (causal by index over the row)."""
    group = sequence_group(module)
    size = dist.get_world_size(group)
    if implementation not in CAUSAL_WITHOUT_MASK:
        raise ValueError(
            f"sequence_parallel={size} runs the attention implementations {list(CAUSAL_WITHOUT_MASK)}; "
            f"the model uses {implementation!r}"
        )
    check_shapes(module, query, key, size, kwargs)
    kwargs["position_ids"] = gather_row(kwargs["position_ids"], group)
    query, key, value = (heads_of_row(t, group) for t in (query, key, value))
    output, _ = inner(module, query, key, value, None, *args, **kwargs)
    return shard_of_heads(output, group), None
