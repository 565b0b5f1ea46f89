"""Bad rope parameters fail when the config is built, naming the key, the value and what is allowed."""

from __future__ import annotations

import pytest
from conftest import error_text, tiny_config, tiny_model
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoModelForCausalLM

from hf_rope_ext.types import registry

# transformers' configs run validators under huggingface_hub's strict dataclasses, which wrap a ValueError raised
# by a validator in StrictDataclassClassValidationError (its __cause__ is our ValueError); KeyError passes through.
CONFIG_ERRORS = (ValueError, StrictDataclassError)

WITH_FACTOR = [m for m in registry.methods() if "factor" in m.params and m.params["factor"].minimum == 1.0]


@pytest.mark.parametrize("method", WITH_FACTOR, ids=lambda m: m.name)
def test_missing_factor_is_a_key_error(method):
    with pytest.raises(KeyError) as excinfo:
        tiny_config(rope_parameters={"rope_type": method.name})
    assert "'factor'" in error_text(excinfo) and method.name in error_text(excinfo)


@pytest.mark.parametrize("method", WITH_FACTOR, ids=lambda m: m.name)
@pytest.mark.parametrize("bad", [0.5, 0, -2.0, "4", None, float("nan"), True])
def test_bad_factor(method, bad):
    params = {**registry.example_parameters(method), "factor": bad}
    with pytest.raises((*CONFIG_ERRORS, KeyError)) as excinfo:
        tiny_config(rope_parameters=params)
    text = error_text(excinfo)
    assert "'factor'" in text and (bad is None or repr(bad) in text)
    if bad is not None:
        assert ">= 1" in text


@pytest.mark.parametrize("method", registry.methods(), ids=lambda m: m.name)
def test_unknown_key_names_the_typo_and_the_allowed_keys(method):
    params = {**registry.example_parameters(method), "fator": 4.0}
    with pytest.raises(CONFIG_ERRORS) as excinfo:
        tiny_config(rope_parameters=params)
    text = error_text(excinfo)
    assert "'fator'" in text and "4.0" in text and "allowed keys" in text


@pytest.mark.parametrize("name", ["ntk_by_parts", "dynamic_yarn"])
@pytest.mark.parametrize("betas", [(1.0, 1.0), (1.0, 32.0)])
def test_beta_fast_must_exceed_beta_slow(name, betas):
    params = {**registry.example_parameters(registry.get_method(name)), "beta_fast": betas[0], "beta_slow": betas[1]}
    with pytest.raises(CONFIG_ERRORS) as excinfo:
        tiny_config(rope_parameters=params)
    assert "'beta_fast'" in error_text(excinfo) and "'beta_slow'" in error_text(excinfo)


@pytest.mark.parametrize(
    "params, key",
    [
        ({"rope_type": "part_ntk", "factor": 2.0, "beta_0": 0.5}, "beta_0"),
        ({"rope_type": "part_ntk", "factor": 2.0, "gamma_1": 20}, "gamma_0"),
        ({"rope_type": "part_ntk", "factor": 2.0, "ntk_factor": -1}, "ntk_factor"),
        (
            {"rope_type": "ntk", "factor": 2.0, "original_max_position_embeddings": 10.5},
            "original_max_position_embeddings",
        ),
        ({"rope_type": "ntk_by_parts", "factor": 2.0, "truncate": "yes"}, "truncate"),
        ({"rope_type": "ntk", "factor": 2.0, "rope_theta": 0}, "rope_theta"),
    ],
)
def test_other_bad_values(params, key):
    with pytest.raises(CONFIG_ERRORS) as excinfo:
        tiny_config(rope_parameters=params)
    assert f"'{key}'" in error_text(excinfo)


def test_bad_input_fails_in_from_pretrained_before_any_forward(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(CONFIG_ERRORS) as excinfo:
        AutoModelForCausalLM.from_pretrained(tmp_path, rope_parameters={"rope_type": "ntk", "factor": 0.25})
    assert "'factor'" in error_text(excinfo)


def test_unknown_package_type_lookup_lists_the_known_ones():
    with pytest.raises(KeyError) as excinfo:
        registry.get_method("ntk_aware")
    assert "'ntk_aware'" in str(excinfo.value) and "ntk_by_parts" in str(excinfo.value)


def test_duplicate_registration_is_refused():
    method = registry.get_method("ntk")
    clone = registry.RopeMethod(name="ntk", kind="frequency", frequencies=method.frequencies)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(clone)
