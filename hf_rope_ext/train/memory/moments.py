"""The activations one process holds at each moment of a LoRA step, term by term (``model`` takes the largest): the
MLP's backward, the post-attention norm's, the attention's, and the head loss's forward. Every constant names the
tensors it counts; ``model``'s docstring says why these four moments bound the step."""

from __future__ import annotations

from ..head_loss import chunk_tokens
from ..loss import CHUNK as CHUNKED_LOSS_TOKENS  # the benchmark's chunked loss: tokens per chunk
from .engine_attention import backward_bytes, last_span_bytes, output_copied
from .norm_chunks import chunk_peak_bytes
from .shape import Shape, Step

FP32 = 4  # bytes of an fp32 element: a norm's copy and reciprocal RMS, the head loss's logits and gradients
LORA_BYTES = 4  # peft's adapter weights stay fp32 on a half-precision base (``train.lora.apply_lora``)
INDEX_BYTES = 8  # int64: the shifted labels and the all-ones attention mask ``train.loop.forward_loss`` makes
ROPE_TABLES = 2  # the rotary cos and sin (head_dim wide each) every layer reads
# layer inputs on the device under ``offload`` at a layer's backward (``offload.HostPool``):
FIRST_INPUT = 1  # the first layer's input, the embeddings' output: transformers' ``enable_input_require_grads``
# makes it a leaf that requires grad, so its AccumulateGrad node holds it through the whole backward, its host copy
# beside it; it is the only layer input on the device at the loss
PREFETCHED = 1  # ``HostPool.unpack``: while a layer recomputes, the previous layer's input is fetched ahead
OWN_INPUT = 1  # the recomputed layer's input, fetched back: its input norm keeps it unless it copies it to fp32
# fp32 hidden-wide tensors a Llama RMSNorm's backward holds at its peak (PowBackward0, ``derivatives.yaml``): the
# gradient of h from h * r (waiting for the one from h.pow(2) at h's fp32 copy), the mean's gradient expanded,
# h.pow(1), 2 * h.pow(1) and their product with the gradient. In fp32 h is the norm's input itself: the gradient of
# h from h * r is summed at once into the gradient waiting at the residual sum (the output gradient), one fewer.
NORM_WORK, NORM_WORK_FP32 = 5, 4
# hidden-wide half-precision tensors ``lean_norm.LeanRMSNorm.backward`` holds over the whole row: the incoming gradient
# (held by the engine through the call) and the input gradient it fills chunk by chunk; its fp32 temporaries are one
# chunk's (``norm_chunks.chunk_peak_bytes``, bounded by ``norm_chunks.CHUNK_BYTES`` whatever the row). With the weight
# trained its gradient comes first: ``normed`` (half, the whole row, the product made in its place) and a chunk's two
# fp32 temporaries, less than the input gradient's, freed before it
LEAN_NORM_HALF = 2
# intermediate-wide tensors at the MLP's product's gradient (MulBackward0 of act(gate) * up): gate, act(gate) and up
# kept, the product's gradient and the gradients of its two factors
MLP_WORK = 6
# the recompute that ends at down_proj's adapter (half precision, with copies): gate, act(gate), up, the product
MLP_FORWARD = 4
# the tensor each adapter target reads (adapters reading one tensor share it in fp32, or in half precision if lean)
READS = dict.fromkeys(("q_proj", "k_proj", "v_proj"), "normed") | dict.fromkeys(("gate_proj", "up_proj"), "mlp_in")
READS |= {"o_proj": "attention", "down_proj": "mlp_mid"}


def copies(step: Step) -> bool:
    """Whether the step makes copies: in half precision without ``lean`` each adapter casts its input to fp32 (and
    autocast casts that back: a half-precision copy kept), and each RMSNorm keeps an fp32 copy of its input."""
    return step.act_bytes != FP32 and not step.lean


def layer_inputs(s: Shape, step: Step) -> int:
    """Layer inputs on the device at a layer's backward. Without offload every layer's checkpointed input (the
    backward starts at the last layer, all of them still held). With offload: :data:`FIRST_INPUT`, the
    :data:`PREFETCHED` one (no layer before the first) and the layer's :data:`OWN_INPUT` where its input norm keeps
    it (fp32, or ``lean``; an fp32 copy frees it once recomputed)."""
    if not step.offload:
        return s.layers
    return FIRST_INPUT + PREFETCHED * (s.layers > 1) + OWN_INPUT * (not copies(step))


def checkpoint_bytes(s: Shape, step: Step, inputs: int) -> int:
    """Per token: ``inputs`` layer inputs (hidden wide) and the rotary cos and sin the layers share."""
    return inputs * s.hidden * step.act_bytes + ROPE_TABLES * s.head_dim * step.act_bytes


def host_bytes(s: Shape, step: Step) -> int:
    """Per token in host memory: with ``offload`` every layer's checkpointed input; else nothing."""
    return s.layers * s.hidden * step.act_bytes if step.offload else 0


def norm_kept_bytes(s: Shape, step: Step, own_input: bool) -> int:
    """Per token, what one RMSNorm keeps for its backward: its fp32 reciprocal RMS (one per token) and its input:
    with :func:`copies` an fp32 copy of it, else the input itself (counted here where ``own_input``; the input
    norm's is a layer input, counted by :func:`checkpoint_bytes`)."""
    if copies(step):
        return FP32 + s.hidden * FP32
    return FP32 + s.hidden * step.act_bytes * own_input


def adapter_bytes(s: Shape, step: Step, tensor: str, kept_anyway: bool = False) -> int:
    """Per token: what the adapters reading ``tensor`` (:data:`READS`) keep for their weights' gradients: each one's
    A output (rank wide, kept by its B) and their input, with :func:`copies` a half-precision copy each, else the
    tensor itself once, shared (none where it is ``kept_anyway``)."""
    width = {"normed": s.hidden, "attention": s.heads * s.head_dim, "mlp_in": s.hidden, "mlp_mid": s.intermediate}
    count = sum(READS[t] == tensor for t in step.targets)
    inputs = count if copies(step) else int(count > 0 and not kept_anyway)
    return (inputs * width[tensor] + count * step.rank) * step.act_bytes


def kv_width(s: Shape, step: Step) -> int:
    """Per token of a process's shard: the key (or value) elements its attention holds, the row's key-value heads
    over N of them; where N exceeds the key-value heads each head comes as N / kv copies (``attention.ulysses``), so a
    process holds one head of the whole row: max(kv, N) heads per shard token."""
    return max(s.kv_heads, step.sequence_parallel) * s.head_dim


def attention_bytes(s: Shape, step: Step) -> int:
    """Per token: the recomputed attention's rotated q and k (the engine's unrotated), v, its output, and the fp32
    log-sum-exp per head."""
    q, kv = s.heads * s.head_dim, kv_width(s, step)
    return (2 * q + 2 * kv) * step.act_bytes + s.heads * FP32


def attention_kept_bytes(s: Shape, step: Step) -> int:
    """Per token: what the recomputed layer keeps for its attention half's backward: the input norm's
    (:func:`norm_kept_bytes`), the q, k, v adapters' and o_proj's (whose input is attention's output, kept anyway,
    unless the all-to-all made it anew, N > 1, or the engine's output was copied: ``engine_attention.output_copied``),
    and attention's (:func:`attention_bytes`)."""
    o_input_kept = step.sequence_parallel == 1 and not output_copied(step)
    return (
        norm_kept_bytes(s, step, own_input=False)
        + adapter_bytes(s, step, "normed")
        + adapter_bytes(s, step, "attention", kept_anyway=o_input_kept)
        + attention_bytes(s, step)
    )


def output_gradient_bytes(s: Shape, step: Step) -> int:
    """Per token: the gradient arriving at the recomputed layer's output (held until the residual's is summed)."""
    return s.hidden * step.act_bytes


def layer_kept_bytes(s: Shape, step: Step) -> int:
    """Per token, at the MLP's and the post-attention norm's backward: the layer inputs (:func:`layer_inputs`), the
    gradient at the layer's output, the attention half's tensors and the post-attention norm's (its input, the
    residual sum, is no layer input)."""
    return (
        checkpoint_bytes(s, step, layer_inputs(s, step))
        + output_gradient_bytes(s, step)
        + attention_kept_bytes(s, step)
        + norm_kept_bytes(s, step, own_input=True)
    )


def product_gradient_bytes(s: Shape, step: Step, input_kept: bool = False) -> int:
    """Per token of the MLP (or of a tile) at its product's gradient: :data:`MLP_WORK` intermediate-wide tensors and
    what the gate and up adapters keep (their shared input counted elsewhere where ``input_kept``); down_proj's
    adapter has run its backward and freed its own."""
    return MLP_WORK * s.intermediate * step.act_bytes + adapter_bytes(s, step, "mlp_in", kept_anyway=input_kept)


def cast_recompute_bytes(s: Shape, step: Step, input_kept: bool = False) -> int:
    """Per token of the MLP (or of a tile), with :func:`copies` and an adapter on down_proj: the layer's recompute
    ends at that adapter's forward (the last tensor the layer saves is its A output), where :data:`MLP_FORWARD`
    intermediate-wide tensors, the adapter's fp32 copy of the product, base down_proj's output and the scaled output
    gradient waiting at its B (both hidden wide) are alive at once, beside what the adapters keep (down_proj's: the
    half-precision cast of that copy and its A output). 0 where the step makes no copies or leaves down_proj alone:
    then the product's gradient (:func:`product_gradient_bytes`) is the MLP's peak."""
    if not copies(step) or "down_proj" not in step.targets:
        return 0
    forward = (MLP_FORWARD * step.act_bytes + FP32) * s.intermediate + 2 * s.hidden * step.act_bytes
    return forward + adapter_bytes(s, step, "mlp_in", kept_anyway=input_kept) + adapter_bytes(s, step, "mlp_mid")


def mlp_work_bytes(s: Shape, step: Step, tokens: int) -> int:
    """The MLP's part of its backward's peak for ``tokens`` tokens, untiled: the product's gradient, or the recompute
    at down_proj's adapter with what the layer's forward still holds there, kept by nothing else when the step makes
    copies: the residual sum and the MLP's input, and with ``offload`` the layer's input fetched back (the
    recompute's argument; ``layer_inputs`` counts it only where the input norm keeps it)."""
    recompute = cast_recompute_bytes(s, step)
    if recompute:
        recompute += (2 + OWN_INPUT * step.offload) * s.hidden * step.act_bytes
    return tokens * max(product_gradient_bytes(s, step), recompute)


def tiled_mlp_bytes(s: Shape, step: Step, tokens: int) -> int:
    """The tiled MLP's part for ``tokens`` tokens (``tiled_mlp.tile_outputs``, tiles of ``step.tile``, the last one
    shorter): the tiles' checkpoints keep the MLP's input (hidden wide, every token); the backward runs the last tile
    first, and each tile's input gradient waits for the split's backward. The largest of: tile 1, the last but one
    run (the input, the gradients of all but two tiles' tokens, its product's gradient); tile 0, the last (the input
    freed once it has recomputed unless the gate and up adapters keep it, no copies; the gradients of all but one
    tile's tokens); and with :func:`cast_recompute_bytes` tile 0's recompute (the input, the recompute's argument)."""
    size = min(step.tile, tokens)
    row = s.hidden * step.act_bytes  # one token of the MLP's input, or of its gradient
    view_kept = not copies(step) and any(READS[t] == "mlp_in" for t in step.targets)
    per_token = product_gradient_bytes(s, step, input_kept=True)
    tile_1 = tokens * row + max(0, tokens - 2 * size) * row + min(size, tokens - size) * per_token
    tile_0 = tokens * row * view_kept + (tokens - size) * row + size * per_token
    recompute = cast_recompute_bytes(s, step, input_kept=True)
    tile_0_recompute = tokens * row + (tokens - size) * row + size * recompute if recompute else 0
    return max(tile_1, tile_0, tile_0_recompute)


def mlp_moment(s: Shape, step: Step, tokens: int) -> int:
    """The MLP's backward in the recomputed layer: :func:`layer_kept_bytes` and the MLP's working set, tiled
    (:func:`tiled_mlp_bytes`) when a tile is shorter than the process's tokens."""
    work = tiled_mlp_bytes(s, step, tokens) if 0 < step.tile < tokens else mlp_work_bytes(s, step, tokens)
    return tokens * layer_kept_bytes(s, step) + work


def runs_lean_norm(step: Step) -> bool:
    """Whether the step's RMSNorms run ``lean_norm.LeanRMSNorm``: ``lean`` in half precision (an fp32 input runs the
    stock ops)."""
    return step.lean and step.act_bytes != FP32


def norm_work_bytes(s: Shape, step: Step) -> int:
    """Per token: an RMSNorm's backward's row-wide tensors at its peak beside the output gradient: :data:`NORM_WORK`
    fp32 temporaries (:data:`NORM_WORK_FP32` in fp32), or where :func:`runs_lean_norm` :data:`LEAN_NORM_HALF` half
    ones (its fp32 temporaries are a chunk's: :func:`norm_chunk_bytes`)."""
    if step.act_bytes == FP32:
        return s.hidden * NORM_WORK_FP32 * FP32
    if runs_lean_norm(step):
        return s.hidden * LEAN_NORM_HALF * step.act_bytes
    return s.hidden * NORM_WORK * FP32


def norm_chunk_bytes(s: Shape, step: Step, tokens: int) -> int:
    """The bytes, not per token, of the lean norm's backward's fp32 temporaries for a row of ``tokens``: its largest
    chunk's (``norm_chunks.chunk_peak_bytes``, the rule the code runs); 0 for the stock norm."""
    return chunk_peak_bytes(tokens, s.hidden) if runs_lean_norm(step) else 0


def norm_moment(s: Shape, step: Step, tokens: int) -> int:
    """The post-attention norm's backward: :func:`layer_kept_bytes` (the MLP's tensors freed), the norm's row-wide
    tensors (:func:`norm_work_bytes`) and, lean, one chunk's temporaries (:func:`norm_chunk_bytes`)."""
    return tokens * (layer_kept_bytes(s, step) + norm_work_bytes(s, step)) + norm_chunk_bytes(s, step, tokens)


def attention_moment(s: Shape, step: Step, tokens: int) -> int:
    """Attention's backward (``_scaled_dot_product_*_backward``, or the engine's): the layer inputs, the gradient at
    the residual sum (held until the layer input's is summed), the input norm's, the q, k, v adapters' and attention's
    tensors (o_proj's adapter has freed its own), the gradient of attention's output and what the backward makes
    (``engine_attention``: sdpa's gradients of q, k and v, or the engine's tensors and its last span)."""
    q, kv, a = s.heads * s.head_dim, kv_width(s, step), step.act_bytes
    kept = norm_kept_bytes(s, step, own_input=False) + adapter_bytes(s, step, "normed") + attention_bytes(s, step)
    gradients = output_gradient_bytes(s, step) + q * a + backward_bytes(s, step, kv)
    inputs = checkpoint_bytes(s, step, layer_inputs(s, step))
    return tokens * (inputs + kept + gradients) + last_span_bytes(s, step, tokens)


def head_logits_bytes(s: Shape, tokens: int) -> int:
    """``head_loss.FusedHeadLoss.forward`` at the second chunk's log-softmax: the first chunk's gradient (its
    log-softmax made the softmax in place, still bound in the loop), the second's fp32 logits and log-softmax; one
    chunk: its fp32 logits and log-softmax."""
    chunk = chunk_tokens(tokens, s.hidden, s.vocab)
    if tokens <= chunk:
        return 2 * tokens * s.vocab * FP32
    return (chunk + 2 * min(chunk, tokens - chunk)) * s.vocab * FP32


def loss_bytes(s: Shape, step: Step, tokens: int) -> int:
    """The loss's own tensors for ``tokens`` tokens: the final norm's (:func:`norm_kept_bytes`; its input is the last
    layer's output), its output (the head's input), and the loss's."""
    a, d, v, norm = step.act_bytes, s.hidden, s.vocab, norm_kept_bytes(s, step, own_input=True)
    if step.loss == "head":  # the fp32 gradient for the head's input, the logits, an fp32 copy of a half head;
        # the shifted labels and the attention mask
        head = head_logits_bytes(s, tokens) + v * d * FP32 * (step.weight_bytes != FP32)
        return tokens * (norm + d * a + d * FP32 + 2 * INDEX_BYTES) + head
    if step.loss == "chunked":  # at a chunk's backward, beside the head's weight cast for the product and kept:
        # CUDA: the log-softmax in the logits' dtype (cross_entropy passes it, autocast keeps it), nll_loss's fp32
        # copy of it and the nll gradient; a CPU's autocast casts the logits to fp32 first: the log-softmax, the nll
        # gradient and the log-softmax's gradient, all fp32
        logits = CHUNKED_LOSS_TOKENS * v * (8 + (4 if step.device == "cpu" else a))
        return tokens * (norm + 2 * d * a) + logits + v * d * a * (step.weight_bytes != 4)
    raise ValueError(f"loss={step.loss!r} is not allowed; expected 'head' or 'chunked'")


def loss_moment(s: Shape, step: Step, tokens: int) -> int:
    """The loss: every layer's checkpointed input (with ``offload`` the first layer's only) and
    :func:`loss_bytes`."""
    inputs = FIRST_INPUT if step.offload else s.layers
    return tokens * checkpoint_bytes(s, step, inputs) + loss_bytes(s, step, tokens)


def moments(s: Shape, step: Step, tokens: int) -> dict[str, int]:
    """The activations at each moment of the step for a process's ``tokens``, by name."""
    return {
        "mlp": mlp_moment(s, step, tokens),
        "norm": norm_moment(s, step, tokens),
        "attention": attention_moment(s, step, tokens),
        "loss": loss_moment(s, step, tokens),
    }
