"""A decode piece on the CPU split along its keys: the parts as the batch of one kernel call, merged by their
log-sum-exps (flash-decoding's split, for the CPU kernel).

torch's CPU flash kernel shares its work among threads by (batch row, head, query block). A decode piece has one
query block, and the engine groups the query heads of a kv head into rows of one problem, so a step of SmolLM2 (3 kv
heads) gives the kernel three tasks: two threads take two rounds, one thread idle in the second. Cut into S parts
of L = kv // S keys, laid as S batch rows of one call (views of the keys, no copy), the kernel has S times the tasks;
the last kv mod S keys are one more small piece. S (``parts``) gives at least TASKS tasks where the keys allow parts
of PART_KEYS: it depends on the shapes alone, not on the threads, so a result does not change with the machine's
thread count (and a call with TASKS heads or more is not split: its tasks already fill that many threads).
"""

from __future__ import annotations

import torch

from .piece import needs_grad

PART_KEYS = 1024  # the fewest keys of a part (SmolLM2's window of 2048 keys: 2 parts, 6 tasks for 2 threads)
MOST_ROWS = 64  # query rows of a piece split (a decode step's: its query heads per kv head, times its bands)
TASKS = 8  # the kernel's tasks (batch rows x heads) a split aims at: a few cores' worth (models of 7B parameters and
# more mostly have 8 kv heads: not split, where splitting would add operations and, on a few cores, no speed)


def parts(q: torch.Tensor, k: torch.Tensor, causal: bool) -> int:
    """How many parts the keys of q [B, H, c, d] against k [B, Hkv, kv, d] are split into (1: not split): a single
    batch row of a few query rows, no causal flag, no autograd, outside a compiled graph; enough parts for TASKS
    tasks, each of at least PART_KEYS keys."""
    c, kv = q.shape[2], k.shape[2]
    if q.shape[0] != 1 or c > MOST_ROWS or causal or needs_grad(q, k) or torch.compiler.is_compiling():
        return 1
    return max(1, min(kv // PART_KEYS, -(-TASKS // q.shape[1])))


def split_view(x: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """x [1, h, n >= count * length, e] -> [count, h, length, e]: part s holds rows [s * length, (s + 1) * length)
    (a view)."""
    return x[0].narrow(1, 0, count * length).unflatten(1, (count, length)).transpose(0, 1)


def merge_parts(out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [S, H, c, dv], lse [S, H, c] float32) of S disjoint key sets -> the union's ([1, H, c, dv] in out's dtype,
    [1, H, c]). Every lse is finite (no mask, or one hiding with a finite minimum: ``split_parts``). By amax, not
    ``torch.logsumexp``, whose CPU path here runs Python reference code (75 us a call)."""
    top = lse.amax(0, keepdim=True)  # [1, H, c]
    weights = torch.exp(lse - top)  # [S, H, c] float32, the largest 1
    total = weights.sum(0, keepdim=True)
    merged = (out * weights[..., None]).sum(0, keepdim=True) / total[..., None]
    return merged.to(out.dtype), top + torch.log(total)


def split_parts(flash, q, k, v, mask, scale: float, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [P, H, c, dv], lse [P, H, c] float32) of ``flash(q, k, v, 0.0, False, attn_mask=mask, scale=scale)`` with
    the keys in ``count`` parts, unmerged: P = count, or count + 1 with the keys left over (module docstring); q [1, H,
    c, d], k / v [1, Hkv, kv, *], mask None or [1, 1 or H, c, kv] hiding with a finite minimum (a row hidden from a
    whole part by -inf would take lse 0 there, as if it saw keys scoring 0)."""
    kv = k.shape[2]
    length = kv // count
    head = count * length
    split_mask = None if mask is None else split_view(mask.transpose(2, 3), count, length).transpose(2, 3)
    batch = q.expand(count, *q.shape[1:])
    out, lse = flash(batch, split_view(k, count, length), split_view(v, count, length), 0.0, False,
                     attn_mask=split_mask, scale=scale)[:2]  # fmt: skip
    if head < kv:  # the last keys: one more part
        rest_mask = None if mask is None else mask.narrow(3, head, kv - head)
        rest = flash(q, k.narrow(2, head, kv - head), v.narrow(2, head, kv - head), 0.0, False,
                     attn_mask=rest_mask, scale=scale)[:2]  # fmt: skip
        out, lse = torch.cat((out, rest[0])), torch.cat((lse, rest[1]))
    return out, lse


def split_flash(flash, q, k, v, mask, scale: float, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``split_parts`` merged: the (out [1, H, c, dv], lse [1, H, c]) of the whole piece."""
    return merge_parts(*split_parts(flash, q, k, v, mask, scale, count))
