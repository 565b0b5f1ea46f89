"""Context (sequence) parallelism: which tokens, position ids and labels each of ``cp_size`` ranks holds.

torch's ``context_parallel`` (behind accelerate's ``maybe_context_parallel``) shards every buffer along the sequence:
with head-tail load balancing when ``length % (2 * cp_size) == 0`` (the sequence cut into ``2 * cp_size`` equal
chunks, rank r holding chunks r and ``2 * cp_size - 1 - r``, so every rank gets an equal share of the causal mask),
otherwise rank r holds the r-th of ``cp_size`` equal consecutive pieces.

Position ids are a buffer like the tokens, so each rank's ids are the ones the whole sequence gives its tokens
(PoSE skips included); labels are shifted on the whole sequence *before* sharding, so every token's label is its
successor in the whole sequence even when that successor lives on another rank.
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
