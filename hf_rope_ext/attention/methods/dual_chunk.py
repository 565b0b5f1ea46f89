"""``dual_chunk``: Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language
Models", arXiv 2402.17463; authors' code HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``; Qwen2.5-1M configs
declare it as ``dual_chunk_attention_config`` = {chunk_size, local_size, original_max_position_embeddings}).

With c = ``chunk_size`` - ``local_size`` (the authors' ``chunk_len``), every key at n is rotated by n mod c and the
query's position depends on the chunk gap g = floor(m/c) - floor(n/c):
- g = 0 (intra-chunk): m mod c, so the pair keeps its exact distance m - n;
- g = 1 (successive chunk): min(m mod c + c, chunk_size);
- g >= 2 (inter-chunk): min(2c - 1, chunk_size), the successive query's position for the last row of a chunk
  (the code's ``qc_t[chunk_len - 1]``); that is chunk_size whenever local_size < c, as with the authors' defaults.
No distance exceeds chunk_size, so chunk_size must be below L0. Bands by chunk gap, declared with ``chunks``: the
reference engine runs them pair by pair, the fast engine as three standard attention pieces per chunk of queries
(``engine/chunk_bands.py``) on regular positions. The authors' defaults: chunk_size 3/4 L0 and local_size
L0/16 (``chunkqwen_attn_replace.py``; L0/8 in ``chunkllama_attn_replace.py``); their code also scales cos and sin
by 0.05 ln(N/L0) + 1 (an attention temperature, not part of this type).

Checked against HKUNLP/ChunkLlama ``chunkllama_attn_replace.py`` (``ChunkLlamaRotaryEmbedding``: ``q_t`` = m mod c,
``qc_t`` = min(m mod c + c, chunk_size), ``k_t`` = n mod c; ``forward``: the inter-chunk query rotated by
``qc_t[chunk_len - 1]``); the tests write each pair's relative position from these rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...frequencies.common import plain_frequencies
from ...frequencies.params import ORIGINAL_MAX
from ...types.declare import REQUIRED, Param, RopeMethod
from ...types.registry import register
from .form import AttentionForm, Band
from .params import FAMILIES, TEMPERATURE, check_family, pretrained_length

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads this module
    from torch import Tensor


def chunk(params: dict) -> int:
    """c = chunk_size - local_size: the length of a chunk, the period of the key positions."""
    return int(params["chunk_size"]) - int(params["local_size"])


def gap(m: Tensor, n: Tensor, params: dict) -> Tensor:
    """floor(m/c) - floor(n/c) [B, q, kv] for m [B, q, 1], n [B, 1, kv]."""
    c = chunk(params)
    return m.div(c, rounding_mode="floor") - n.div(c, rounding_mode="floor")


def intra(m: Tensor, n: Tensor, params: dict) -> Tensor:
    return gap(m, n, params) == 0


def successive(m: Tensor, n: Tensor, params: dict) -> Tensor:
    return gap(m, n, params) == 1


def inter(m: Tensor, n: Tensor, params: dict) -> Tensor:
    return gap(m, n, params) >= 2


def key_position(n: Tensor, params: dict) -> Tensor:
    return n.remainder(chunk(params))


def intra_query(m: Tensor, params: dict) -> Tensor:
    return m.remainder(chunk(params))


def successive_query(m: Tensor, params: dict) -> Tensor:
    return (m.remainder(chunk(params)) + chunk(params)).clamp(max=int(params["chunk_size"]))


def inter_query(m: Tensor, params: dict) -> Tensor:
    return m.new_full(m.shape, min(2 * chunk(params) - 1, int(params["chunk_size"])))


def authors_defaults(pretrained: int) -> dict:
    """The authors' chunk_size 3/4 L0 and local_size L0/16 (chunk_size at least 2, local_size below it)."""
    size = max(2, pretrained * 3 // 4)
    return {"chunk_size": size, "local_size": min(pretrained // 16, size - 1)}


def check_dual_chunk(params: dict, config) -> None:
    """local_size below chunk_size, chunk_size below L0 (no distance exceeds chunk_size)."""
    check_family(params, config)
    size, local = params.get("chunk_size"), params.get("local_size")
    if size is not None and local is not None and not local < size:
        raise ValueError(
            f"rope_parameters['local_size']={local!r} is not below rope_parameters['chunk_size']={size!r} for "
            "rope_type='dual_chunk': allowed 0 <= local_size < chunk_size"
        )
    limit = None if config is None else pretrained_length(params, config)
    if size is not None and limit is not None and not size < limit:
        raise ValueError(
            f"rope_parameters['chunk_size']={size!r} is not below the pretrained length L0={limit} "
            f"(original_max_position_embeddings, else max_position_embeddings): allowed chunk_size < {limit}"
        )


METHOD = register(
    RopeMethod(
        name="dual_chunk",
        kind="attention",
        frequencies=plain_frequencies,
        params={
            "chunk_size": Param(
                default=REQUIRED, kind="int", minimum=1, help="no distance exceeds it; below L0 (the authors' 3/4 L0)"
            ),
            "local_size": Param(
                default=REQUIRED,
                kind="int",
                minimum=0,
                help="chunks are chunk_size - local_size long; below chunk_size (the authors' L0/16)",
            ),
            "original_max_position_embeddings": ORIGINAL_MAX,
            **TEMPERATURE,
        },
        summary="Dual Chunk Attention: keys at n mod c, queries by chunk gap (intra, successive, inter)",
        check=check_dual_chunk,
        families=FAMILIES,
        example={"chunk_size": 12, "local_size": 4},
        defaults=lambda pretrained, factor: authors_defaults(pretrained),
        attention=AttentionForm(
            bands=(
                Band(intra, intra_query, key_position),
                Band(successive, successive_query, key_position),
                Band(inter, inter_query, key_position),
            ),
            chunks=chunk,
        ),
    )
)
