"""Context (sequence) parallelism: which tokens, position ids and labels each of ``cp_size`` ranks holds.

torch's ``context_parallel`` (behind accelerate's ``maybe_context_parallel``) shards every buffer along the sequence:
with head-tail load balancing when ``length % (2 * cp_size) == 0`` (the sequence cut into ``2 * cp_size`` equal
chunks, rank r holding chunks r and ``2 * cp_size - 1 - r``, so every rank gets an equal share of the causal mask),
otherwise rank r holds the r-th of ``cp_size`` equal consecutive pieces.

Position ids are a buffer like the tokens, so each rank's ids are the ones the whole sequence gives its tokens
(PoSE skips included); labels are shifted on the whole sequence *before* sharding, so every token's label is its
successor in the whole sequence even when that successor lives on another rank.

torch's ``context_parallel`` replaces ``F.scaled_dot_product_attention`` and nothing else, so it is right only where
attention is that call and the frequencies do not follow the length (``check_context_parallel``); the package's
engines and the dynamic types need ``--sequence-parallel`` (``sequence_parallel.py``).
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # label of the last token: it has no successor


def shifted_labels(input_ids: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """(batch, seq) next-token labels: ``labels[:, i] = input_ids[:, i + 1]``, the last one ``ignore_index``."""
    return torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], ignore_index)], dim=1)


def load_balanced(length: int, cp_size: int) -> bool:
    """torch's default: head-tail load balancing whenever the length splits into ``2 * cp_size`` equal chunks."""
    return length % (2 * cp_size) == 0


def shard_order(length: int, cp_size: int, load_balance: bool | None = None) -> torch.Tensor:
    """(cp_size, length // cp_size) int64: row r lists the sequence indices rank r holds, in its local order."""
    if cp_size < 1 or length % cp_size:
        raise ValueError(f"length={length} must split evenly over cp_size={cp_size} context-parallel ranks")
    balance = load_balanced(length, cp_size) if load_balance is None else load_balance
    if not balance:
        return torch.arange(length).view(cp_size, -1)
    if not load_balanced(length, cp_size):
        raise ValueError(f"load_balance=True needs length={length} divisible by 2 x cp_size={2 * cp_size}")
    chunks = torch.arange(length).view(2 * cp_size, -1)  # (2 cp, chunk)
    head, tail = chunks[:cp_size], chunks[cp_size:].flip(0)  # rank r: chunk r and chunk 2cp-1-r
    return torch.cat([head, tail], dim=1)


def shard_sequence(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cp_size: int,
    cp_rank: int,
    load_balance: bool | None = None,
) -> dict[str, torch.Tensor]:
    """Rank ``cp_rank``'s share of (batch, seq) ``input_ids`` and ``position_ids``, and of the whole sequence's
    shifted labels: each (batch, seq // cp_size), as torch's context parallelism shards them."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank={cp_rank} must lie in [0, cp_size={cp_size})")
    if position_ids.shape != input_ids.shape:
        raise ValueError(f"position_ids shape {tuple(position_ids.shape)} != input_ids {tuple(input_ids.shape)}")
    index = shard_order(input_ids.shape[1], cp_size, load_balance)[cp_rank].to(input_ids.device)
    labels = shifted_labels(input_ids)
    return {
        name: t[:, index] for name, t in (("input_ids", input_ids), ("position_ids", position_ids), ("labels", labels))
    }


def check_context_parallel(accelerator, rope_type: str, implementation: str, sequence_parallel: int = 1) -> None:
    """torch's context parallelism (accelerate's ``cp_size``) replaces ``F.scaled_dot_product_attention`` alone: it is
    right only for SDPA attention under a frequency-level type whose frequencies do not follow the length. Anything
    else would attend within each rank's shard and raise nothing: refused, pointing to --sequence-parallel."""
    parallelism = getattr(accelerator, "parallelism_config", None)
    if parallelism is None or not parallelism.cp_enabled:
        return
    reason = context_parallel_obstacle(rope_type, implementation)
    if sequence_parallel > 1:
        reason = f"--sequence-parallel {sequence_parallel} is asked as well"
    if reason:
        raise ValueError(
            f"context parallelism (the accelerate config's cp_size={parallelism.cp_size}) cannot train this run: "
            f"{reason}; use --sequence-parallel N (a Ulysses all-to-all that works for every rope type) instead"
        )


def context_parallel_obstacle(rope_type: str, implementation: str) -> str | None:
    """Why torch's context parallelism would be silently wrong for ``rope_type`` under ``implementation``, or None."""
    from ..types import registry

    if implementation != "sdpa":
        return f"attn_implementation={implementation!r} does not call F.scaled_dot_product_attention"
    method = registry.find(rope_type)
    if method is not None and method.kind == "attention":
        return f"rope_type={rope_type!r} scores attention in the package's own engine, which torch's sharding misses"
    if registry.follows_length(rope_type):
        return f"rope_type={rope_type!r} takes its frequencies from the largest position id each rank sees"
    return None
