"""Tiny models from configs, shared by every test file."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_rope_ext  # noqa: F401  (registers the package's rope types)

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

# model_type -> the config keys a tiny model of that family needs
FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {},
    "stablelm": {"partial_rotary_factor": 0.5},
    "qwen3": {"head_dim": 24},
}
# rope_type -> small parameters of each attention-level type for tiny models (windows shorter than the prompts)
ATTENTION_PARAMS = {
    "dual_chunk": {"chunk_size": 6, "local_size": 2},
    "rerope": {"window": 4},
    "leaky_rerope": {"window": 4, "factor": 3.0},
    "self_extend": {"window": 4, "group_size": 3},
    "string": {"window": 4, "local_window": 1},
    "xpos": {"scale_base": 8.0},
    "roper": {"value_rotary_factor": 1.0},
}
# the same with windows of 5 over 40-token calls: the engines' tests (tests/test_attention_fast.py, _engines.py)
ENGINE_PARAMS = {
    "dual_chunk": {"chunk_size": 8, "local_size": 3},
    "rerope": {"window": 5},
    "leaky_rerope": {"window": 5, "factor": 2.5},
    "self_extend": {"window": 5, "group_size": 3},
    "string": {"window": 5, "local_window": 2},
    "xpos": {"scale_base": 8.0},
    "roper": {"value_rotary_factor": 1.0},
}


def fast_plans(name: str) -> bool:
    """Whether the fast engine plans the type's declaration (else ``sdpa`` runs the reference engine)."""
    from hf_rope_ext.attention.engine import fast
    from hf_rope_ext.attention.methods.form import PLAIN
    from hf_rope_ext.types import registry

    return fast.plan_of(registry.get_method(name).attention or PLAIN) is not None


def with_rope(name: str, params: dict, **overrides) -> dict:
    """``{"rope_type": name, **params, **overrides}``, STRING's ``local_window`` kept below an overridden window."""
    rope = {"rope_type": name, **params, **overrides}
    if "local_window" in rope and "window" in overrides:
        rope["local_window"] = min(rope["local_window"], rope["window"] - 1)
    return rope


TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


# a one-layer GQA Llama for tests that save and reload many models (cards, push)
SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=64,
)


def tiny_config(family: str = "llama", rope_parameters: dict | None = None, **overrides):
    """A 2-layer GQA config of ``family`` (4 query heads, 2 kv heads, head_dim 16 unless overridden)."""
    kwargs = {**TINY, **FAMILIES[family], **overrides}
    if rope_parameters is not None:
        kwargs["rope_parameters"] = dict(rope_parameters)
    return AutoConfig.for_model(family, **kwargs)


def tiny_model(family: str = "llama", rope_parameters: dict | None = None, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = tiny_config(family, rope_parameters, **overrides)
    config._attn_implementation = overrides.pop("attn_implementation", None) or "eager"
    return AutoModelForCausalLM.from_config(config, attn_implementation=config._attn_implementation).eval()


def save_byte_llama(path, max_position_embeddings: int, seed: int = 0):
    """Save a 2-layer GQA Llama with a byte-level tokenizer (ByT5: 384 ids) to ``path`` (the fine-tuning base)."""
    from transformers import ByT5Tokenizer

    tok = ByT5Tokenizer()
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _legacy_kwarg_is_standardized() -> bool:
    """Whether this transformers turns ``from_pretrained(path, rope_scaling={"type": ...})`` into ``rope_type``.

    transformers 5.17 sets such a kwarg on the config as it is, so its own rotary modules fail on the missing
    ``rope_type`` before any rope function runs; newer 5.x releases standardize it.
    """
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        tiny_config("llama").save_pretrained(folder)
        legacy = {"type": "linear", "factor": 2.0, "rope_theta": 10000.0}
        return "rope_type" in AutoConfig.from_pretrained(folder, rope_scaling=legacy).rope_parameters


LEGACY_KWARG_STANDARDIZED = _legacy_kwarg_is_standardized()
needs_legacy_kwarg = pytest.mark.skipif(
    not LEGACY_KWARG_STANDARDIZED, reason="this transformers leaves a from_pretrained rope_scaling kwarg unstandardized"
)


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    return request.param
