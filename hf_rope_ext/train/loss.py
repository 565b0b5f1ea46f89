"""Next-token cross-entropy: from logits (``causal_lm_loss``), and from the last hidden states in chunks of tokens,
so that the (tokens, vocab) logits of a long sequence never exist at once: at 128k tokens and a 128k vocabulary
they alone would take 32 GiB in bf16.

Each chunk's logits are computed (in the autocast dtype under autocast, as the model's own head would, else in
fp32), reduced in fp32 to a summed loss and dropped; under autograd every chunk is
recomputed in the backward pass (activation checkpointing), so the peak holds one chunk's logits and their gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the scored tokens; logits (batch, seq, vocab), labels (batch, seq): the
    input ids, -100 where a token is not scored (position i predicts labels[i + 1]); fp32 softmax."""
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


CHUNK = 4096  # tokens whose logits ``chunked_causal_lm_loss`` forms at once, by default


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed fp32 cross-entropy of hidden (n, dim) against the output projection weight (vocab, dim)."""
    logits = hidden.float() @ weight.float().T  # (n, vocab)
    return F.cross_entropy(logits, labels, reduction="sum")


def chunked_causal_lm_loss(
    hidden: torch.Tensor, weight: torch.Tensor, input_ids: torch.Tensor, chunk: int = CHUNK
) -> torch.Tensor:
    """Mean next-token loss of (batch, seq, dim) last hidden states under the output projection ``weight``
    (vocab, dim), equal to ``causal_lm_loss(hidden @ weight.T, input_ids)``; ``chunk`` tokens at a time."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be an integer >= 1")
    states = hidden[:, :-1].flatten(0, 1)  # (batch * (seq - 1), dim): position i predicts token i + 1
    labels = input_ids[:, 1:].flatten()
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, labels.numel(), chunk):
        piece = slice(start, start + chunk)
        total = total + checkpoint(_chunk_loss_sum, states[piece], weight, labels[piece], use_reentrant=False)
    return total / labels.numel()
