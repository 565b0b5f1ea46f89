"""Perplexity of truncated documents: the first ``length`` tokens of each document at least that long.

One forward pass per document; every token after the first is scored; perplexity = exp(mean token loss) over all
scored tokens of all documents (each document contributes ``length - 1`` of them).
"""

from __future__ import annotations

import math

import torch

from ..util.progress import bar
from .data import long_enough
from .losses import next_token_losses


def token_losses(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token losses of one sequence ``input_ids`` (n,): shape (n - 1,), fp32; entry t scores token t + 1."""
    return next_token_losses(model, input_ids[None])[0]


class CachedLosses:
    """``compute`` (default ``token_losses``) remembered per (model, window): a window is a view of a document, named
    by its data pointer and size, so perplexity and last-chunk loss share forward passes over the same tokens. Keep
    documents alive. A run on several processes passes its own ``compute`` (fine-tuning's split reading)."""

    def __init__(self, compute=None):
        self.store, self.compute = {}, compute or token_losses

    def __call__(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        key = (id(model), input_ids.data_ptr(), input_ids.numel())
        if key not in self.store:
            self.store[key] = self.compute(model, input_ids)
        return self.store[key]


def truncated_perplexity(model, documents, length: int, limit: int | None = None, progress=True, losses_fn=None):
    """{'perplexity', 'loss', 'documents', 'tokens'} over the first ``length`` tokens of each long-enough document."""
    losses_fn = losses_fn or token_losses
    docs = long_enough(documents, length, limit)
    losses = [losses_fn(model, doc[:length]) for doc in bar(docs, desc=f"perplexity @{length}", enabled=progress)]
    mean = torch.cat(losses).mean().item()
    return {"perplexity": math.exp(mean), "loss": mean, "documents": len(docs), "tokens": len(docs) * (length - 1)}
