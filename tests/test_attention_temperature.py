"""Attention temperature on every attention-level type: logits against the float64 pair-by-pair reference of
``pair_reference`` fed queries scaled here by factors written out per position; exact with a KV cache;
off by default; bad input named."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import REFERENCE_PARAMS, error_text, generate_left_padded, logits, logits_with, tiny_config, tiny_model
from huggingface_hub.errors import StrictDataclassError
from pair_reference import reference_attention
from transformers.modeling_utils import AttentionInterface

from hf_rope_ext.types import registry

ATTENTION_METHODS = [m.name for m in registry.methods() if m.kind == "attention"]
L0 = 8  # original_max_position_embeddings: positions 8.. of the 24-token inputs are past it
S = 4.0  # temperature_factor
REFERENCE = "hf_rope_ext_test_temperature"
PARAMS = REFERENCE_PARAMS


def factor_of(mode: str, m: int) -> float:
    """The query factor at position m: Qwen's logn (log_L0(m + 1) past L0), or YaRN's (0.1 ln s + 1)^2."""
    if mode == "log":
        return math.log(m + 1, L0) if m + 1 > L0 else 1.0
    return (0.1 * math.log(S) + 1) ** 2


def tempered_reference(module, query, key, value, attention_mask, scaling, position_ids=None, **kw):
    mode = module.config.rope_parameters["attention_temperature"]
    factors = [[factor_of(mode, int(m)) for m in row] for row in position_ids.expand(query.shape[0], -1)]
    scaled = query.double() * torch.tensor(factors, dtype=torch.float64)[:, None, :, None]
    out, _ = reference_attention(module, scaled, key, value, attention_mask, scaling, position_ids=position_ids, **kw)
    return out.to(query.dtype), None


AttentionInterface.register(REFERENCE, tempered_reference)


def rope(name: str, mode: str) -> dict:
    extra = {"temperature_factor": S} if mode == "constant" else {}
    return {"rope_type": name, **PARAMS[name], "original_max_position_embeddings": L0, **extra,
            "attention_temperature": mode}  # fmt: skip


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["constant", "log"])
@pytest.mark.parametrize("name", ATTENTION_METHODS)
def test_matches_the_reference_with_scaled_queries(name, mode, implementation):
    model = tiny_model("llama", rope(name, mode), attn_implementation=implementation)
    ids = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(3, 27)[None]
    expected = logits_with(model, REFERENCE, ids, position_ids=pos)
    torch.testing.assert_close(logits(model, ids, position_ids=pos), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["constant", "log"])
@pytest.mark.parametrize("name", ATTENTION_METHODS)
def test_cache_equals_full_recompute(name, mode, implementation):
    model = tiny_model("llama", rope(name, mode), attn_implementation=implementation)
    tokens, step_logits = generate_left_padded(model, use_cache=True)
    recomputed_tokens, recomputed_logits = generate_left_padded(model, use_cache=False)
    assert torch.equal(tokens, recomputed_tokens)
    torch.testing.assert_close(step_logits, recomputed_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ATTENTION_METHODS)
def test_off_by_default_and_log_is_one_up_to_l0(name):
    ids = torch.randint(3, 97, (1, 24), generator=torch.Generator().manual_seed(2))
    plain = {"rope_type": name, **PARAMS[name], "original_max_position_embeddings": L0}
    with torch.no_grad():
        default = tiny_model("llama", plain)(ids).logits
        none = tiny_model("llama", {**plain, "attention_temperature": "none"})(ids).logits
        log = tiny_model("llama", rope(name, "log"))(ids).logits
    assert torch.equal(default, none)
    assert torch.equal(log[:, :L0], default[:, :L0]) and not torch.allclose(log[:, L0:], default[:, L0:])


BAD = [  # (extra parameters, key named, what the message says)
    ({"attention_temperature": "cubic"}, "attention_temperature", "one of 'none', 'constant', 'log'"),
    ({"attention_temperature": "constant"}, "temperature_factor", "required with attention_temperature='constant'"),
    ({"attention_temperature": "log", "temperature_factor": 2.0}, "temperature_factor", "allowed only"),
    ({"temperature_factor": 2.0}, "temperature_factor", "allowed only"),
    ({"attention_temperature": "constant", "temperature_factor": 0.5}, "temperature_factor", ">= 1"),
]


@pytest.mark.parametrize("name", ATTENTION_METHODS)
@pytest.mark.parametrize("extra, key, allowed", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_temperature_is_named_before_any_work(name, extra, key, allowed):
    with pytest.raises((ValueError, StrictDataclassError)) as excinfo:
        tiny_config(rope_parameters={"rope_type": name, **PARAMS[name], **extra})
    text = error_text(excinfo)
    assert f"'{key}'" in text and allowed in text and repr(extra.get(key)) in text
