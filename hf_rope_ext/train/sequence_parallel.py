"""Sequence parallelism for fine-tuning (``--sequence-parallel N``): each row's tokens split over N processes in
contiguous shards, attention by a Ulysses all-to-all (``attention.ulysses``) around whatever attention function the
model uses, so every rope type trains as on one process.

Processes = data-parallel x sequence-parallel: ranks ``[g*N, (g+1)*N)`` form sequence group g and read the same rows
(``--batch-size`` counts rows per group). Every rank of a group holds the whole row's input ids, position ids (PoSE
skips included) and labels, shifted on the whole row before sharding; it keeps its shard and scores it. The loss of a
group is its rows' summed token losses over their valid-token count (all-reduced over the group); each rank returns
N times its share, so that gradients averaged over all N x data-parallel processes (DDP, FSDP2, ZeRO-3) are the
data-parallel average of the groups' gradients, and the mean of the ranks' losses is the mean of the groups' losses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..attention.ulysses import CAUSAL_WITHOUT_MASK, GROUP, allowed_sizes, gather_row
from .context_parallel import IGNORE_INDEX


@dataclass(frozen=True)
class SequenceGroup:
    """This process' sequence group: its size N, this rank's place in it, and the torch process group."""

    size: int
    rank: int
    group: object  # a torch.distributed ProcessGroup (None for size 1)

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, row, ...) -> this rank's contiguous (batch, row / N, ...) piece."""
        width = x.shape[1] // self.size
        return x[:, self.rank * width : (self.rank + 1) * width]


ONE = SequenceGroup(1, 0, None)


def check_size(size: int, processes: int) -> None:
    """N must split the processes into whole sequence groups."""
    if size < 1 or processes % size:
        raise ValueError(
            f"--sequence-parallel {size} must be >= 1 and divide the number of processes ({processes}); "
            "processes = data-parallel x sequence-parallel"
        )


def make_group(size: int, processes: int, rank: int) -> SequenceGroup:
    """The sequence group of process ``rank``: ranks [g*size, (g+1)*size). Every process creates every group (torch's
    ``new_group`` is collective)."""
    check_size(size, processes)
    if size == 1:
        return ONE
    groups = [dist.new_group(list(range(start, start + size))) for start in range(0, processes, size)]
    return SequenceGroup(size, rank % size, groups[rank // size])


def check_model(config, size: int, lengths) -> None:
    """Before training: heads that split over N (``attention.ulysses.allowed_sizes``), rows that split into N shards,
    no sliding window shorter than a row, an attention implementation the wrapper carries (``lengths``: the training
    rows' lengths)."""
    if size == 1:
        return
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if size not in allowed_sizes(heads, kv):
        raise ValueError(
            f"--sequence-parallel {size} must divide the {heads} query heads and divide or be a multiple of the {kv} "
            f"key-value heads (a multiple sends each key-value head as N / {kv} copies); allowed: "
            f"{allowed_sizes(heads, kv)}"
        )
    odd = [n for n in lengths if n % size]
    if odd:
        raise ValueError(f"--sequence-parallel {size}: a training row of {odd[0]} tokens does not split into {size}")
    check_window(config, size, max(lengths))
    if config._attn_implementation not in CAUSAL_WITHOUT_MASK:
        raise ValueError(
            f"--sequence-parallel {size} runs attention through {list(CAUSAL_WITHOUT_MASK)}, "
            f"not {config._attn_implementation!r}"
        )


def check_window(config, size: int, row: int) -> None:
    """A sliding window lives in the mask, which the wrapper's call over the row goes without: refused where a row is
    longer than the window (Qwen2's ``use_sliding_window`` off, or every layer full, has none)."""
    window, layer_types = getattr(config, "sliding_window", None), getattr(config, "layer_types", None) or ()
    slides = "sliding_attention" in layer_types or getattr(config, "use_sliding_window", True)
    if window and slides and window < row:
        raise ValueError(
            f"--sequence-parallel {size}: sliding-window layers (sliding_window={window}) shorter than a training "
            f"row ({row} tokens) are not supported"
        )


def enable(model, seq: SequenceGroup):
    """Mark ``model``'s modules for the Ulysses wrapper and give its rotary modules the row's length; returns a
    function that undoes both. Nothing changes for size 1."""
    if seq.size == 1:
        return lambda: None
    marked = [m for m in model.modules() if hasattr(m, "config")]  # the attention modules among them
    for module in marked:
        setattr(module, GROUP, seq.group)
    handles = [hook for m in model.modules() if is_rotary(m) for hook in row_length_hooks(m, seq.group)]

    def disable():
        for module in marked:
            delattr(module, GROUP)
        for handle in handles:
            handle.remove()

    return disable


def is_rotary(module) -> bool:
    """A rotary embedding module reading transformers' rope registry (as ``_transformers.modules.rotary_class``)."""
    return hasattr(type(module), "compute_default_rope_parameters")


def row_length_hooks(module, group) -> list:
    """Hooks that make a rotary module's frequencies those of the whole row: transformers' dynamic types (``dynamic``,
    ``longrope``, the package's ``dynamic_yarn`` on families it does not route) read the length from the largest
    position id they get. The shard's ids go in with each row's largest id of the whole row as one more column, whose
    cos and sin are dropped again: (batch, shard) ids -> (batch, shard + 1) -> cos, sin (batch, shard, dim)."""

    def before(_module, args, kwargs):
        if "position_ids" in kwargs:
            kwargs = {**kwargs, "position_ids": with_row_end(kwargs["position_ids"], group)}
        else:
            args = (args[0], with_row_end(args[1], group), *args[2:])
        return args, kwargs

    def after(_module, _args, _kwargs, output):
        return tuple(t[:, :-1] for t in output)

    pre = module.register_forward_pre_hook(before, with_kwargs=True)
    return [pre, module.register_forward_hook(after, with_kwargs=True)]


def with_row_end(positions: torch.Tensor, group) -> torch.Tensor:
    """(batch, shard) position ids and, as a last column, each row's largest id over every shard."""
    return torch.cat([positions, gather_row(positions, group).amax(dim=1, keepdim=True)], dim=1)


def shard_loss(total: torch.Tensor, labels: torch.Tensor, seq: SequenceGroup) -> torch.Tensor:
    """N x ``total`` (this shard's summed token loss) / the group's valid tokens; labels: this rank's shard of the
    whole row's shifted labels (batch, shard), -100 not scored. Unsplit: the mean over the valid tokens."""
    return seq.size * total / valid_tokens(labels, seq)


def valid_tokens(labels: torch.Tensor, seq: SequenceGroup) -> torch.Tensor:
    """The scored tokens of the group's rows (at least 1), all-reduced over the sequence group."""
    count = (labels != IGNORE_INDEX).sum().float()
    if seq.size > 1:
        dist.all_reduce(count, group=seq.group)
    return count.clamp(min=1.0)
