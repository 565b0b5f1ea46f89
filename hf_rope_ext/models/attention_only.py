"""Families described for attention routing only (no layout facts: their checkpoints are not converted).

Served: each was read in transformers' modeling file: its attention module rotates q/k with the rotary module's
cos/sin through the standard rotate_half (zero frequencies give the identity, partial rotary included), stores the
result in the cache, and calls the attention interface with the ``position_ids`` in its kwargs
(tests/test_attention_families.py). Refused: the reason the attention-level types cannot run there.
"""

from .family import Family, register_family

SERVED = {
    "arcee": None,
    "exaone4": "sliding layers; with a sliding window set its global layers are NoPE",
    "gemma": "explicit head_dim 256",
    "gemma2": "query_pre_attn_scalar scaling, attn_logit_softcapping (eager), alternating sliding/global layers",
    "gemma3_text": "q/k norms; rope_parameters per layer type (local/global thetas), sliding layers",
    "gpt_neox": "fused query_key_value, partial rotary (25% by default)",
    "granite": "attention_multiplier as the softmax scale",
    "granitemoe": None,
    "ministral": "sliding layers",
    "mixtral": "sliding window",
    "olmo": "clip_qkv",
    "olmo2": "q/k norms over all heads, before rotary",
    "olmo3": "rope_parameters per layer type, sliding layers",
    "phi": "partial rotary, optional q/k LayerNorms",
    "qwen2_moe": None,
    "qwen3_moe": None,
    "seed_oss": None,
    "smollm3": "NoPE layers (no_rope_layers)",
    "starcoder2": "sliding window, biases",
}

# layers that apply no RoPE at all: the attention function must not rotate them either
ROPE_FREE = {
    "smollm3": lambda module: not module.use_rope,  # config.no_rope_layers[layer_idx] == 0
    "exaone4": lambda module: module.sliding_window is not None and not module.is_sliding,
}

_INTERLEAVED = "its attention module rotates interleaved pairs (2i, 2i+1), not rotate_half's (i, i + d/2)"
REFUSED = {
    **dict.fromkeys(("cohere", "cohere2", "ernie4_5", "ernie4_5_moe", "glm", "glm4", "helium"), _INTERLEAVED),
    "persimmon": "its attention module does not pass position_ids to the attention function",
    "gpt_oss": "its attention sinks (s_aux) are a score term the package's kernels do not apply",
    "deepseek_v3": "multi-head latent attention rotates the last qk_rope_head_dim dims of each head (optionally "
    "interleaved), where the package rotates the first",
}

for _model_type in SERVED:
    register_family(Family(model_types=(_model_type,), attention=True, rope_free=ROPE_FREE.get(_model_type)))
for _model_type, _why in REFUSED.items():
    register_family(Family(model_types=(_model_type,), refused=_why))
