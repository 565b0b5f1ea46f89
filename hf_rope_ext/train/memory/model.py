"""The bytes one process holds at the peak of one LoRA step (``finetune --grad-checkpointing``), term by term, from a
Llama-like shape, the row's tokens, the sequence-parallel split N, FSDP2 sharding over P processes and the techniques
that hold less (``--offload-checkpoints``, ``--tiled-mlp``, ``--no-copies``). Every term is counted from what the code
keeps (named tensors, each counted by a function below, checked against ``util.memory_peak.LivePeak``); nothing is
fitted.

The activations' peak is the largest of four moments of the step (:func:`moments`), each the layer inputs on the
device (:func:`checkpoint_bytes`) and its own tensors:

- **mlp**, the MLP's backward in the recomputed layer (:func:`mlp_moment`): what the layer keeps for its backward
  and the MLP's working set, six intermediate-wide tensors at its product's gradient (tiled: one tile's, beside the
  MLP's input and the input gradients of the tiles done);
- **norm**, the post-attention RMSNorm's backward (:func:`norm_moment`): what the attention half keeps, the norm's
  input (an fp32 copy in half precision) and its backward's fp32 temporaries, five hidden-wide: the peak once the MLP
  is tiled; with ``lean`` the half input, two half hidden-wide tensors over the row and one chunk's fp32 temporaries
  (``norm_chunks.chunk_peak_bytes``, a constant number of bytes), about what the tiled MLP's backward holds;
- **attention**, attention's backward (:func:`attention_moment`): its saved states, the gradients of its output and
  of q, k and v; for an attention-level type (``Step.rope_type``) the engine's backward, which makes more
  (``engine_attention``: the peak once the MLP is tiled);
- **loss**, the head loss's forward (:func:`loss_moment`): the final norm's, the head's input and its fp32 gradient,
  a chunk's fp32 gradient beside the next chunk's fp32 logits and log-softmax.

The step's other moments hold less than one of these: the input norm's backward what the post-attention norm's
holds less the attention's tensors; the final norm's and the loss's backward less than the loss's forward; a forward
or a recompute fewer temporaries than the backward after it (at most four intermediate-wide tensors, a norm's two
fp32 hidden-wide ones, or with ``lean`` its output and a chunk's), except the recompute that ends at down_proj's
adapter in half precision, counted in **mlp**.
Under sequence parallelism a process holds tokens/N of each; attention's q, k, v and output, heads/N over the whole
row after the all-to-all, are the same bytes. With ``offload`` the checkpointed inputs wait in host memory (``host``
in :func:`predict`). The adapters' gradients count whole (``adapter_grads``: all of them exist at the optimizer's
step), though at a layer's backward only the layers done have theirs. Left out: allocator caching and
fragmentation, the CUDA context, NCCL buffers, kernels' scratch memory, the adapters' weights cast to half precision
under autocast (rank x (in + out) each), batches of more than one row. ``benchmarks/memory_model.py`` sets the
predictions against every measured step; ``planner`` searches the techniques and splits for a number of GPUs.
"""

from __future__ import annotations

from ...attention.ulysses import allowed_sizes
from .engine_attention import check_rope_type
from .moments import LORA_BYTES, READS, host_bytes, moments
from .shape import Shape, Step, _default_tile, layer_parameters, lora_parameters, root_parameters

__all__ = ["Shape", "Step", "_default_tile", "check", "layer_parameters", "lora_parameters", "predict"]
__all__ += ["root_parameters", "total", "weight_bytes"]


def weight_bytes(s: Shape, step: Step) -> float:
    """Frozen weights: all of them, or under FSDP2 a 1/P shard plus what is gathered at once: the root unit (kept
    gathered through the step) and two layers (the one running and the one prefetched)."""
    whole = (s.layers * layer_parameters(s) + root_parameters(s)) * step.weight_bytes
    if step.fsdp == 1:
        return whole
    return whole / step.fsdp + (root_parameters(s) + 2 * layer_parameters(s)) * step.weight_bytes


def check(s: Shape, step: Step) -> None:
    """What the code refuses: an N the heads do not allow (``attention.ulysses.allowed_sizes``) or that does not
    divide the row; unknown targets, devices; a negative tile; what the model does not count (the attention engine
    on CUDA, its one-band types, an unknown rope type: ``engine_attention.check_rope_type``)."""
    n, allowed = step.sequence_parallel, allowed_sizes(s.heads, s.kv_heads)
    if n not in allowed or step.tokens % n:
        raise ValueError(
            f"sequence_parallel={n} must divide the {step.tokens} tokens and be one of {allowed} (it divides the "
            f"{s.heads} query heads and divides or is a multiple of the {s.kv_heads} key-value heads)"
        )
    unknown = [t for t in step.targets if t not in READS]
    if unknown or step.device not in ("cpu", "cuda") or step.fsdp < 1 or step.tile < 0:
        raise ValueError(
            f"targets {unknown} (allowed {list(READS)}), device={step.device!r}, fsdp={step.fsdp} >= 1, "
            f"tile={step.tile} >= 0"
        )
    check_rope_type(step)


def predict(s: Shape, step: Step) -> dict:
    """The peak's terms in bytes for one process: frozen weights, adapter weights, their gradients, AdamW's two
    moments (fp32, sharded 1/P under FSDP2), activations (the largest moment, named in ``peak_at``; every moment in
    ``moments``); and ``host``, the bytes the process keeps in host memory (offloaded checkpoints), not part of
    :func:`total`."""
    check(s, step)
    tokens = step.tokens // step.sequence_parallel
    adapter = lora_parameters(s, step.rank, step.targets) * LORA_BYTES / step.fsdp
    at = moments(s, step, tokens)
    peak = max(at, key=at.get)
    return {
        "weights": weight_bytes(s, step),
        "adapter": adapter,
        "adapter_grads": adapter,
        "optimizer": 2 * adapter,
        "activations": at[peak],
        "peak_at": peak,
        "moments": at,
        "host": tokens * host_bytes(s, step),
    }


def total(terms: dict, parts=("weights", "adapter", "adapter_grads", "optimizer", "activations")) -> float:
    """The sum of the named terms of :func:`predict` (by default all: what ``torch.cuda.max_memory_allocated`` sees)."""
    return sum(terms[p] for p in parts)
