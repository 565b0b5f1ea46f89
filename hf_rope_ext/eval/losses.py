"""Next-token losses of long sequences without the [tokens x vocabulary] logits of the whole sequence.

A forward pass of 32k tokens through a model with a 49k-token vocabulary has 6.4 GB of fp32 logits, and the loss
needs as much again. Where a model's logits are its output embedding applied to its decoder's last hidden state
(``get_output_embeddings()(get_decoder()(ids).last_hidden_state)``: Llama, Mistral, Qwen, Phi-3 and most causal
LMs), the head runs on ``HEAD_ROWS`` positions at a time and only on the positions scored. Whether that holds is
checked once per model on a few tokens against its own ``forward``; a model where it does not (logit soft-capping,
a scaled head, a head with its own transform) gets the plain forward pass.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

HEAD_ROWS = 2048  # positions per head call: 2048 x 49k vocabulary x 4 bytes = 0.4 GB of logits at a time
_LEAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> does the lean path give its logits?


def _parts(model):
    """(decoder, head) of ``model``, or None when it does not name both."""
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError, ValueError):
        return None
    return None if decoder is None or head is None or decoder is model else (decoder, head)


@torch.no_grad()
def lean_logits_match(model) -> bool:
    """Does head(decoder(ids).last_hidden_state) give ``model(ids).logits`` (checked once, on 8 tokens)?"""
    if model not in _LEAN:
        parts = _parts(model)
        ids = torch.arange(3, 11, device=next(model.parameters()).device)[None]  # (1, 8)
        ok = parts is not None
        if ok:
            hidden = parts[0](input_ids=ids, use_cache=False).last_hidden_state
            expected = model(input_ids=ids, use_cache=False).logits
            ok = hidden.shape[:2] == ids.shape and torch.equal(parts[1](hidden), expected)
        _LEAN[model] = ok
    return _LEAN[model]


@torch.no_grad()
def next_token_losses(model, input_ids: torch.Tensor, last: int | None = None) -> torch.Tensor:
    """fp32 losses (batch, last) of the last ``last`` tokens of each row of ``input_ids`` (batch, n), each predicted
    from everything before it (default: all n - 1 tokens after the first)."""
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    last = ids.shape[1] - 1 if last is None else last
    targets = ids[:, -last:]  # (batch, last)
    if not lean_logits_match(model):
        logits = model(input_ids=ids, use_cache=False).logits[:, -last - 1 : -1]  # (batch, last, vocab)
        return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")
    decoder, head = _parts(model)
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[:, -last - 1 : -1]  # (batch, last, hidden)
    pieces = []
    for i in range(0, last, HEAD_ROWS):
        logits = head(hidden[:, i : i + HEAD_ROWS]).float().transpose(1, 2)  # (batch, vocab, rows)
        pieces.append(F.cross_entropy(logits, targets[:, i : i + HEAD_ROWS], reduction="none"))
    return torch.cat(pieces, dim=1)
