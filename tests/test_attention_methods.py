"""Attention-level rope types against a slow reference written here, formula by formula.

The reference scores every (query m, key n) pair as q_m . R(-distance(m, n) * theta) k_n, rotating the key pair
by pair with an explicit [B, H, q, kv, d/2] angle tensor in float64 (R(phi) turns each pair by +phi, so with
distance m - n this is (R_m q) . (R_n k), plain RoPE). xPos multiplies each pair's term by
zeta_i^(distance / scale_base); RoPER sums values rotated by -distance * theta. Nothing in it is shared with
the package's factorized implementation (two bands, chunks, reference positions).
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers.modeling_utils import AttentionInterface

from hf_rope_ext.attention.engine import reference
from hf_rope_ext.types import registry

ATTENTION_METHODS = [m for m in registry.methods() if m.kind == "attention"]
# parameters that make every band matter in 24 tokens
PARAMS = {
    "dual_chunk": {"chunk_size": 7, "local_size": 2},
    "rerope": {"window": 5},
    "leaky_rerope": {"window": 5, "factor": 2.5},
    "self_extend": {"window": 5, "group_size": 3},
    "string": {"window": 5, "local_window": 2},
    "xpos": {"scale_base": 8.0, "gamma": 0.4},
    "roper": {"value_rotary_factor": 0.5},
}
SHAPES = {  # name -> (family, config overrides): GQA, MHA, explicit head_dim
    "llama-gqa": ("llama", {}),
    "llama-mha": ("llama", {"num_key_value_heads": 4}),
    "mistral-head_dim": ("mistral", {"head_dim": 24}),
}
REFERENCE = "hf_rope_ext_test_reference"


def distance(name: str, params: dict, m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The relative distance each method gives a query at m and a key at n (float64)."""
    d = m - n
    if name == "rerope":
        return torch.clamp(d, max=params["window"])
    if name == "leaky_rerope":
        w, f = params["window"], params["factor"]
        return torch.where(d < w, d, w + (d - w) / f)
    if name == "self_extend":
        w, g = params["window"], params["group_size"]
        return torch.where(d < w, d, torch.floor(m / g) - torch.floor(n / g) + w - w // g)
    if name == "dual_chunk":  # keys at n mod c; the query by chunk gap (intra, successive, inter)
        size, c = params["chunk_size"], params["chunk_size"] - params["local_size"]
        g = torch.floor(m / c) - torch.floor(n / c)
        query = torch.where(g == 0, m % c, torch.where(g == 1, (m % c + c).clamp(max=size), min(2 * c - 1, size)))
        return query - n % c
    if name == "string":
        shift, local = params["window"], params["local_window"]
        return torch.where(d < shift, d, d - shift + local)
    return d


def turn(x1, x2, phi):
    """Each pair (x1_i, x2_i) turned by phi_i."""
    return x1 * phi.cos() - x2 * phi.sin(), x1 * phi.sin() + x2 * phi.cos()


def reference_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, position_ids=None, **kw):
    """Float64, pair by pair; no cache (keys hold the positions of the queries)."""
    params = {"scale_base": 512.0, "gamma": 0.4, **module.config.rope_parameters}  # the xPos defaults
    name = params["rope_type"]
    groups = query.shape[1] // key.shape[1]
    q, k, v = (t.double() for t in (query, key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)))
    b, _, length, dim = q.shape
    pos = position_ids.expand(b, length).double()
    dist = distance(name, params, pos[:, None, :, None], pos[:, None, None, :])  # [B, 1, q, kv]
    theta = 1.0 / params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    phi = -dist[..., None] * theta  # [B, 1, q, kv, d/2]
    h = dim // 2
    k1, k2 = turn(k[:, :, None, :, :h], k[:, :, None, :, h:], phi)  # keys turned per (query, key) pair
    terms = q[:, :, :, None, :h] * k1 + q[:, :, :, None, h:] * k2  # [B, H, q, kv, d/2]
    if name == "xpos":
        zeta = (torch.arange(h, dtype=torch.float64) * 2 / dim + params["gamma"]) / (1 + params["gamma"])
        terms = terms * zeta ** (dist.clamp(min=0)[..., None] / params["scale_base"])
    scores = terms.sum(-1) * scaling
    allowed = torch.ones(length, length, dtype=torch.bool).tril() if attention_mask is None else attention_mask
    if allowed.dtype != torch.bool:
        allowed = allowed > torch.finfo(allowed.dtype).min / 2
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    if name == "roper":  # the first r_v = 2 floor(f d / 2) value dims, their own theta_j = b^(-2j/r_v)
        rv = 2 * int(params["value_rotary_factor"] * dim // 2)
        theta_v = 1.0 / params["rope_theta"] ** (torch.arange(0, rv, 2, dtype=torch.float64) / rv)
        phi_v = -dist[..., None] * theta_v
        v1, v2 = turn(v[:, :, None, :, : rv // 2], v[:, :, None, :, rv // 2 : rv], phi_v)  # v_n by (n - m) theta
        rest = v[:, :, None, :, rv:].expand(*v1.shape[:-1], dim - rv)
        out = torch.einsum("bhqk,bhqkd->bhqd", weights, torch.cat((v1, v2, rest), -1))
    else:
        out = weights @ v
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


AttentionInterface.register(REFERENCE, reference_attention)


def with_params(name: str, **extra) -> dict:
    return {"rope_type": name, **PARAMS[name], **extra}


def logits(model, ids, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, **kwargs).logits


def run_reference(model, ids, **kwargs) -> torch.Tensor:
    implementation = model.config._attn_implementation
    model.set_attn_implementation(REFERENCE)
    try:
        return logits(model, ids, **kwargs)
    finally:
        model.set_attn_implementation(implementation)


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
    expected = run_reference(model, ids, position_ids=pos)
    torch.testing.assert_close(logits(model, ids, position_ids=pos), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_reference_with_distance_m_minus_n_is_stock_transformers(family, ids):
    stock = tiny_model(family)
    model = tiny_model(family, {"rope_type": "rerope", "window": 64})  # identity rotary, unrotated q/k
    model.load_state_dict(stock.state_dict())
    torch.testing.assert_close(run_reference(model, ids), logits(stock, ids), rtol=0, atol=1e-5)


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
