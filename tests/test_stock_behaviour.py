"""With hf_rope_ext imported, transformers' own checks still hold, reproduced here case by case:

- ``tests/utils/test_modeling_rope_utils.py::test_rope_validation``: every entry of ``ROPE_INIT_FUNCTIONS`` raises a
  KeyError for a dict missing its required keys and for keys of other types (flat Llama, nested Gemma 3 configs);
- ``test_reverse_loading_mapping`` (Llama, Mistral, Qwen2, every head class): a stock model has no conversion to
  apply, saves and reloads bit for bit; an interleaved one converts, and every pattern matches a saved key;
- RoFormer ``test_model_rope_scaling_from_config`` (linear, dynamic, yarn), ``test_model_rope_with_partial_rotation``;

and the stock-behaviour points of issues 14 (legacy ``rope_scaling`` in from_pretrained, RoFormer past its table)
and 16 (what iterates ``ROPE_INIT_FUNCTIONS`` sees consistent, validated entries).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import needs_legacy_kwarg, tiny_config, tiny_model
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    RoFormerConfig,
    RoFormerForCausalLM,
    RoFormerModel,
    conversion_mapping,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    MODEL_MAPPING_NAMES,
)

import hf_rope_ext
from hf_rope_ext._transformers import roformer as roformer_seam
from hf_rope_ext.attention import roformer
from hf_rope_ext.types import registry

# ----------------------------------------------------------------------------- test_rope_validation

# the dummy keys transformers' test passes, each valid only for the types listed
VALID_PARAM_MAPPING = {
    "factor": ["linear", "dynamic", "yarn", "longrope"],
    "attention_factor": ["yarn", "longrope"],
    "beta_fast": ["yarn"],
    "beta_slow": ["yarn"],
    "short_factor": ["longrope"],
    "long_factor": ["longrope"],
}
# types a dict of rope_type and rope_theta alone describes completely: transformers' "default" and "proportional",
# exempted by name in its test, and the package's "string" (its authors' defaults, computed from L0); every other type
# of the package names at least one required key
KEY_FREE = {"default", "proportional", "string"}
SHAPES = [("flat", False), ("nested", True), ("nested", False)]  # transformers' (is_nested, same_rope_per_layer)


def config_with(rope_params: dict, shape: str, same_per_layer: bool):
    """transformers' ``get_config_with_rope_parameters``: a Llama config, or a Gemma 3 one nested per layer type."""
    if shape == "flat":
        config = LlamaConfig()
        config.layer_types = None
        config.rope_parameters = rope_params
        return config
    config = Gemma3TextConfig()
    config.layer_types = ["full_attention", "sliding_attention"]
    sliding = rope_params if same_per_layer else {"rope_type": "default", "rope_theta": 10000.0}
    config.rope_parameters = {"full_attention": rope_params, "sliding_attention": sliding}
    return config


@pytest.mark.parametrize(("shape", "same_per_layer"), SHAPES, ids=["flat", "nested-same", "nested-different"])
@pytest.mark.parametrize("rope_type", sorted(set(ROPE_INIT_FUNCTIONS) - KEY_FREE))
def test_every_type_with_required_keys_raises_key_error_as_transformers_expects(rope_type, shape, same_per_layer):
    with pytest.raises(KeyError):
        config_with({"rope_type": rope_type, "rope_theta": 10000.0}, shape, same_per_layer).validate_rope()
    for param, valid_types in VALID_PARAM_MAPPING.items():
        if rope_type not in valid_types:
            params = {"rope_type": rope_type, "rope_theta": 10000.0, param: True}
            with pytest.raises(KeyError):
                config_with(params, shape, same_per_layer).validate_rope()


@pytest.mark.parametrize("rope_type", sorted(KEY_FREE))
def test_key_free_types_validate_with_rope_theta_alone(rope_type):
    """As transformers' own "default" and "proportional": nothing to require, so nothing missing."""
    config_with({"rope_type": rope_type, "rope_theta": 10000.0}, "flat", False).validate_rope()


@pytest.mark.parametrize("method", registry.methods(), ids=lambda m: m.name)
def test_keys_of_other_types_are_refused_naming_key_value_and_allowed(method):
    params = {**registry.example_parameters(method), "rope_theta": 10000.0, "short_factor": [1.0]}
    config = config_with(params, "flat", False)
    with pytest.raises(registry.RopeParameterError) as excinfo:
        config.validate_rope()
    assert isinstance(excinfo.value, KeyError) and isinstance(excinfo.value, ValueError)
    text = str(excinfo.value)
    assert "'short_factor'" in text and "[1.0]" in text and "allowed keys" in text and not text.startswith('"')


@pytest.mark.parametrize("name", ["ntk", "ntk_by_parts", "part_ntk"])
def test_a_bool_factor_is_a_bad_value_for_both_callers(name):
    """transformers passes ``factor: True``; for these types factor is a key they take, True a value they do not."""
    config = config_with({"rope_type": name, "rope_theta": 10000.0, "factor": True}, "flat", False)
    with pytest.raises(registry.RopeParameterError, match=r"'factor'\]=True is invalid .* expected a number >= 1"):
        config.validate_rope()


def test_missing_required_key_is_a_plain_key_error_first():
    """Missing keys come first, as in transformers, even when another key is wrong too."""
    config = config_with({"rope_type": "ntk", "rope_theta": 10000.0, "fator": 4.0}, "flat", False)
    with pytest.raises(KeyError, match="'factor'.* is required") as excinfo:
        config.validate_rope()
    assert not isinstance(excinfo.value, ValueError)


# ----------------------------------------------------------------------------- test_reverse_loading_mapping

HEAD_MAPPINGS = (
    MODEL_MAPPING_NAMES,
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
)
HEADS = [(family, mapping[family]) for family in ("llama", "mistral", "qwen2") for mapping in HEAD_MAPPINGS]


def head_model(family: str, class_name: str, **overrides):
    import transformers

    config = tiny_config(family, pad_token_id=0, **overrides)
    torch.manual_seed(0)
    return getattr(transformers, class_name)(config).eval()


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("family", "class_name"), HEADS, ids=[c for _, c in HEADS])
def test_stock_checkpoints_have_no_conversion_and_round_trip_bit_for_bit(family, class_name, tmp_path):
    """Where transformers' test finds no conversion it skips: there must be none, and nothing may change."""
    model = head_model(family, class_name)
    assert conversion_mapping.get_model_conversion_mapping(model, add_legacy=False) == []
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert same_tensors(saved, {k: v for k, v in model.state_dict().items() if k in saved})
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert reloaded._weight_conversions == []
    assert same_tensors(reloaded.state_dict(), model.state_dict())


@pytest.mark.parametrize(("family", "class_name"), HEADS, ids=[c for _, c in HEADS])
def test_interleaved_models_pass_transformers_reverse_mapping_checks(family, class_name, tmp_path):
    """transformers' checks on a model that does convert: every source pattern matches a saved key; saving from
    ``__init__`` and from ``from_pretrained`` writes the same file; the reloaded model equals the original."""
    model = head_model(family, class_name, rope_layout="interleaved")
    conversions = conversion_mapping.get_model_conversion_mapping(model, add_legacy=False)
    assert conversions, "an interleaved model converts its q/k rows"
    model.save_pretrained(tmp_path / "init")
    saved = load_file(tmp_path / "init" / "model.safetensors")
    for conversion in conversions:
        matched = {m[2].lastgroup for key in saved if (m := conversion._scoped_match(key)) is not None}
        assert {f"g{i}" for i in range(len(conversion.source_patterns))} <= matched, conversion
    assert not same_tensors(saved, {k: v for k, v in model.state_dict().items() if k in saved})  # permuted on disk
    reloaded = type(model).from_pretrained(tmp_path / "init").eval()
    assert same_tensors(reloaded.state_dict(), model.state_dict())
    reloaded.save_pretrained(tmp_path / "again")
    assert same_tensors(load_file(tmp_path / "again" / "model.safetensors"), saved)


# ----------------------------------------------------------------------------- RoFormer: transformers' rope tests

ROFORMER = dict(
    vocab_size=99,
    embedding_size=32,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)


def set_rope_params(config, params: dict) -> None:
    """transformers' ``_set_config_rope_params`` for a flat config: copy what is there, update it."""
    config.rope_parameters = copy.deepcopy(getattr(config, "rope_parameters", {}) or {})
    config.rope_parameters.update(params)


def roformer_outputs(config, *inputs):
    torch.manual_seed(42)  # the same weights for every config
    model = RoFormerModel(config).eval()
    with torch.no_grad():
        return [model(ids).last_hidden_state for ids in inputs]


@pytest.mark.parametrize("scaling_type", ["linear", "dynamic", "yarn"])
def test_roformer_rope_scaling_from_config(scaling_type):
    """transformers' ``test_model_rope_scaling_from_config``: ``default`` given an unused pretraining length, then
    the scaling type on top of it (the leftover key stays, as transformers' helper leaves it)."""
    config = RoFormerConfig(**ROFORMER)
    torch.manual_seed(0)
    short, long = torch.randint(0, 99, (1, 10)), torch.randint(0, 99, (1, 96))
    set_rope_params(config, {"rope_type": "default", "rope_theta": 10_000.0, "original_max_position_embeddings": 16384})
    original_short, original_long = roformer_outputs(config, short, long)
    set_rope_params(config, {"rope_type": scaling_type, "factor": 10.0, "rope_theta": 10_000.0})
    scaled_short, scaled_long = roformer_outputs(config, short, long)
    if scaling_type == "dynamic":
        torch.testing.assert_close(original_short, scaled_short, rtol=1e-5, atol=1e-5)
    else:
        assert not torch.allclose(original_short, scaled_short, atol=1e-5)
    assert not torch.allclose(original_long, scaled_long, atol=1e-5)


def test_roformer_default_rows_past_the_table_are_the_sinusoid():
    """The long input above runs: rows past the table follow the same sinusoid as the table (reference here)."""
    config = RoFormerConfig(**{**ROFORMER, "rope_parameters": {"rope_type": "default"}})
    model = RoFormerModel(config).eval()
    rows = model.encoder.embed_positions(torch.Size([1, 96]))  # [96, d] = [sin | cos] per pair
    d = config.hidden_size // config.num_attention_heads
    angle = torch.arange(96, dtype=torch.float64)[:, None] / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    torch.testing.assert_close(rows, torch.cat((angle.sin(), angle.cos()), -1).float(), rtol=0, atol=1e-6)
    table = model.encoder.embed_positions.weight  # stock rows 0..63
    torch.testing.assert_close(rows[:64], table, rtol=0, atol=1e-6)


def test_roformer_config_reads_like_other_rope_families_and_saves_as_stock(tmp_path):
    """transformers' partial-rotation test asks ``"partial_rotary_factor" in config.rope_parameters``."""
    config = RoFormerConfig(**ROFORMER)
    assert config.rope_parameters == {} and "partial_rotary_factor" not in config.rope_parameters
    assert roformer.rope_request(config) is None  # still a stock RoFormer
    config.save_pretrained(tmp_path)
    assert "rope_parameters" not in (tmp_path / "config.json").read_text()
    config.rope_parameters["rope_type"] = "linear"  # the empty dict is a fresh one: assign to set parameters
    assert config.rope_parameters == {}


# ------------------------------------------------------------------------- loading rope parameters; RoFormer's table


@needs_legacy_kwarg
@pytest.mark.parametrize("spelling", ["type", "rope_type"])
def test_legacy_rope_scaling_in_from_pretrained_takes_the_checkpoints_theta(spelling, tmp_path):
    model = tiny_model(rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, rope_scaling={spelling: "ntk", "factor": 4.0})
    assert loaded.config.rope_parameters["rope_theta"] == 500.0
    d = model.config.head_dim
    base = 500.0 * 4.0 ** (d / (d - 2))  # NTK-aware: b * s^(d/(d-2))
    expected = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    torch.testing.assert_close(loaded.model.rotary_emb.inv_freq.double(), expected, rtol=1e-6, atol=0)
    loaded.save_pretrained(tmp_path / "again")  # the base is recorded
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "again").config.rope_parameters["rope_theta"] == 500.0


def test_rope_parameters_without_theta_in_from_pretrained_are_still_refused(tmp_path):
    """``rope_parameters=`` replaces the saved dict whole: no silent base (README)."""
    tiny_model(rope_parameters={"rope_type": "default", "rope_theta": 500.0}).save_pretrained(tmp_path)
    with pytest.raises(KeyError, match="rope_theta"):
        AutoModelForCausalLM.from_pretrained(tmp_path, rope_parameters={"rope_type": "ntk", "factor": 4.0})


@pytest.mark.parametrize("cached", [0, 60])
def test_stock_roformer_past_its_table_says_what_to_set(cached):
    config = RoFormerConfig(**{**ROFORMER, "is_decoder": True})
    model = RoFormerForCausalLM(config).eval()
    past = None
    if cached:
        with torch.no_grad():
            past = model(torch.ones(1, cached, dtype=torch.long), use_cache=True).past_key_values
    fits = torch.ones(1, 64 - cached, dtype=torch.long)
    with torch.no_grad():
        model(fits, past_key_values=copy.deepcopy(past))  # up to the table: stock, no error
        with pytest.raises(roformer_seam.TableLengthError) as excinfo:
            model(torch.ones(1, 65 - cached, dtype=torch.long), past_key_values=past)
    assert isinstance(excinfo.value, ValueError) and isinstance(excinfo.value, IndexError)
    text = str(excinfo.value)
    assert "max_position_embeddings=64" in text and f"0..64 ({cached} cached" in text
    assert "rope_parameters={'rope_type': 'default'}" in text


def test_roformer_with_rope_parameters_runs_past_its_table_as_stock_inside_it():
    config = RoFormerConfig(**ROFORMER)
    ids = torch.randint(0, 99, (1, 64))
    (stock,) = roformer_outputs(config, ids)
    set_rope_params(config, {"rope_type": "default"})
    inside, longer = roformer_outputs(config, ids, torch.cat((ids, ids), dim=1))
    torch.testing.assert_close(inside, stock, rtol=1e-5, atol=1e-5)
    assert longer.shape[1] == 128 and torch.isfinite(longer).all()


# ----------------------------------------------------------------------------- who iterates the table


def test_list_shows_exactly_what_rope_init_functions_holds():
    from hf_rope_ext._transformers import rope_types
    from hf_rope_ext.cli.list_types import rows

    table = rows()
    assert [r["rope_type"] for r in table if r["source"] == "hf_rope_ext"] == hf_rope_ext.available_rope_types()
    assert {r["rope_type"] for r in table} == set(ROPE_INIT_FUNCTIONS) | {"default"}
    assert {name for name, _ in rope_types()} == {r["rope_type"] for r in table}  # entries checked against registry
    for name in hf_rope_ext.available_rope_types():  # each of ours validated on build and by the config mixin
        assert ROPE_INIT_FUNCTIONS[name].method is registry.get_method(name)
        assert hasattr(RotaryEmbeddingConfigMixin, f"_validate_{name}_rope_parameters")


def test_a_type_registered_after_import_goes_into_transformers_at_once(monkeypatch):
    """One table: a method registered later is in ROPE_INIT_FUNCTIONS, validated, and listed."""
    from hf_rope_ext.cli.list_types import rows

    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    before = dict(ROPE_INIT_FUNCTIONS)  # restored below (the dict itself is shared by every modeling file)
    ntk = registry.get_method("ntk")
    late = registry.RopeMethod(
        name="test_late_ntk", kind="frequency", frequencies=ntk.frequencies, params=dict(ntk.params)
    )
    try:
        registry.register(late)
        assert ROPE_INIT_FUNCTIONS["test_late_ntk"].method is late
        assert "test_late_ntk" in [r["rope_type"] for r in rows()]
        with pytest.raises(KeyError, match="'factor'"):
            config_with({"rope_type": "test_late_ntk", "rope_theta": 1e4}, "flat", False).validate_rope()
        config = tiny_config(rope_parameters={"rope_type": "test_late_ntk", "factor": 2.0, "rope_theta": 10000.0})
        inv_freq, scale = ROPE_INIT_FUNCTIONS["test_late_ntk"](config)
        assert scale == 1.0 and math.isclose(float(inv_freq[0]), 1.0)
    finally:
        ROPE_INIT_FUNCTIONS.clear()
        ROPE_INIT_FUNCTIONS.update(before)
        if hasattr(RotaryEmbeddingConfigMixin, "_validate_test_late_ntk_rope_parameters"):
            delattr(RotaryEmbeddingConfigMixin, "_validate_test_late_ntk_rope_parameters")


def test_a_type_transformers_refuses_is_not_registered_either(monkeypatch):
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    clash = registry.RopeMethod(name="linear", kind="frequency", frequencies=registry.get_method("ntk").frequencies)
    with pytest.raises(ValueError, match="transformers already has a rope_type 'linear'"):
        registry.register(clash)
    assert "linear" not in registry._METHODS


def test_interleaved_language_model_inside_a_composite_model_converts_only_its_own_rows(tmp_path):
    """Llava: the converters are scoped to the Llama inside, the CLIP tower's own q/k_proj are left as they are."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    text = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, rope_layout="interleaved",
    )  # fmt: skip
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(LlavaConfig(text_config=text, vision_config=vision, image_token_index=63))
    model.save_pretrained(tmp_path)
    saved, live = load_file(tmp_path / "model.safetensors"), model.state_dict()
    key = "layers.0.self_attn.q_proj.weight"
    half = live[f"model.language_model.{key}"]  # [4 heads * 8, 32]: pairs (j, j + 4) per head
    expected = half.view(4, 2, 4, 32).transpose(1, 2).reshape(32, 32)  # interleaved: pairs (2j, 2j + 1)
    assert torch.equal(saved[f"language_model.model.{key}"], expected)
    for name in ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias"):
        vision_key = f"encoder.layers.0.self_attn.{name}"
        assert torch.equal(saved[f"vision_tower.{vision_key}"], live[f"model.vision_tower.{vision_key}"])
    reloaded = LlavaForConditionalGeneration.from_pretrained(tmp_path)
    assert same_tensors(reloaded.state_dict(), live)


def test_another_copys_layout_wrapper_gives_way_around_the_same_stock_function(monkeypatch):
    """A --remote-code export vendors the package; importing the real one afterwards takes over, never nests."""
    from transformers import modeling_utils

    from hf_rope_ext import _transformers

    stock = conversion_mapping.get_model_conversion_mapping.hf_rope_ext_stock

    def vendored(model, *args, **kwargs):
        return stock(model, *args, **kwargs)

    vendored.hf_rope_ext_stock = stock
    for module in (conversion_mapping, modeling_utils):
        monkeypatch.setattr(module, "get_model_conversion_mapping", vendored)
    _transformers.conversions.install()
    _transformers.conversions.install()  # idempotent
    for module in (conversion_mapping, modeling_utils):
        current = module.get_model_conversion_mapping
        assert current.hf_rope_ext_layout is _transformers.conversions.layout_conversions
        assert current.hf_rope_ext_stock is stock
    model = head_model("llama", "LlamaForCausalLM", rope_layout="interleaved")
    assert len(conversion_mapping.get_model_conversion_mapping(model, add_legacy=False)) == 2
