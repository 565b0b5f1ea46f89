"""Far-context loss: does a method read beyond the pretraining length L0, or only survive it?

For each document's first ``total`` tokens (``total`` = the longest length asked), the scored span is its last
``chunk`` tokens (``chunk`` = L0 - 1 in the main job, so every length L >= L0 can score them). At length L the model
reads ``[total - L, total)`` in one pass and is scored on that span (``last_chunk_losses``). The baseline is the
model as pretrained reading a sliding window: every scored token is read inside a ``window`` (= L0) token window,
so it sees up to L0 - 1 tokens before it, all at distances the model was trained on (with ``stride`` s > 1, windows
step by s and a token sees L0 - s to L0 - 1 tokens: s times fewer passes; the main job uses s = 16).
A method uses the extra context only where its loss is below the baseline:
``far_context_ratio`` = exp(loss - baseline loss) < 1.
"""

from __future__ import annotations

import math

import torch

from .data import long_enough
from .last_chunk import last_chunk_losses
from .losses import next_token_losses


@torch.no_grad()
def sliding_window_losses(model, input_ids: torch.Tensor, window: int, chunk: int, stride: int = 1, batch=None):
    """Losses (chunk,) of the last ``chunk`` tokens of ``input_ids`` (n,), each read by the model as part of a
    ``window``-token window ending at most ``stride`` - 1 tokens after it: a token sees the window - stride to
    window - 1 tokens before it (exactly window - 1 with stride 1). Windows end at n, n - stride, ...; one forward
    pass per window, ``batch`` windows at a time (default: as many as make 32k tokens, 1 to 8)."""
    n = len(input_ids)
    if not 1 <= stride <= min(chunk, window - 1) or n < window + chunk - 1:
        raise ValueError(
            f"stride={stride}, chunk={chunk}, window={window}, tokens={n}: need 1 <= stride <= min(chunk, window - 1) "
            "and window + chunk - 1 tokens"
        )
    ends = list(range(n, n - chunk, -stride))  # window ends (exclusive), last first
    scored = [min(stride, e - (n - chunk)) for e in ends]  # tokens each window scores: its last ones
    windows = torch.stack([input_ids[e - window : e] for e in ends])  # (n_windows, window)
    batch = batch or min(8, max(1, 2**15 // window))
    out = []
    for i in range(0, len(ends), batch):
        losses = next_token_losses(model, windows[i : i + batch], last=max(scored[i : i + batch]))
        out += [row[-k:] for row, k in zip(losses, scored[i : i + batch], strict=True)]
    return torch.cat(out[::-1]).cpu()  # back to text order


def sliding_window_baseline(model, documents, total: int, window: int, chunk: int, limit=None, stride=16) -> float:
    """Mean sliding-window loss (``sliding_window_losses``) on the last ``chunk`` tokens of each document's first
    ``total`` tokens (documents with ``total`` tokens, the first ``limit`` of them)."""
    docs = long_enough(documents, total, limit)
    return torch.cat([sliding_window_losses(model, doc[:total], window, chunk, stride) for doc in docs]).mean().item()


def far_context_ratio(loss: float, baseline: float) -> float:
    """Perplexity ratio against the baseline on the same tokens: < 1 means the longer context helped."""
    return math.exp(loss - baseline)


def with_far_context(model, records, documents, total, window, baseline, limit, progress=True, cache=None) -> list:
    """Each record (one ``length`` >= ``window``) with ``far_context_loss`` (the last ``window`` - 1 tokens of each
    document's first ``total``, read with ``length`` tokens), the ``baseline`` and their ratio added."""
    lengths = [r["length"] for r in records]
    far = last_chunk_losses(model, documents, lengths, window - 1, limit, progress, cache, total=total)
    return [
        {
            **r,
            "far_context_loss": far[n],
            "far_context_baseline": baseline,
            "far_context_ratio": far_context_ratio(far[n], baseline),
        }
        for r, n in zip(records, lengths, strict=True)
    ]
