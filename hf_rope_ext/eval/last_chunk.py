"""Last-chunk loss: the loss on one fixed final chunk of each document as the context before it grows.

For a document's first ``total`` tokens (``total`` = the longest context asked), the chunk is its last ``chunk``
tokens; context ``c`` feeds tokens ``[total - c, total)`` and scores only the chunk. A method that uses distant
context well has a loss that falls as ``c`` grows.
"""

from __future__ import annotations

import torch

from ..util.progress import bar
from .data import long_enough
from .perplexity import token_losses


def last_chunk_losses(
    model, documents, contexts, chunk: int = 128, limit=None, progress=True, losses_fn=None, total=None
) -> dict:
    """{context: mean loss on the final ``chunk`` tokens} for each context length in ``contexts``; the documents'
    first ``total`` tokens (default: the longest context) hold the chunk."""
    losses_fn = losses_fn or token_losses
    if min(contexts) <= chunk:
        raise ValueError(f"contexts={contexts}: every context must be longer than chunk={chunk}")
    total = total or max(contexts)
    if max(contexts) > total:
        raise ValueError(f"contexts={contexts}: every context must be at most total={total}")
    docs = [doc[:total] for doc in long_enough(documents, total, limit)]
    results = {}
    for context in bar(sorted(contexts), desc="last chunk", enabled=progress):
        # losses (n_docs, chunk): the last `chunk` scored tokens of each window [total - context, total)
        losses = torch.stack([losses_fn(model, doc[total - context :])[-chunk:] for doc in docs])
        results[context] = losses.mean().item()
    return results
