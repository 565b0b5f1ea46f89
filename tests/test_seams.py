"""The transformers seams (``hf_rope_ext._transformers``): each undone by ``uninstall``, put back by ``install``."""

from __future__ import annotations

import torch
from conftest import tiny_model
from transformers import conversion_mapping, modeling_utils
from transformers.generation.utils import GenerationMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin
from transformers.modeling_utils import AttentionInterface
from transformers.models.roformer import modeling_roformer

from hf_rope_ext import _transformers
from hf_rope_ext.types import registry


def ours(function) -> bool:
    return hasattr(function, "hf_rope_ext_stock") or getattr(function, "method", None) is not None


def transformers_state() -> dict:
    """What the seams change, as it stands."""
    return {
        "rope entries": sorted(n for n, f in ROPE_INIT_FUNCTIONS.items() if ours(f)),
        "validators": sorted(n for n in vars(RotaryEmbeddingConfigMixin) if n.startswith("_validate_")),
        "attention": sorted(n for n, f in AttentionInterface._global_mapping.items() if ours(f)),
        "conversions": [ours(m.get_model_conversion_mapping) for m in (conversion_mapping, modeling_utils)],
        "generation": ours(GenerationMixin._prepare_cache_for_generation),
        "roformer": modeling_roformer.RoFormerEncoder.forward.__name__ == "_forward",
    }


def test_uninstall_leaves_transformers_stock_and_install_puts_every_seam_back():
    ids = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(0))
    stock = tiny_model("llama", attn_implementation="sdpa")
    rerope = tiny_model("llama", {"rope_type": "rerope", "window": 4}, attn_implementation="sdpa")
    with torch.no_grad():
        stock_logits, rerope_logits = stock(ids).logits, rerope(ids).logits
    installed = transformers_state()
    ours_validators = {f"_validate_{n}_rope_parameters" for n in registry.available_rope_types()}
    try:
        _transformers.uninstall()
        removed = transformers_state()
        assert removed["rope entries"] == [] and removed["attention"] == [] and not removed["generation"]
        assert not any(removed["conversions"]) and not removed["roformer"]
        assert not ours_validators & set(removed["validators"])
        assert AttentionInterface._global_mapping["sdpa"] is sdpa_attention_forward
        assert "eager" not in AttentionInterface._global_mapping  # transformers keeps none: eager is per family
        with torch.no_grad():
            assert torch.equal(stock(ids).logits, stock_logits)
    finally:
        _transformers.install()
    assert transformers_state() == installed
    assert installed["rope entries"] == registry.available_rope_types() and installed["generation"]
    with torch.no_grad():
        assert torch.equal(rerope(ids).logits, rerope_logits)
