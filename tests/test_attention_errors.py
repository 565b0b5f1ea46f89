"""Bad input fails loudly; stock models stay bit-identical; the types are chosen by the config alone."""

from __future__ import annotations

import pytest
import torch
from conftest import error_text, needs_legacy_kwarg, tiny_config, tiny_model
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.integrations.flash_attention import flash_attention_forward
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from hf_rope_ext import _transformers
from hf_rope_ext.types import registry

ATTENTION_METHODS = [m for m in registry.methods() if m.kind == "attention"]


ORIGINAL = "original_max_position_embeddings"
BAD = [  # (rope_parameters, key named, what the message must also say); tiny configs have L0 = 64
    ({"rope_type": "rerope", "window": 0}, "window", ">= 1"),
    ({"rope_type": "rerope", "window": 2.5}, "window", "integer"),
    ({"rope_type": "rerope", "window": 65}, "window", "1 <= window <= 64"),
    ({"rope_type": "rerope", "window": 65, "original_max_position_embeddings": 32}, "window", "<= 32"),
    ({"rope_type": "leaky_rerope", "window": 8, "factor": 0.5}, "factor", ">= 1"),
    ({"rope_type": "self_extend", "window": 8, "group_size": 0}, "group_size", ">= 1"),
    ({"rope_type": "self_extend", "window": 100, "group_size": 2}, "window", "<= 64"),
    ({"rope_type": "xpos", "scale_base": 512.0, "gamma": 0}, "gamma", "> 0"),
    ({"rope_type": "roper", "value_rotary_factor": 1.5}, "value_rotary_factor", "0 < f <= 1"),
    ({"rope_type": "roper", "value_rotary_factor": 0}, "value_rotary_factor", "> 0"),
    ({"rope_type": "xpos", "scale_base": -1}, "scale_base", "> 0"),
    ({"rope_type": "string", "window": 65, "local_window": 4}, "window", "1 <= window <= 64"),
    ({"rope_type": "string", "window": 40, "local_window": 4, "original_max_position_embeddings": 32}, "window", "32"),
    ({"rope_type": "string", "window": 8, "local_window": 8}, "local_window", "0 <= local_window < window"),
    ({"rope_type": "string", "window": 8, "local_window": 12}, "local_window", "0 <= local_window < window"),
    ({"rope_type": "string", "window": 8, "local_window": -1}, "local_window", ">= 0"),
    ({"rope_type": "string", "window": 0, "local_window": 0}, "window", ">= 1"),
    ({"rope_type": "dual_chunk", "chunk_size": 64, "local_size": 4}, "chunk_size", "chunk_size < 64"),
    ({"rope_type": "dual_chunk", "chunk_size": 40, "local_size": 4, ORIGINAL: 32}, "chunk_size", "chunk_size < 32"),
    ({"rope_type": "dual_chunk", "chunk_size": 8, "local_size": 8}, "local_size", "0 <= local_size < chunk_size"),
    ({"rope_type": "dual_chunk", "chunk_size": 8, "local_size": 9}, "local_size", "0 <= local_size < chunk_size"),
    ({"rope_type": "dual_chunk", "chunk_size": 8, "local_size": -1}, "local_size", ">= 0"),
    ({"rope_type": "dual_chunk", "chunk_size": 8.5, "local_size": 2}, "chunk_size", "integer"),
]


@pytest.mark.parametrize("params, key, allowed", BAD, ids=[f"{p['rope_type']}-{k}" for p, k, _ in BAD])
def test_bad_parameters_name_key_value_and_what_is_allowed(params, key, allowed):
    with pytest.raises((ValueError, StrictDataclassError)) as excinfo:
        tiny_config(rope_parameters=params)
    text = error_text(excinfo)
    assert f"'{key}'" in text and repr(params[key]) in text and allowed in text


@pytest.mark.parametrize(
    "name, key",
    [
        ("rerope", "window"),
        ("leaky_rerope", "factor"),
        ("self_extend", "group_size"),
        ("xpos", "scale_base"),
        ("roper", "value_rotary_factor"),
        ("dual_chunk", "chunk_size"),
        ("dual_chunk", "local_size"),
    ],
)
def test_missing_required_parameter_is_a_key_error(name, key):
    """(STRING's window and local_window have the authors' defaults: ``test_method_string.py``.)"""
    params = {k: v for k, v in registry.example_parameters(registry.get_method(name)).items() if k != key}
    with pytest.raises(KeyError) as excinfo:
        tiny_config(rope_parameters=params)
    assert f"'{key}'" in error_text(excinfo)


@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_unsupported_family_is_refused(method):
    rope = {"rope_theta": 10000.0, **registry.example_parameters(method)}
    with pytest.raises((ValueError, StrictDataclassError)) as excinfo:
        AutoConfig.for_model("cohere", rope_parameters=rope)  # rotates interleaved pairs in its attention module
    text = error_text(excinfo)
    assert "model_type='cohere'" in text and "llama" in text and method.name in text


@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_implementations_the_engine_does_not_run_through_refuse(method):
    """paged attention (continuous batching's own cache) refuses; flash and flex run (see their own tests)."""
    model = tiny_model("llama", registry.example_parameters(method))
    q = torch.zeros(1, 4, 3, 16)
    allowed = r"\['eager', 'flash_attention_2', 'flash_attention_3', 'flash_attention_4', 'flex_attention', 'sdpa'\]"
    with pytest.raises(ValueError, match=rf"attn_implementation='paged\|eager'.*{method.name}.*{allowed}"):
        ALL_ATTENTION_FUNCTIONS["paged|eager"](model.model.layers[0].self_attn, q, q[:, :2], q[:, :2], None)


def test_refusing_wrappers_keep_the_stock_functions():
    assert _transformers.stock_attention("flash_attention_2") is flash_attention_forward
    assert _transformers.stock_attention("sdpa") is sdpa_attention_forward


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_stock_models_are_bit_identical(family, implementation, monkeypatch):
    model = tiny_model(family, attn_implementation=implementation)
    ids = torch.randint(3, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        ours = model(ids, attention_mask=mask).logits
        mapping = dict(AttentionInterface._global_mapping)
        mapping.pop("eager")  # transformers' own state: the model's eager_attention_forward is the default
        mapping["sdpa"] = sdpa_attention_forward
        monkeypatch.setattr(AttentionInterface, "_global_mapping", mapping)
        stock = model(ids, attention_mask=mask).logits
    assert torch.equal(ours, stock)


def test_attention_module_without_position_ids_is_an_error():
    model = tiny_model("llama", {"rope_type": "rerope", "window": 8})
    hidden = torch.randn(1, 5, 64)
    attention = model.model.layers[0].self_attn
    with pytest.raises(ValueError, match="position_ids=None"):
        attention(
            hidden, position_embeddings=model.model.rotary_emb(hidden, torch.arange(5)[None]), attention_mask=None
        )


@pytest.mark.parametrize("spelling", ["rope_parameters", pytest.param("rope_scaling", marks=needs_legacy_kwarg)])
def test_chosen_by_from_pretrained_alone(spelling, tmp_path):
    stock = tiny_model("llama")
    stock.save_pretrained(tmp_path)
    rope = {
        "rope_type": "self_extend",
        "window": 4,
        "group_size": 2,
        "rope_theta": stock.config.rope_parameters["rope_theta"],
    }
    if spelling == "rope_scaling":
        rope = {"type": rope.pop("rope_type"), **rope}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, **{spelling: rope}).eval()
    built = tiny_model("llama", {"rope_type": "self_extend", "window": 4, "group_size": 2}, attn_implementation="sdpa")
    built.load_state_dict(stock.state_dict())
    ids = torch.randint(3, 97, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, built(ids).logits, rtol=0, atol=1e-6)
        assert not torch.allclose(loaded(ids).logits, stock(ids).logits, atol=1e-4)
