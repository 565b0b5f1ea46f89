"""What attention's backward makes, per token of a process's shard, beside the gradient of its output: sdpa's (the
frequency-level types, transformers' own attention) or the package's engine's (the attention-level types).

Both keep the same tensors for the backward: q, k and v (the engine's unrotated), the output and the fp32 log-sum-exp
per head (``moments.attention_bytes``); o_proj's adapter keeps a copy of the engine's output (:func:`output_copied`),
sdpa's output itself. sdpa's backward makes the gradients of q, k and v. The engine's banded plan
(``attention.engine.banded``: the two-band types, ReRoPE, leaky ReRoPE, Self-Extend, String, and Dual Chunk
Attention) makes more in ``BandedAttention.backward``: zeroed gradients per band and per key function that the spans
add into, then, in ``through_turns``, each band's queries and each key function's keys turned again under autograd
and autograd's own tensors while it takes their gradients back through the rotations: the backward's peak, the
loop's last span still bound. Counted in widths: q = heads x head_dim and kv (``moments.kv_width``) per shard token
(a process holds heads/N over the row), ``act_bytes`` each; an fp32 tensor over half the dims of a half-precision
width is one width. Self-Extend, leaky ReRoPE, String: 8 q + 7 kv in fp32, 11 q + 7 kv in half precision; ReRoPE
(far keys as given) 2 kv fewer; Dual Chunk Attention (three bands, one key function) 12 q + 5 kv, its last span
counted at its bound; sdpa: q + 2 kv. Measured alone (4 to 9 heads, 1 to 4 key heads, 2k to 8k tokens) and in the
steps of ``tests/test_memory_model.py``, in fp32 and bf16.

The banded plan is the CPU flash kernel's (``banded.applies``); on CUDA the pieces keep their own autograd, and the
one-band types (xPos, RoPER, the dynamic types on the engine) keep each chunk's pieces: neither is counted here
(``check_rope_type`` refuses them)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ...attention.engine.fast import plan_of
from ...attention.engine.two_band import FAR_BLOCK
from ...attention.methods.form import PLAIN, origin
from ...types import registry
from .shape import Shape, Step

FP32 = 4  # bytes of an fp32 element (``moments.FP32``, which imports this module)
# sdpa's backward: the gradients of q (a query-head width) and of k and v (a key width each)
SDPA_QUERY, SDPA_KEY = 1, 2
# per band, query-head wide: the gradient of its turned queries the spans add into (``d_q``, zeros_like) and its
# queries turned again under autograd (``through_turns``, the rotation's cat)
BAND_QUERY = 2
# query-head wide, while autograd takes a turned query's gradient back through the rotation: fp32, the gradients of
# the two pair members made whole (slice_backward of q[..., :r/2] and q[..., r/2:]) and two sums (the members', the
# query's: add); half precision, the gradient cast to fp32 (two widths), three fp32 products of it with cos or sin
# and its fp32 negation (a width each) and the query's summed gradient
TURN_BACK, TURN_BACK_HALF = 4, 7
# key wide: per key function, the gradient of its turned keys the spans add into (``d_k``, zeros_like); per key
# function that turns keys, the keys turned again under autograd (ReRoPE's far keys are read as given: none); the
# last span's keys (the loop's ``k``, a view) keeping its band's turned keys where they are turned
KEY_GRADIENT, KEY_TURNED, KEY_LAST = 1, 1, 1
# key wide: the values' gradient (``d_v``, zeros_like) and the keys' summed gradient (add)
VALUE_AND_SUM = 2
# query-head wide, the loop's last span, still bound: its turned queries and the flash backward's gradients of its
# queries, keys and values (keys expanded to the query heads). Two-band: the last far block's causal square, at most
# ``two_band.FAR_BLOCK`` rows and keys (bytes, not per token); chunks: the last chunk's rows against the keys before
# the chunk before it, together at most the row (per token)
LAST_SPAN, LAST_CHUNK_SPAN = 4, 2


@dataclass(frozen=True)
class Banded:
    """A type's banded plan: its bands (query rotations), key functions, those that turn keys, whether the last
    span's keys are turned, and whether its spans are chunks (Dual Chunk Attention) or a two-band plan's."""

    bands: int
    key_functions: int
    turned_keys: int
    last_turned: bool
    chunks: bool


@functools.cache
def engine_plan(rope_type: str) -> str | None:
    """The engine's plan for ``rope_type`` (``fast.plan_of``: "two", "chunks", "single"; "reference" where none
    applies), or None where sdpa runs: transformers' types and the package's frequency-level ones (a dynamic type
    runs the engine: the model's shapes are Llama's, a family the engine serves). KeyError for an unknown name."""
    if rope_type in registry.BUILTIN_TYPES:
        return None
    method = registry.get_method(rope_type)
    if method.kind != "attention" and not method.dynamic:
        return None
    return plan_of(method.attention if method.attention is not None else PLAIN) or "reference"


@functools.cache
def banded_plan(rope_type: str) -> Banded | None:
    """The banded plan of ``rope_type`` (a two-band or a chunked plan), or None (sdpa, or a plan not counted here,
    which :func:`check_rope_type` refuses)."""
    plan, form = engine_plan(rope_type), PLAIN
    if plan in ("two", "chunks"):
        form = registry.get_method(rope_type).attention
    if plan == "two":
        turned = form.far.key_position is not origin
        return Banded(2, 2, 1 + turned, turned, chunks=False)
    return Banded(len(form.bands), 1, 1, True, chunks=True) if plan == "chunks" else None


def check_rope_type(step: Step) -> None:
    """What is not counted: an unknown rope type (KeyError), an engine plan other than the banded ones (the one-band
    types keep each chunk's pieces), or the banded plan on CUDA (its pieces keep their own autograd there)."""
    plan = engine_plan(step.rope_type)
    if plan is not None and (banded_plan(step.rope_type) is None or step.device != "cpu"):
        raise ValueError(
            f"rope_type={step.rope_type!r} (the attention engine's {plan!r} plan) on device={step.device!r}: the "
            "model counts the engine's banded plan on the CPU only (``attention.engine.banded``: the two-band types "
            "and Dual Chunk Attention)"
        )


def output_copied(step: Step) -> bool:
    """Whether o_proj reads a copy of attention's output: the engine's (a banded plan's) is laid out [B, H, q, dv] and
    ``attend_layer``'s transpose(1, 2).contiguous() copies it, where sdpa's CPU kernel writes its output transposed
    already (no copy: o_proj's adapter keeps the tensor attention keeps)."""
    return banded_plan(step.rope_type) is not None


def query_widths(step: Step, plan: Banded) -> int:
    """Query-head widths the engine's backward holds at its peak, per token (the chunks' last span among them)."""
    turn_back = TURN_BACK if step.act_bytes == FP32 else TURN_BACK_HALF
    return BAND_QUERY * plan.bands + turn_back + LAST_CHUNK_SPAN * plan.chunks


def key_widths(plan: Banded) -> int:
    """Key widths the engine's backward holds at its peak, per token."""
    turned = KEY_TURNED * plan.turned_keys + KEY_LAST * plan.last_turned
    return KEY_GRADIENT * plan.key_functions + turned + VALUE_AND_SUM


def backward_bytes(s: Shape, step: Step, kv: int) -> int:
    """Per token: what attention's backward makes beside its output's gradient, ``kv`` key elements a token: sdpa's
    gradients of q, k and v, or the engine's tensors at its peak (:func:`query_widths`, :func:`key_widths`)."""
    q, plan = s.heads * s.head_dim, banded_plan(step.rope_type)
    if plan is None:
        return (SDPA_QUERY * q + SDPA_KEY * kv) * step.act_bytes
    return (query_widths(step, plan) * q + key_widths(plan) * kv) * step.act_bytes


def last_span_bytes(s: Shape, step: Step, tokens: int) -> int:
    """Bytes, not per token: a two-band plan's last span (:data:`LAST_SPAN` query-head wide tensors of at most
    ``FAR_BLOCK`` rows of the row, heads/N heads); 0 for sdpa and the chunks (counted per token)."""
    plan = banded_plan(step.rope_type)
    if plan is None or plan.chunks:
        return 0
    n = step.sequence_parallel
    return LAST_SPAN * min(FAR_BLOCK, tokens * n) * (s.heads // n) * s.head_dim * step.act_bytes
