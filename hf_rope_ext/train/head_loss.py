"""The summed next-token loss of a training forward without its (tokens, vocab) logits: at 32k tokens and a 49k
vocabulary those alone take 6 GiB in fp32, more than a LoRA step's activations.

While the model runs, a pre-hook on its output head (a plain ``nn.Linear``) keeps the head's input and lets the head
compute logits for no token; a hook after it scores the kept hidden states in chunks of tokens against the labels
(``fused_head_loss``), still inside the model's forward, where a sharded head (FSDP2) holds its whole weight. The
gradient for the hidden states (and the head's weight, when it trains) is formed chunk by chunk in the same pass and
kept, so the backward pass needs neither the logits nor the head's weight again. Where the family changes the head's
values (a soft cap, a scale: ``models.output_head``) or the head is not a plain linear layer (LoRA on it), the logits
are formed in full as before. Under DeepSpeed ZeRO-3 the head's weight is partitioned and its engine may release it
before a later forward hook runs, so the hook gathers it again (``deepspeed.zero.GatheredParameters``); and the
engine's backward hooks expect every module that ran to be in the graph ("active_backward_submodules is empty during
backward pass" otherwise), so the loss adds the head's empty output (a sum of no element: 0). A head that trains
under ZeRO-3 (its gradient formed in the forward would belong to the gathered weight) keeps the full logits.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from ..models.output_head import logits_are_head_output
from .context_parallel import IGNORE_INDEX

CHUNK = 4096  # the most tokens scored at once: CHUNK x vocab fp32 logits at a time


def chunk_loss_and_grads(hidden, weight, bias, labels):
    """(summed fp32 loss, d loss / d logits (n, vocab) fp32) of hidden (n, dim) under the head (vocab, dim) [+ bias],
    labels (n,). The logits are formed as the model's head forms them (in the autocast dtype under autocast); at most
    two (n, vocab) fp32 tensors are alive at once: the gradient is the log-softmax turned into the softmax in place."""
    logp = torch.log_softmax(F.linear(hidden, weight, bias).float(), dim=-1)  # (n, vocab)
    valid = labels != IGNORE_INDEX
    rows, picked = valid.nonzero().squeeze(1), labels[valid]
    loss = -logp[rows, picked].sum()
    grad = logp.exp_()  # the softmax
    grad[rows, picked] -= 1.0
    grad[~valid] = 0.0  # tokens not scored
    return loss, grad


class FusedHeadLoss(torch.autograd.Function):
    """Summed cross-entropy of ``hidden @ weight.T + bias`` against ``labels``, ``chunk`` tokens at a time; the
    gradients (fp32 sums) are formed in the forward pass, one chunk's logits alive at once, and scaled by the
    backward pass's incoming gradient. hidden (n, dim), weight (vocab, dim), bias (vocab,) or None, labels (n,)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk):
        wants = ctx.needs_input_grad[:3]
        grads = [
            torch.zeros_like(t, dtype=torch.float32) if w else None
            for t, w in zip((hidden, weight, bias), wants, strict=True)
        ]
        total, weight32 = hidden.new_zeros((), dtype=torch.float32), weight.float()
        for start in range(0, labels.numel(), chunk):
            piece = slice(start, start + chunk)
            loss, grad_logits = chunk_loss_and_grads(hidden[piece], weight, bias, labels[piece])
            total += loss
            with torch.autocast(hidden.device.type, enabled=False):  # the gradients' products in fp32
                accumulate(grads, piece, grad_logits, hidden[piece].float(), weight32)
        ctx.grads, ctx.dtypes = grads, (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grads = [None if g is None else (g * grad_total).to(d) for g, d in zip(ctx.grads, ctx.dtypes, strict=True)]
        ctx.grads = None
        return (*grads, None, None)


def accumulate(grads: list, piece: slice, grad_logits, hidden, weight) -> None:
    """Add one chunk's share to the gradients asked for: hidden's rows of the chunk, the head's weight and bias."""
    if grads[0] is not None:
        grads[0][piece] = grad_logits @ weight  # (chunk, dim)
    if grads[1] is not None:
        grads[1] += grad_logits.T @ hidden  # (vocab, dim)
    if grads[2] is not None:
        grads[2] += grad_logits.sum(0)


def chunk_tokens(tokens: int, dim: int, vocab: int) -> int:
    """Tokens per chunk: a chunk's logits about as large as the hidden states (tokens x dim), as liger-kernel sizes
    its chunks, so the loss's memory shrinks with the tokens a process holds; a power of two, at most ``CHUNK``."""
    return min(CHUNK, 1 << max(0, math.ceil(tokens * dim / vocab) - 1).bit_length())


def fused_head_loss(hidden, weight, bias, labels, chunk: int | None = None) -> torch.Tensor:
    """Summed next-token loss of hidden (batch, seq, dim) whose position i is scored against labels (batch, seq)[i]
    (already shifted; -100: not scored), under the head ``weight`` (vocab, dim) and ``bias``; ``chunk`` tokens at a
    time (default ``chunk_tokens``)."""
    chunk = (
        chunk_tokens(hidden.shape[0] * hidden.shape[1], hidden.shape[-1], weight.shape[0]) if chunk is None else chunk
    )
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be an integer >= 1")
    return FusedHeadLoss.apply(hidden.flatten(0, 1), weight, bias, labels.flatten(), chunk)


def summed_loss(model, unwrapped, labels: torch.Tensor, **inputs) -> torch.Tensor:
    """``model(**inputs)``'s summed token loss against ``labels`` (batch, seq), shifted: position i scored against
    labels[:, i]. ``unwrapped``: the model under its wrappers (DDP's, FSDP's), which names its output head."""
    head = unwrapped.get_output_embeddings()
    if not chunked_head(head, unwrapped.config):
        logits = model(**inputs).logits
        return F.cross_entropy(
            logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
    # + the head's empty output: it stays in the graph, so an engine that hooks the head's backward (ZeRO-3) sees it
    score = lambda hidden, empty: fused_head_loss(hidden, head.weight, head.bias, labels) + empty.float().sum()  # noqa: E731
    return on_head_input(model, head, score, inputs)


def on_head_input(model, head, score, inputs: dict):
    """``score(hidden, empty)`` of the head's input (batch, seq, dim) and its output (logits of no token, which the head
    is asked for), computed inside ``model(**inputs)`` right after the head's own forward, where a sharded head holds
    its whole weight (a ZeRO-3 head gathered again for it: its engine may release it before this hook runs)."""
    kept = {}

    def before(_head, args):
        kept["hidden"] = args[0]
        return (args[0][:, :0],)  # logits for no token

    def after(_module, _args, output):
        with gathered(head):
            kept["score"] = score(kept.pop("hidden"), output)

    hooks = [head.register_forward_pre_hook(before), head.register_forward_hook(after)]
    try:
        model(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return kept["score"]


def chunked_head(head, config) -> bool:
    """A plain linear head whose output the family returns as its logits, frozen where DeepSpeed ZeRO-3 partitions
    it: see the module's docstring."""
    trains = any(p.requires_grad for p in head.parameters())
    plain = type(head) is torch.nn.Linear and not (partitioned(head) and trains)
    return plain and logits_are_head_output(getattr(config, "model_type", None))


def partitioned(head) -> bool:
    """Whether DeepSpeed ZeRO-3 partitions the head (its parameters carry a ``ds_id``)."""
    return any(hasattr(p, "ds_id") for p in head.parameters())


@torch.no_grad()
def token_scores(model, unwrapped, labels: torch.Tensor, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``model(**inputs)``'s fp32 token losses and argmax predictions, each (batch, seq), position i scored against
    labels[:, i] (shifted; -100: loss 0): the evaluation's reading through the training forward, the head run inside
    it chunk by chunk as ``summed_loss`` runs it (or its logits whole where ``chunked_head`` says no). ``unwrapped``:
    the model under its wrappers, which names its output head."""
    head = unwrapped.get_output_embeddings()
    if not chunked_head(head, unwrapped.config):
        return scores_of(model(**inputs).logits, labels)

    def score(hidden, _empty):  # chunk by chunk: CHUNK x vocab fp32 logits at a time
        pieces = [
            scores_of(F.linear(hidden[:, i : i + CHUNK], head.weight, head.bias), labels[:, i : i + CHUNK])
            for i in range(0, labels.shape[1], CHUNK)
        ]
        return tuple(torch.cat(part, dim=1) for part in zip(*pieces, strict=True))

    return on_head_input(model, head, score, inputs)


def scores_of(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(losses, predictions), each (batch, seq), of logits (batch, seq, vocab) against labels (batch, seq)."""
    losses = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
    return losses, logits.argmax(-1)


def gathered(head):
    """A context holding a DeepSpeed ZeRO-3 head's whole weight (its parameters carry a ``ds_id``); else nothing."""
    if not partitioned(head):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(head.parameters()), modifier_rank=None)
