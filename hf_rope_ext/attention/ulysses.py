"""Ulysses sequence parallelism around an attention function: each of the N processes of a sequence group holds a
contiguous shard of every row's tokens; around the attention call, queries, keys and values go from sequence shards
to head shards (an all-to-all), the wrapped function attends over the whole row for heads/N of the heads, and its
output goes back to sequence shards. Position ids are all-gathered, so the function sees every query's and key's
position: an attention-level type rotates and bands exactly as on one process, and a dynamic type's length is the
row's.

Heads: N divides the query heads and divides, or is a multiple of, the key-value heads (:func:`allowed_sizes`). Where
N exceeds the key-value heads, each key-value head goes into the all-to-all as N / kv copies (kv = 2, N = 4: heads
[0, 0, 1, 1]), so rank j receives kv head j // (N / kv), the one its query heads read (GQA: query head h reads kv
head h // (heads / kv)); the copies' gradients come back through the all-to-all and ``repeat_interleave``'s backward
sums them into the head's.

The wrapped function is called with no mask: the shards are contiguous, so causality is by index over the whole row
(what ``"sdpa"``, flash-attention and the package's engines take a missing mask to mean). Rows are full (no padding):
a mask that hides a key a causal row attends is refused (:func:`check_mask`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

# the attribute of an attention module that holds its sequence group (absent: no sequence parallelism)
GROUP = "_hf_rope_ext_sequence_group"
CAUSAL_WITHOUT_MASK = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4")


def sequence_group(module):
    """The process group ``module`` shares its rows' tokens with, or None."""
    return getattr(module, GROUP, None)


def allowed_sizes(heads: int, kv_heads: int) -> list[int]:
    """The N a model of ``heads`` query and ``kv_heads`` key-value heads splits over: N divides the query heads and
    divides, or is a multiple of, the key-value heads."""
    return [n for n in range(1, heads + 1) if heads % n == 0 and (kv_heads % n == 0 or n % kv_heads == 0)]


def kv_copies(kv_heads: int, size: int) -> int:
    """Copies of each key-value head the all-to-all sends: N / kv where N exceeds the key-value heads, else 1."""
    return size // kv_heads if size > kv_heads else 1


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


def copied_heads(x: torch.Tensor, size: int) -> torch.Tensor:
    """Keys or values (batch, kv, shard, dim) -> (batch, kv * c, shard, dim), c = :func:`kv_copies`: head i as copies
    [i*c, (i+1)*c), so the all-to-all gives rank j kv head j // c. Its backward sums the c copies' gradients."""
    copies = kv_copies(x.shape[1], size)
    return x if copies == 1 else x.repeat_interleave(copies, dim=1)


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
    heads, kv_heads = query.shape[1], key.shape[1]
    if size not in allowed_sizes(heads, kv_heads):
        raise ValueError(
            f"sequence_parallel={size} must divide the {heads} query heads and divide or be a multiple of the "
            f"{kv_heads} key-value heads of model_type={getattr(module.config, 'model_type', None)!r}; allowed: "
            f"{allowed_sizes(heads, kv_heads)}"
        )
    window, row = kwargs.get("sliding_window"), query.shape[2] * size
    if window is not None and window < row:  # the window lives in the mask, which the row's call goes without
        raise ValueError(
            f"sequence_parallel={size}: a sliding-window layer (sliding_window={window}) shorter than the row "
            f"({row} tokens) is not supported"
        )
    if kwargs.get("position_ids") is None:
        raise ValueError(f"sequence_parallel={size}: the attention call got no position_ids to gather")


def check_mask(mask, size: int) -> None:
    """The row's call goes without a mask, so the shard's must hide nothing a causal row attends: None, a
    (batch, shard) padding mask of ones (flash-attention), or a (batch, 1 | heads, q, k) mask (bool: True attends;
    float: 0 attends) that is exactly causal. Anything else (padding, packed sequences read from position ids) is
    refused: its rows would attend keys their mask hides."""
    if mask is None or not isinstance(mask, torch.Tensor):
        return
    if mask.dim() == 2:
        full = bool(mask.all())
    else:
        attends = mask if mask.dtype == torch.bool else mask == 0  # (batch, 1 | heads, q, k)
        q, k = mask.shape[-2:]
        causal = torch.ones(q, k, dtype=torch.bool, device=mask.device).tril(k - q)  # query i attends keys <= i
        full = bool((attends == causal).all())
    if not full:
        raise ValueError(
            f"sequence_parallel={size}: the attention_mask hides tokens of a row (padding, or packed sequences "
            "read from position ids); rows must be full and unpadded under --sequence-parallel (an all-ones "
            "attention_mask)"
        )


@contextmanager
def local_groups(module, groups: int):
    """``module.num_key_value_groups`` (the query heads per key-value head, which transformers' SDPA repeats keys and
    values by) set to the groups of this rank's heads for the call, then restored."""
    stock = getattr(module, "num_key_value_groups", None)
    if stock is None or stock == groups:
        yield
        return
    module.num_key_value_groups = groups
    try:
        yield
    finally:
        module.num_key_value_groups = stock


def ulysses_attention(inner, implementation: str, module, query, key, value, attention_mask, *args, **kwargs):
    """``inner`` (an attention function of transformers' interface) over the whole row of a sequence-sharded call:
    query (batch, heads, shard, dim), key and value (batch, kv, shard, dim) in, (batch, shard, heads, dim) out; the
    mask transformers built for the shard, refused unless it is causal and full, is dropped (causal by index over
    the row). ``inner`` gets heads/N query heads and max(kv, N)/N key-value heads (their GQA groups set on the
    module for the call)."""
    group = sequence_group(module)
    size = dist.get_world_size(group)
    if implementation not in CAUSAL_WITHOUT_MASK:
        raise ValueError(
            f"sequence_parallel={size} runs the attention implementations {list(CAUSAL_WITHOUT_MASK)}; "
            f"the model uses {implementation!r}"
        )
    check_shapes(module, query, key, size, kwargs)
    check_mask(attention_mask, size)
    kwargs["position_ids"] = gather_row(kwargs["position_ids"], group)
    key, value = copied_heads(key, size), copied_heads(value, size)  # (batch, max(kv, N), shard, dim)
    query, key, value = (heads_of_row(t, group) for t in (query, key, value))
    with local_groups(module, query.shape[1] // key.shape[1]):
        output, _ = inner(module, query, key, value, None, *args, **kwargs)
    return shard_of_heads(output, group), None
