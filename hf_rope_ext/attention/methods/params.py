"""Parameter specs and cross-parameter checks shared by the attention-level methods."""

from __future__ import annotations

from ...frequencies.params import ORIGINAL_MAX
from ...registry import REQUIRED, Param

# model_type values whose attention modules the attention function serves (tests/test_attention_families.py).
# Each was read in transformers' modeling file: its attention module rotates q/k with the rotary module's cos/sin
# through the standard rotate_half (zero frequencies give the identity, partial rotary included), stores the
# result in the cache, and calls the attention interface with the ``position_ids`` in its kwargs.
FAMILIES = (
    "arcee",
    "exaone4",  # sliding layers; with a sliding window set its global layers are NoPE (NOPE_LAYERS)
    "gemma",  # explicit head_dim 256
    "gemma2",  # query_pre_attn_scalar scaling, attn_logit_softcapping (eager), alternating sliding/global layers
    "gemma3_text",  # q/k norms; rope_parameters per layer type (local/global thetas), sliding layers
    "gpt_neox",  # fused query_key_value, partial rotary (25% by default)
    "granite",  # attention_multiplier as the softmax scale
    "granitemoe",
    "llama",
    "ministral",  # sliding layers
    "mistral",  # sliding window
    "mixtral",  # sliding window
    "olmo",  # clip_qkv
    "olmo2",  # q/k norms over all heads, before rotary
    "olmo3",  # rope_parameters per layer type, sliding layers
    "phi",  # partial rotary, optional q/k LayerNorms
    "phi3",  # fused qkv_proj, partial rotary, optional sliding window
    "qwen2",  # optional sliding-window layers
    "qwen2_moe",
    "qwen3",  # per-head q/k norms before rotary
    "qwen3_moe",
    "seed_oss",
    "smollm3",  # NoPE layers (no_rope_layers, NOPE_LAYERS)
    "stablelm",  # partial rotary (25% by default), optional per-head q/k LayerNorms
    "starcoder2",  # sliding window, biases
)

# Layers of these families that apply no RoPE at all: the attention function must not rotate them either.
NOPE_LAYERS = {
    "smollm3": lambda module: not module.use_rope,  # config.no_rope_layers[layer_idx] == 0
    "exaone4": lambda module: module.sliding_window is not None and not module.is_sliding,
}

# Families seen in transformers that these types refuse, and why (any other model_type: not verified).
_INTERLEAVED = "its attention module rotates interleaved pairs (2i, 2i+1), not rotate_half's (i, i + d/2)"
REFUSED = {
    **dict.fromkeys(("cohere", "cohere2", "ernie4_5", "ernie4_5_moe", "glm", "glm4", "helium"), _INTERLEAVED),
    "persimmon": "its attention module does not pass position_ids to the attention function",
    "gpt_oss": "its attention sinks (s_aux) are a score term the package's kernels do not apply",
    "deepseek_v3": "multi-head latent attention rotates the last qk_rope_head_dim dims of each head (optionally "
    "interleaved), where the package rotates the first",
}

# Families whose own rotary code recomputes dynamic frequencies at every call, keeping no state
# (hf_rope_ext.models.roformer); with FAMILIES, where the package's dynamic types (dynamic_yarn) may run.
OWN_DYNAMIC = ("roformer",)
DYNAMIC_FAMILIES = FAMILIES + OWN_DYNAMIC

WINDOW = Param(
    default=REQUIRED,
    kind="int",
    minimum=1,
    help="relative distances below this are exact RoPE distances; at most L0 (original_max_position_embeddings)",
)
FACTOR = Param(default=REQUIRED, minimum=1.0, help="beyond the window, distances grow 1/factor as fast")
GROUP_SIZE = Param(
    default=REQUIRED, kind="int", minimum=1, help="beyond the window, positions are floor(pos/group_size)"
)
WINDOWED = {"window": WINDOW, "original_max_position_embeddings": ORIGINAL_MAX}


def pretrained_length(params: dict, config) -> int:
    """L0: ``original_max_position_embeddings`` when given, else the config's ``max_position_embeddings``."""
    return int(params.get("original_max_position_embeddings") or config.max_position_embeddings)


def is_nope_layer(module) -> bool:
    """Whether this attention module of a supported family applies no RoPE (SmolLM3's, EXAONE 4's NoPE layers)."""
    nope = NOPE_LAYERS.get(getattr(module.config, "model_type", None))
    return nope is not None and bool(nope(module))


def unsupported_reason(model_type: str | None) -> str:
    """Why the attention function does not serve ``model_type``."""
    return REFUSED.get(model_type, "its attention module was not verified to apply RoPE the way this package needs")


def check_family(params: dict, config) -> None:
    """The model family must be one whose attention modules these methods were written and tested for."""
    model_type = getattr(config, "model_type", None)
    if config is not None and model_type not in FAMILIES:
        raise ValueError(
            f"rope_parameters['rope_type']={params.get('rope_type')!r} is an attention-level type and "
            f"config.model_type={model_type!r} does not support it ({unsupported_reason(model_type)}); "
            f"supported families: {list(FAMILIES)}"
        )


def check_window(params: dict, config) -> None:
    """The window must be at most L0: distances the pretrained model never saw make the window meaningless."""
    check_family(params, config)
    if config is None:
        return
    window, limit = params.get("window"), pretrained_length(params, config)
    if window > limit:
        raise ValueError(
            f"rope_parameters['window']={window!r} is larger than the pretrained length L0={limit} "
            f"(original_max_position_embeddings, else max_position_embeddings): allowed 1 <= window <= {limit}"
        )


def check_dynamic_family(params: dict, config) -> None:
    """A dynamic frequency type only where no state outlives a call (issue 16).

    On FAMILIES the attention function rotates with the frequencies for the current length; elsewhere
    transformers' dynamic updater would keep the long input's attention factor after resetting ``inv_freq``
    (the same short input then gives another output) and cache keys rotated under older frequencies.
    """
    model_type = getattr(config, "model_type", None)
    if config is not None and model_type not in DYNAMIC_FAMILIES:
        raise ValueError(
            f"rope_parameters['rope_type']={params.get('rope_type')!r} recomputes its frequencies with the length and "
            f"config.model_type={model_type!r} cannot run it without state: the package rotates it inside the "
            f"attention function, which does not serve this family ({unsupported_reason(model_type)}), and "
            "transformers' dynamic updater keeps the long input's attention factor after its reset; "
            f"supported families: {list(DYNAMIC_FAMILIES)}"
        )
