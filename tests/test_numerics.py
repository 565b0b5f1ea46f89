"""fp32 angles: a bf16 model's cos/sin at positions past 100k match an fp32/fp64 reference within stated bounds."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers import AutoModelForCausalLM

from hf_rope_ext.types import registry

POSITIONS = torch.arange(100_000, 131_072, 997)[None]  # [1, 32] positions past 100k
# bf16 keeps 8 significant bits: rounding moves a value of magnitude <= scale by at most 2^-8 * scale.
BF16_ROUNDING = 2.0**-8
# fp32 angles at ~1.3e5 rad are off by up to ~1e-2 rad from exact maths (ulp 2^-7 plus theta_i's own rounding).
FP32_ANGLE_ERROR = 1.6e-2


# dynamic types (dynamic_yarn) are rotated inside the attention function, with float64 angles (attention/rotation.py)
STATIC = [m for m in registry.methods() if m.kind == "frequency" and not m.dynamic]


def fp32_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float):
    """cos, sin [..., L, d] ("half" order) from fp32 angles positions [..., L] x inv_freq [d/2], times ``scale``."""
    a = positions[..., None].float() * inv_freq.float()
    a = torch.cat((a, a), dim=-1)
    return a.cos() * scale, a.sin() * scale


@pytest.mark.parametrize("method", STATIC, ids=lambda m: m.name)
def test_bf16_cos_sin_match_fp32_reference_past_100k(method, tmp_path):
    tiny_model("qwen2", registry.example_parameters(method), max_position_embeddings=32768).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    rope = model.model.rotary_emb
    assert rope.inv_freq.dtype == torch.float32  # frequencies stay fp32 in a bf16 model
    x = torch.zeros(1, 1, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = rope(x, POSITIONS)
    assert cos.dtype == torch.bfloat16
    inv, scale = method.frequencies(model.config, seq_len=int(POSITIONS.max()) + 1)
    ref_cos, ref_sin = fp32_cos_sin(POSITIONS, inv, scale)  # transformers' formula, independent of the module
    assert (cos.float() - ref_cos).abs().max() <= BF16_ROUNDING * scale
    assert (sin.float() - ref_sin).abs().max() <= BF16_ROUNDING * scale
    exact = POSITIONS[..., None].double() * inv.double()  # fp64 angles from the same frequencies
    exact = torch.cat((exact, exact), -1)
    assert (cos.double() - exact.cos() * scale).abs().max() <= BF16_ROUNDING * scale + FP32_ANGLE_ERROR


def test_frequencies_are_fp32_under_autocast_and_bf16_default_dtype():
    method = registry.get_method("part_ntk")
    model = tiny_model("llama", registry.example_parameters(method))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inv, _ = method.frequencies(model.config)
    finally:
        torch.set_default_dtype(previous)
    assert inv.dtype == torch.float32
    torch.testing.assert_close(inv, method.frequencies(model.config)[0], rtol=0, atol=0)
