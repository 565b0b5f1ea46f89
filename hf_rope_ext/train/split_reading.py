"""The evaluation of a run on several processes (``--eval-lengths`` under ``--sequence-parallel N``, FSDP2, ZeRO-3 or
DDP): each row read through the training model's own forward, split over the sequence group as training splits it.

Every process of a group holds the whole row (1, n), keeps its contiguous shard of the tokens, the position ids
0..n-1 and the labels shifted on the whole row, and runs the model (its attention through the Ulysses all-to-all;
FSDP2 and ZeRO-3 gather each unit's weights as in training) without gradients. Its shard's token losses and argmax
predictions are gathered over the group in rank order, so every process holds the row's n - 1 scores and computes
the same records; on one process, or a group of one, the row is read whole. All processes of a run read the same
rows in the same order: the engines' collectives need every process in each forward.
"""

from __future__ import annotations

import torch

from ..attention.ulysses import gather_row
from .context_parallel import shifted_labels
from .head_loss import token_scores
from .sequence_parallel import SequenceGroup, enable


class SplitReader:
    """``losses`` and ``predictions`` of one row (n,) -> (n - 1,) each, entry t scoring token t + 1; the two share
    one forward (the last row read is remembered). ``prepared``: what to call in place of the model it is given (the
    model as accelerate prepared it: a DDP wrapper, a DeepSpeed engine), None to call the model itself."""

    def __init__(self, sequence: SequenceGroup, prepared=None):
        self.sequence, self.prepared, self.last = sequence, prepared, None
        self.shards: dict[int, int] = {}  # row length -> the tokens of it each process read

    def losses(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        return self.read(model, input_ids)[0]

    def predictions(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        return self.read(model, input_ids)[1]

    def read(self, model, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (id(model), input_ids.data_ptr(), input_ids.numel())
        if self.last is None or self.last[0] != key:  # the row is kept with it: its memory is not another row's yet
            self.last = (key, read_row(model, input_ids, self.sequence, self.prepared), input_ids)
            self.shards[input_ids.numel()] = input_ids.numel() // self.sequence.size
        return self.last[1]


@torch.no_grad()
def read_row(model, input_ids: torch.Tensor, seq: SequenceGroup, prepared=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 losses (n - 1,), predictions (n - 1,)) of the row ``input_ids`` (n,), on the CPU; ``model`` the module
    (its head, config and attention modules), ``prepared`` what runs it (default: ``model``)."""
    if input_ids.numel() % seq.size:
        raise ValueError(f"a row of {input_ids.numel()} tokens does not split into {seq.size} shards")
    device = next(model.parameters()).device
    ids = input_ids[None].to(device)  # (1, n)
    labels, positions = shifted_labels(ids), torch.arange(ids.shape[1], device=device)[None]
    ids, positions, labels = (seq.shard(t) for t in (ids, positions, labels))  # (1, n / N) each
    disable = enable(model, seq)
    try:
        inputs = dict(input_ids=ids, position_ids=positions, attention_mask=torch.ones_like(ids))
        scores = token_scores(prepared or model, model, labels, **inputs)
    finally:
        disable()
    if seq.size > 1:
        scores = tuple(gather_row(x, seq.group) for x in scores)  # (1, n) each, shards in rank order
    return scores[0][0, :-1].float().cpu(), scores[1][0, :-1].cpu()
