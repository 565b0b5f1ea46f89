"""Frequency-level types against slow formula-by-formula references and transformers' own types."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_config, tiny_model
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from hf_rope_ext.types import registry

FREQUENCY_METHODS = [m for m in registry.methods() if m.kind == "frequency"]
D = 16  # rotary dim of the tiny configs (head_dim 16)


# ----------------------------------------------------------------------------- slow references (plain Python)


def ref_theta(base, d):
    return [base ** (-2 * i / d) for i in range(d // 2)]


def ref_ntk(base, d, s):
    return ref_theta(base * s ** (d / (d - 2)), d)


def ref_correction(rotations, d, base, length):
    return d * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))


def ref_ramp_weight(i, fast, slow, d, base, length):
    """YaRN's ramp in pair-index space: 0 for fast pairs (keep theta), 1 for slow pairs (theta/s)."""
    low = max(math.floor(ref_correction(fast, d, base, length)), 0)
    high = min(math.ceil(ref_correction(slow, d, base, length)), d - 1)
    high = high + 0.001 if high == low else high
    return min(max((i - low) / (high - low), 0.0), 1.0)


def ref_by_parts(base, d, s, length, fast=32, slow=1):
    out = []
    for i, t in enumerate(ref_theta(base, d)):
        w = ref_ramp_weight(i, fast, slow, d, base, length)
        out.append(t * (1 - w) + t / s * w)
    return out


def ref_part_ntk(base, d, s, length, ntk_factor=1.0, extra_factor=1.0):
    theta, ntk = ref_theta(base, d), ref_ntk(base, d, s)
    out = []
    for i in range(d // 2):
        m1 = (1 - ref_ramp_weight(i, 1.25, 0.75, d, base, length)) * ntk_factor
        f = theta[i] / s * (1 - m1) + ntk[i] * m1
        m2 = (1 - ref_ramp_weight(i, 16, 2, d, base, length)) * extra_factor
        out.append(f * (1 - m2) + theta[i] * m2)
    return out


def close(tensor, reference, rtol=1e-6):
    torch.testing.assert_close(tensor.double(), torch.tensor(reference, dtype=torch.float64), rtol=rtol, atol=0)


# ----------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0, 32.0])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_ntk_matches_reference_and_default_with_scaled_base(factor, base):
    params = {"rope_type": "ntk", "factor": factor, "rope_theta": base}
    inv, att = ROPE_INIT_FUNCTIONS["ntk"](tiny_config(rope_parameters=params))
    close(inv, ref_ntk(base, D, factor))
    stock = tiny_model(rope_parameters={"rope_type": "default", "rope_theta": base * factor ** (D / (D - 2))})
    torch.testing.assert_close(inv, stock.model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
    assert att == 1.0


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
@pytest.mark.parametrize("betas", [(32, 1), (16, 2), (64, 0.5)])
@pytest.mark.parametrize("length", [64, 4096])
def test_ntk_by_parts_matches_reference_and_yarn(factor, betas, length):
    fast, slow = betas
    params = {"factor": factor, "beta_fast": fast, "beta_slow": slow, "original_max_position_embeddings": length}
    config = tiny_config(rope_parameters={"rope_type": "ntk_by_parts", **params}, max_position_embeddings=length)
    inv, att = ROPE_INIT_FUNCTIONS["ntk_by_parts"](config)
    close(inv, ref_by_parts(10000.0, D, factor, length, fast, slow))
    yarn = tiny_config(rope_parameters={"rope_type": "yarn", **params}, max_position_embeddings=length)
    yarn_inv, yarn_att = ROPE_INIT_FUNCTIONS["yarn"](yarn)
    torch.testing.assert_close(inv, yarn_inv, rtol=0, atol=0)
    assert att == 1.0 and yarn_att > 1.0


@pytest.mark.parametrize("factor", [2.0, 8.0])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (0.5, 0.0), (0.0, 1.0)])
def test_part_ntk_matches_seed_formula(factor, weights):
    ntk_factor, extra = weights
    params = {"rope_type": "part_ntk", "factor": factor, "ntk_factor": ntk_factor, "extrapolation_factor": extra}
    config = tiny_config(rope_parameters={**params, "original_max_position_embeddings": 2048})
    inv, att = ROPE_INIT_FUNCTIONS["part_ntk"](config)
    close(inv, ref_part_ntk(10000.0, D, factor, 2048, ntk_factor, extra), rtol=1e-5)
    assert att == 1.0


def test_part_ntk_bands_are_linear_ntk_and_unscaled():
    """Lowest frequency interpolated linearly, highest kept, the fastest pairs exactly theta_i."""
    inv, _ = ROPE_INIT_FUNCTIONS["part_ntk"](
        tiny_config(rope_parameters={"rope_type": "part_ntk", "factor": 4.0}, max_position_embeddings=4096)
    )
    theta = torch.tensor(ref_theta(10000.0, D), dtype=torch.float32)
    assert torch.allclose(inv[0], theta[0]) and torch.allclose(inv[-1], theta[-1] / 4, rtol=1e-5)


def test_dynamic_yarn_is_default_up_to_l0_and_yarn_beyond():
    config = tiny_config(rope_parameters={"rope_type": "dynamic_yarn", "original_max_position_embeddings": 64})
    compute = registry.get_method("dynamic_yarn").frequencies
    for seq_len in (None, 1, 32, 64):
        inv, att = compute(config, seq_len=seq_len)
        close(inv, ref_theta(10000.0, D))
        assert att == 1.0
    for k in (2, 3, 4.5, 8):
        inv, att = compute(config, seq_len=torch.tensor(int(k * 64)))
        yarn = tiny_config(
            rope_parameters={"rope_type": "yarn", "factor": float(k), "original_max_position_embeddings": 64}
        )
        yarn_inv, yarn_att = ROPE_INIT_FUNCTIONS["yarn"](yarn)
        torch.testing.assert_close(inv, yarn_inv, rtol=0, atol=0)
        assert att == pytest.approx(yarn_att)


@pytest.mark.parametrize("attention_factor", [None, 1.25])
def test_dynamic_yarns_traced_frequencies_are_its_own_from_a_length_on_the_device(attention_factor):
    """What a call traced by torch.compile rotates by (the length a 0-d tensor, nothing read back) is, bit for bit,
    what the type computes from the length as a number; below, at and past L0 = 64."""
    rope = {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 64, "attention_factor": attention_factor}
    config = tiny_config(rope_parameters={k: v for k, v in rope.items() if v is not None})
    method = registry.get_method("dynamic_yarn")
    for length in (1, 63, 64, 65, 100, 257, 4096):
        inv, factor = method.frequencies(config, seq_len=length)
        traced_inv, traced_factor = method.traced_frequencies(config, None, torch.tensor(length), None)
        torch.testing.assert_close(traced_inv, inv, rtol=0, atol=0)
        assert float(traced_factor) == pytest.approx(factor, rel=1e-15)


# ----------------------------------------------------------------------------- the config keys every type honours


@pytest.mark.parametrize("method", FREQUENCY_METHODS, ids=lambda m: m.name)
def test_partial_rotary_head_dim_and_original_max(method):
    params = registry.example_parameters(method, factor=4.0)
    params["original_max_position_embeddings"] = 32
    base = tiny_config(rope_parameters=params, head_dim=24, max_position_embeddings=128)
    partial = tiny_config(
        rope_parameters={**params, "partial_rotary_factor": 0.5}, head_dim=24, max_position_embeddings=128
    )
    full_inv, _ = method.frequencies(base, seq_len=128)
    half_inv, _ = method.frequencies(partial, seq_len=128)
    assert full_inv.shape == (12,) and half_inv.shape == (6,)
    # the original length enters every schedule except plain ntk: changing it changes the frequencies
    other = tiny_config(
        rope_parameters={**params, "original_max_position_embeddings": 16}, head_dim=24, max_position_embeddings=128
    )
    moved = not torch.equal(method.frequencies(other, seq_len=128)[0], full_inv)
    assert moved == (method.name != "ntk")


@pytest.mark.parametrize("method", FREQUENCY_METHODS, ids=lambda m: m.name)
def test_nested_per_layer_type_parameters(method):
    """Per-layer-type ``rope_parameters`` (as gemma3 uses): each layer type gets its own schedule."""
    params = {**registry.example_parameters(method, factor=4.0), "rope_theta": 10000.0}
    nested = {"full_attention": params, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    try:  # transformers 5.17 cannot validate nested rope_parameters of qwen2 at all (AttributeError in its validator)
        tiny_config(
            "qwen2",
            rope_parameters={k: {"rope_type": "default", "rope_theta": 1e4} for k in nested},
            layer_types=["full_attention", "sliding_attention"],
            use_sliding_window=True,
        )
    except AttributeError:
        pytest.skip("this transformers cannot build a qwen2 config with nested rope_parameters")
    config = tiny_config(
        "qwen2", rope_parameters=nested, layer_types=["full_attention", "sliding_attention"], use_sliding_window=True
    )
    inv_full, _ = ROPE_INIT_FUNCTIONS[method.name](config, layer_type="full_attention", seq_len=256)
    flat = tiny_config("qwen2", rope_parameters=params)
    torch.testing.assert_close(inv_full, ROPE_INIT_FUNCTIONS[method.name](flat, seq_len=256)[0])
