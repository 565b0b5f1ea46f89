"""The bytes one process holds at the peak of one LoRA step (``finetune --grad-checkpointing``), term by term, from a
Llama-like shape, the row's tokens, the sequence-parallel split N and FSDP2 sharding over P processes. Every term is
counted from what the code keeps; nothing is fitted. The peak is the larger of two moments: **a layer's backward**
(every layer's checkpointed input, and the recomputed layer at its MLP's backward, a Llama's largest working set) and
**the loss** (the checkpointed inputs, the final norm's input and output, one chunk's logits). Under sequence
parallelism a process holds tokens/N of each; attention's q, k, v and output, heads/N over the whole row after the
all-to-all, are the same bytes. Left out: allocator caching and fragmentation, the CUDA context, NCCL buffers, kernels'
scratch memory, the attention's own backward (below the MLP's where intermediate >= 3 x hidden), batches of more than
one row. ``benchmarks/memory_model.py`` sets the predictions against every measured step.
"""

from __future__ import annotations

from dataclasses import dataclass

from .head_loss import chunk_tokens
from .loss import CHUNK as CHUNKED_LOSS_TOKENS  # the benchmark's chunked loss: tokens per chunk

LORA_BYTES = 4  # peft's adapter weights stay fp32 on a half-precision base (``train.lora.apply_lora``)
NORM_BYTES = 4  # a Llama RMSNorm computes in fp32 and keeps its fp32 input for the backward
# the tensor each adapter target reads (adapters reading one tensor share it in fp32)
READS = dict.fromkeys(("q_proj", "k_proj", "v_proj"), "normed") | dict.fromkeys(("gate_proj", "up_proj"), "mlp_in")
READS |= {"o_proj": "attention", "down_proj": "mlp_mid"}


@dataclass(frozen=True)
class Shape:
    """A Llama-like decoder, sizes as in its config; ``tied``: the output head is the input embeddings' weight."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True


@dataclass(frozen=True)
class Step:
    """One step on a row of ``tokens`` split over ``sequence_parallel`` processes, the weights sharded over ``fsdp``
    (1: whole); bytes per element of the frozen weights and of the activations (2: bf16 under autocast); ``loss``:
    "head" (``train.head_loss``, finetune's) or "chunked" (``train.loss.chunked_causal_lm_loss``); ``device``: "cpu"
    or "cuda" (their autocast differs in the chunked loss)."""

    tokens: int
    sequence_parallel: int = 1
    fsdp: int = 1
    weight_bytes: int = 2
    act_bytes: int = 2
    rank: int = 8
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    loss: str = "head"
    device: str = "cuda"


def layer_parameters(s: Shape) -> int:
    """One decoder layer: q, k, v, o, the gated MLP, two norms."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return s.hidden * (2 * q + 2 * kv) + 3 * s.hidden * s.intermediate + 2 * s.hidden


def root_parameters(s: Shape) -> int:
    """What sits outside the layers: the embeddings, the head (when untied), the final norm."""
    return s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden


def lora_parameters(s: Shape, rank: int, targets) -> int:
    """A and B of every targeted linear layer: rank x (in + out) each."""
    q, kv, d, i = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.hidden, s.intermediate
    sizes = {"q_proj": d + q, "k_proj": d + kv, "v_proj": d + kv, "o_proj": q + d}
    sizes |= {"gate_proj": d + i, "up_proj": d + i, "down_proj": i + d}
    return s.layers * rank * sum(sizes[t] for t in targets)


def weight_bytes(s: Shape, step: Step) -> float:
    """Frozen weights: all of them, or under FSDP2 a 1/P shard plus what is gathered at once: the root unit (kept
    gathered through the step) and two layers (the one running and the one prefetched)."""
    whole = (s.layers * layer_parameters(s) + root_parameters(s)) * step.weight_bytes
    if step.fsdp == 1:
        return whole
    return whole / step.fsdp + (root_parameters(s) + 2 * layer_parameters(s)) * step.weight_bytes


def adapter_input_bytes(s: Shape, step: Step) -> int:
    """Per token: the inputs the adapters keep for their weights' gradients. Under autocast each adapter casts its
    input to fp32 and autocast casts it back: a copy per adapter. In fp32 adapters on one tensor share it, and
    o_proj's input is attention's output (kept anyway) unless the all-to-all made it anew (N > 1). down_proj's is
    freed before the MLP's peak."""
    cast, total = step.act_bytes != LORA_BYTES, 0
    for tensor, width in {"normed": s.hidden, "attention": s.heads * s.head_dim, "mlp_in": s.hidden}.items():
        count = sum(READS[t] == tensor for t in step.targets)
        kept_anyway = tensor == "attention" and step.sequence_parallel == 1
        total += (count if cast else int(count > 0 and not kept_anyway)) * width * step.act_bytes
    return total + len(step.targets) * step.rank * step.act_bytes  # each adapter's A output, kept by its B


def layer_working_bytes(s: Shape, step: Step) -> int:
    """Per token: what the recomputed layer holds at its MLP's backward."""
    a, q, kv = step.act_bytes, s.heads * s.head_dim, s.kv_heads * s.head_dim
    mlp = 6 * s.intermediate * a  # gate, up and silu(gate) kept; the gradients of their product and its two factors
    attention = (2 * q + 2 * kv) * a + s.heads * 4  # rotated q and k, v, the output; the fp32 log-sum-exp per head
    # the post-attention norm's fp32 input; the input norm's (in fp32 the layer input itself, a checkpoint)
    norms = s.hidden * NORM_BYTES * (1 + (a != NORM_BYTES))
    gradient = s.hidden * a  # the gradient arriving at the layer's output
    return mlp + attention + norms + gradient + adapter_input_bytes(s, step)


def checkpoint_bytes(s: Shape, step: Step) -> int:
    """Per token: every layer's checkpointed input, and the rotary cos and sin the layers share."""
    return s.layers * s.hidden * step.act_bytes + 2 * s.head_dim * step.act_bytes


def loss_bytes(s: Shape, step: Step, tokens: int) -> int:
    """The loss's own tensors for ``tokens`` tokens: the final norm's fp32 input, its output (the head's input), the
    gradient for it, and one chunk of logits."""
    a, d, v = step.act_bytes, s.hidden, s.vocab
    if step.loss == "head":  # fp32 logits and log-softmax (the gradient made in place); an fp32 copy of a bf16 head
        chunk = chunk_tokens(tokens, d, v)
        return tokens * (d * NORM_BYTES + d * a + d * 4) + 8 * chunk * v + v * d * 4 * (step.weight_bytes != 4)
    if step.loss == "chunked":  # at a chunk's backward, beside the head's weight cast for the product and kept:
        # CUDA: the log-softmax in the logits' dtype (cross_entropy passes it, autocast keeps it), nll_loss's fp32
        # copy of it and the nll gradient; a CPU's autocast casts the logits to fp32 first: the log-softmax, the nll
        # gradient and the log-softmax's gradient, all fp32
        logits = CHUNKED_LOSS_TOKENS * v * (8 + (4 if step.device == "cpu" else a))
        return tokens * (d * NORM_BYTES + 2 * d * a) + logits + v * d * a * (step.weight_bytes != 4)
    raise ValueError(f"loss={step.loss!r} is not allowed; expected 'head' or 'chunked'")


def check(s: Shape, step: Step) -> None:
    """What the code refuses: N not dividing the heads or the row; unknown targets, devices."""
    n = step.sequence_parallel
    if n < 1 or s.heads % n or s.kv_heads % n or step.tokens % n:
        raise ValueError(
            f"sequence_parallel={n} must divide the {s.heads} query and {s.kv_heads} key-value heads and the "
            f"{step.tokens} tokens"
        )
    unknown = [t for t in step.targets if t not in READS]
    if unknown or step.device not in ("cpu", "cuda") or step.fsdp < 1:
        raise ValueError(f"targets {unknown} (allowed {list(READS)}), device={step.device!r}, fsdp={step.fsdp} >= 1")


def predict(s: Shape, step: Step) -> dict:
    """The peak's terms in bytes for one process: frozen weights, adapter weights, their gradients, AdamW's two
    moments (fp32, sharded 1/P under FSDP2), activations (the larger moment, named in ``peak_at``)."""
    check(s, step)
    tokens = step.tokens // step.sequence_parallel
    adapter = lora_parameters(s, step.rank, step.targets) * LORA_BYTES / step.fsdp
    layer = tokens * (checkpoint_bytes(s, step) + layer_working_bytes(s, step))
    loss = tokens * checkpoint_bytes(s, step) + loss_bytes(s, step, tokens)
    return {
        "weights": weight_bytes(s, step),
        "adapter": adapter,
        "adapter_grads": adapter,
        "optimizer": 2 * adapter,
        "activations": max(layer, loss),
        "peak_at": "layer" if layer >= loss else "loss",
    }


def total(terms: dict, parts=("weights", "adapter", "adapter_grads", "optimizer", "activations")) -> float:
    """The sum of the named terms of :func:`predict` (by default all: what ``torch.cuda.max_memory_allocated`` sees)."""
    return sum(terms[p] for p in parts)
