"""Every frequency-level type in every family that reads transformers' rope registry, through configs and files."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, needs_legacy_kwarg, tiny_config, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

from hf_rope_ext.attention.layer import routes_through_attention
from hf_rope_ext.types import registry

FREQUENCY_METHODS = [m for m in registry.methods() if m.kind == "frequency"]
IDS = [m.name for m in FREQUENCY_METHODS]


def logits(model, length=24, seed=1):
    torch.manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (2, length))
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("method", FREQUENCY_METHODS, ids=IDS)
def test_family_builds_with_type_and_uses_its_frequencies(method, family):
    params = registry.example_parameters(method)
    model = tiny_model(family, params)
    expected, scale = method.frequencies(model.config)
    if routes_through_attention(method.name, model.config):  # rotated inside the attention function instead
        expected, scale = torch.zeros_like(expected), 1.0
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected, rtol=0, atol=0)
    assert model.model.rotary_emb.attention_scaling == scale
    assert torch.isfinite(logits(model)).all()


@pytest.mark.parametrize("method", FREQUENCY_METHODS, ids=IDS)
def test_save_and_reload_keep_type_frequencies_and_logits(method, family, tmp_path):
    model = tiny_model(family, registry.example_parameters(method))
    model.save_pretrained(tmp_path)
    saved = AutoConfig.from_pretrained(tmp_path)
    assert saved.rope_parameters["rope_type"] == method.name
    again = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    torch.testing.assert_close(again.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq, rtol=0, atol=0)
    torch.testing.assert_close(logits(again), logits(model), rtol=0, atol=0)


@pytest.mark.parametrize("method", FREQUENCY_METHODS, ids=IDS)
def test_from_pretrained_with_rope_parameters_patches_a_stock_checkpoint(method, tmp_path):
    from hf_rope_ext import rope_parameters_for

    tiny_model("qwen2").save_pretrained(tmp_path)
    params = registry.example_parameters(method)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, rope_parameters=rope_parameters_for(tmp_path, **params))
    assert model.config.rope_parameters["rope_type"] == method.name
    expected = method.frequencies(model.config)[0]
    if routes_through_attention(method.name, model.config):  # dynamic_yarn: rotated in the attention function
        expected = torch.zeros_like(expected)
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected)


@pytest.mark.parametrize("method", FREQUENCY_METHODS, ids=IDS)
def test_legacy_rope_scaling_spelling_gives_the_same_frequencies(method):
    params = registry.example_parameters(method)
    legacy = {("type" if k == "rope_type" else k): v for k, v in params.items()}
    old = tiny_config(rope_scaling=legacy)
    new = tiny_config(rope_parameters=params)
    assert old.rope_parameters["rope_type"] == method.name
    torch.testing.assert_close(method.frequencies(old)[0], method.frequencies(new)[0], rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # both rotated in the attention function
def test_dynamic_yarn_model_equals_unscaled_inside_l0_and_yarn_beyond(family):
    dyn = tiny_model(
        family, {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 16}, max_position_embeddings=16
    )
    plain = tiny_model(family, None, max_position_embeddings=16)
    torch.testing.assert_close(logits(dyn, length=16), logits(plain, length=16), rtol=1e-5, atol=1e-5)
    yarn_params = {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 16}
    yarn = tiny_model(family, yarn_params, max_position_embeddings=16)
    torch.testing.assert_close(logits(dyn, length=48), logits(yarn, length=48), rtol=1e-5, atol=1e-5)


def test_dynamic_yarn_returns_to_unscaled_after_a_long_input():
    """transformers' dynamic updater restores inv_freq but not the attention factor; the attention path has no state."""
    dyn = tiny_model(
        "llama", {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 16}, max_position_embeddings=16
    )
    plain = tiny_model("llama", None, max_position_embeddings=16)
    logits(dyn, length=48)
    torch.testing.assert_close(logits(dyn, length=12), logits(plain, length=12), rtol=1e-5, atol=1e-5)


def test_dynamic_yarn_cache_rerotates_keys_with_the_frequencies_in_force():
    """One layer: K/V come from embeddings only, so each cached decoding step equals recomputing its whole prefix,
    whose factor is the prefix length / L0, even though the cache holds keys from steps with smaller factors."""
    model = tiny_model(
        "llama",
        {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 8},
        max_position_embeddings=8,
        num_hidden_layers=1,
    )
    prompt = torch.randint(3, 97, (1, 6))
    with torch.no_grad():
        cached = model.generate(
            prompt, max_new_tokens=20, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
        ends = range(prompt.shape[1], cached.sequences.shape[1])
        recomputed = torch.stack([model(cached.sequences[:, :end]).logits[:, -1] for end in ends], 1)
    torch.testing.assert_close(torch.stack(cached.logits, 1), recomputed, rtol=1e-4, atol=1e-5)


def test_stock_types_untouched_by_import():
    """Importing the package adds entries; transformers' own functions stay the objects transformers defined."""
    from transformers import modeling_rope_utils as mru

    assert mru.ROPE_INIT_FUNCTIONS["yarn"] is mru._compute_yarn_parameters
    assert mru.ROPE_INIT_FUNCTIONS["linear"] is mru._compute_linear_scaling_rope_parameters
    assert set(registry.available_rope_types()) <= set(mru.ROPE_INIT_FUNCTIONS)


def test_install_is_idempotent():
    from hf_rope_ext._transformers import install

    before = dict(__import__("transformers").modeling_rope_utils.ROPE_INIT_FUNCTIONS)
    install()
    install()
    after = __import__("transformers").modeling_rope_utils.ROPE_INIT_FUNCTIONS
    assert set(after) == set(before)
    for name in registry.available_rope_types():
        assert registry.get_method(name) is not None


def test_families_cover_the_issue():
    assert {"llama", "mistral", "qwen2"} <= set(FAMILIES) and len(FAMILIES) >= 4


@needs_legacy_kwarg
def test_from_pretrained_without_base_is_refused_and_rope_parameters_for_keeps_it(tmp_path):
    """from_pretrained(..., rope_parameters=...) replaces the saved dict; the saved base must not be lost silently."""
    from hf_rope_ext import rope_parameters_for

    tiny_model("llama", {"rope_type": "default", "rope_theta": 500000.0}).save_pretrained(tmp_path)
    with pytest.raises(KeyError, match="rope_theta"):
        AutoModelForCausalLM.from_pretrained(tmp_path, rope_parameters={"rope_type": "ntk", "factor": 4.0})
    params = rope_parameters_for(tmp_path, "ntk_by_parts", factor=4.0)
    assert params == {
        "rope_theta": 500000.0,
        "rope_type": "ntk_by_parts",
        "original_max_position_embeddings": 64,
        "factor": 4.0,
    }
    model = AutoModelForCausalLM.from_pretrained(tmp_path, rope_parameters=params)
    torch.testing.assert_close(
        model.model.rotary_emb.inv_freq, registry.get_method("ntk_by_parts").frequencies(model.config)[0]
    )


def test_install_replaces_another_copy_of_the_package_but_not_a_foreign_type(monkeypatch):
    """A --remote-code export vendors the package; importing the real one afterwards takes over its entries."""
    from dataclasses import replace

    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hf_rope_ext._transformers import install

    ours = ROPE_INIT_FUNCTIONS["ntk"]
    vendored = lambda *a, **k: None  # noqa: E731
    vendored.method = replace(registry.get_method("ntk"))
    monkeypatch.setitem(ROPE_INIT_FUNCTIONS, "ntk", vendored)
    install()
    assert ROPE_INIT_FUNCTIONS["ntk"].method is registry.get_method("ntk") and ROPE_INIT_FUNCTIONS["ntk"] is not ours
    monkeypatch.setitem(ROPE_INIT_FUNCTIONS, "ntk", lambda *a, **k: None)
    with pytest.raises(ValueError, match="already has a rope_type 'ntk'"):
        install()
    monkeypatch.setitem(ROPE_INIT_FUNCTIONS, "ntk", ours)
