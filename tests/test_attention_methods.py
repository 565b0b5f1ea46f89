"""Attention-level rope types against the slow reference of ``pair_reference`` (float64, pair by pair, formula by
formula; nothing in it shared with the package's factorized implementation): on several head shapes, under eager and
sdpa, with left padding, shifted positions, query chunks and packed sequences."""

from __future__ import annotations

import pytest
import torch
from conftest import REFERENCE_PARAMS, logits, logits_with, tiny_model
from pair_reference import REFERENCE

from hf_rope_ext.attention.engine import reference
from hf_rope_ext.types import registry

ATTENTION_METHODS = [m for m in registry.methods() if m.kind == "attention"]
PARAMS = REFERENCE_PARAMS
SHAPES = {  # name -> (family, config overrides): GQA, MHA, explicit head_dim
    "llama-gqa": ("llama", {}),
    "llama-mha": ("llama", {"num_key_value_heads": 4}),
    "mistral-head_dim": ("mistral", {"head_dim": 24}),
}


def with_params(name: str, **extra) -> dict:
    return {"rope_type": name, **PARAMS[name], **extra}


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))


def positions(length: int, start: int = 7) -> torch.Tensor:
    return torch.arange(start, start + length)[None]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_matches_the_slow_reference(method, shape, implementation, ids):
    family, overrides = SHAPES[shape]
    model = tiny_model(family, with_params(method.name), attn_implementation=implementation, **overrides)
    pos = positions(ids.shape[1])
    expected = logits_with(model, REFERENCE, ids, position_ids=pos)
    torch.testing.assert_close(logits(model, ids, position_ids=pos), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_reference_with_distance_m_minus_n_is_stock_transformers(family, ids):
    stock = tiny_model(family)
    model = tiny_model(family, {"rope_type": "rerope", "window": 64})  # identity rotary, unrotated q/k
    model.load_state_dict(stock.state_dict())
    torch.testing.assert_close(logits_with(model, REFERENCE, ids), logits(stock, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize(
    "rope", [{"rope_type": "rerope", "window": 32}, {"rope_type": "leaky_rerope", "window": 3, "factor": 1.0}]
)
def test_rerope_without_its_effect_is_stock_transformers(rope, implementation, ids):
    stock = tiny_model("llama", attn_implementation=implementation)
    model = tiny_model("llama", rope, attn_implementation=implementation)
    model.load_state_dict(stock.state_dict())
    torch.testing.assert_close(logits(model, ids), logits(stock, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_eager_equals_sdpa_with_left_padding(method, ids):
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = {}
    for implementation in ("eager", "sdpa"):
        model = tiny_model("llama", with_params(method.name), attn_implementation=implementation)
        out[implementation] = logits(model, ids, attention_mask=mask, position_ids=pos)
    torch.testing.assert_close(out["eager"][mask.bool()], out["sdpa"][mask.bool()], rtol=0, atol=1e-5)


SHIFT_INVARIANT = {"rerope": 1000, "leaky_rerope": 1000, "xpos": 1000, "roper": 1000, "self_extend": 3 * 333}


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(SHIFT_INVARIANT))
def test_shifting_every_position_leaves_logits_unchanged(name, implementation, ids):
    """Relative methods (RoPER's outputs included); Self-Extend's floor(pos/g) only for shifts by multiples of g."""
    model = tiny_model("llama", with_params(name), attn_implementation=implementation)
    pos = positions(ids.shape[1], start=0)
    torch.testing.assert_close(
        logits(model, ids, position_ids=pos + SHIFT_INVARIANT[name]),
        logits(model, ids, position_ids=pos),
        rtol=0,
        atol=1e-5,
    )


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_query_chunks_give_the_same_logits(method, implementation, ids, monkeypatch):
    model = tiny_model("llama", with_params(method.name), attn_implementation=implementation)
    whole = logits(model, ids)
    monkeypatch.setattr(reference, "SCORE_BUDGET", 2 * 4 * 24 * 2 * 3)  # 3 query rows per chunk
    torch.testing.assert_close(logits(model, ids), whole, rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_packed_sequences_with_restarting_positions(method, implementation, monkeypatch):
    """Two sequences in one row (positions restart, block-diagonal mask) == each run alone; chunks straddle them."""
    monkeypatch.setattr(reference, "SCORE_BUDGET", 4 * 18 * 2 * 4)  # 4 rows per chunk: one chunk holds both
    model = tiny_model("llama", with_params(method.name), attn_implementation=implementation)
    a, b = torch.randint(3, 97, (1, 10)), torch.randint(3, 97, (1, 8))
    segment = torch.cat((torch.zeros(10), torch.ones(8)))
    block = ((segment[:, None] == segment[None, :]) & torch.ones(18, 18, dtype=torch.bool).tril())[None, None]
    mask = (
        block
        if implementation == "sdpa"
        else torch.zeros(block.shape).masked_fill(~block, torch.finfo(torch.float32).min)
    )
    pos = torch.cat((torch.arange(10), torch.arange(8)))[None]
    packed = logits(model, torch.cat((a, b), 1), attention_mask=mask, position_ids=pos)
    torch.testing.assert_close(packed, torch.cat((logits(model, a), logits(model, b)), 1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-6), (torch.bfloat16, 4 * 2**-8)])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_xpos_near_128k_is_finite_and_matches_float64(implementation, dtype, bound, ids):
    """Positions 131000..131023 with scale_base 512: the absolute zeta^(-n/512) form is ~1e139 and overflows.

    Bound: |attention output - float64 reference| <= bound * max|reference| per layer, on the same (rounded)
    inputs: 1e-6 in float32 (measured 1.5e-7), four bfloat16 steps 4 * 2^-8 in bfloat16 (measured 6.5e-3).
    """
    model = tiny_model("llama", {"rope_type": "xpos", "scale_base": 512.0}, attn_implementation=implementation).to(
        dtype
    )
    attention = model.model.layers[0].self_attn
    hidden = torch.randn(2, 24, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    pos = positions(24, start=131_000)
    out = {}
    for name in (implementation, REFERENCE):
        model.set_attn_implementation(name)
        with torch.no_grad():
            out[name] = attention(
                hidden, position_embeddings=model.model.rotary_emb(hidden, pos), position_ids=pos, attention_mask=None
            )[0].double()
    assert torch.isfinite(out[implementation]).all()
    error = (out[implementation] - out[REFERENCE]).abs().max() / out[REFERENCE].abs().max()
    assert error <= bound, f"relative error {error:.2e} > {bound:g}"
