"""What the memory model reads: a Llama-like shape (``Shape``), one training step (``Step``: tokens, split, sharding,
precision, techniques), and the parameter counts of the shape."""

from __future__ import annotations

from dataclasses import dataclass


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
    or "cuda" (their autocast differs in the chunked loss). The techniques: ``offload`` (checkpointed layer inputs in
    host memory), ``tile`` (tokens per MLP tile of a process's tokens, 0: untiled; a tile of at least a process's
    tokens runs the MLP whole, as ``tiled_mlp`` does), ``lean`` (no copies of adapters' and norms' inputs in half
    precision). ``rope_type``: transformers' types and the package's frequency-level ones run sdpa; the package's
    attention-level ones its engine, whose backward makes more (``engine_attention``)."""

    tokens: int
    sequence_parallel: int = 1
    fsdp: int = 1
    weight_bytes: int = 2
    act_bytes: int = 2
    rank: int = 8
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    loss: str = "head"
    device: str = "cuda"
    offload: bool = False
    tile: int = 0
    lean: bool = False
    rope_type: str = "default"


def _default_tile(hidden: int, tokens: int) -> int:
    """ALST's tile for ``tokens`` a process holds: ceil(tokens / hidden) tiles of ceil(tokens / tiles) tokens, at
    least 1 each. Must agree with ``memory.tiled_mlp.default_tile`` (a test checks it); not imported, as that module
    needs torch's and transformers' modules loaded for a layer."""
    tiles = max(1, -(-tokens // hidden))
    return max(1, -(-tokens // tiles))


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
