"""The slow references of the attention-level types: float64, pair by pair (every query m against every key n),
nothing shared with the package's factorized implementation (two bands, chunks, reference positions).

- ``distance``: the relative distance each method gives (m, n); ``turn``: pairs turned by an angle.
- ``reference_attention``, registered as the attention implementation ``REFERENCE``: scores every pair as
  q_m . R(-distance(m, n) * theta) k_n, rotating the key pair by pair with an explicit [B, H, q, kv, d/2] angle
  tensor (R(phi) turns each pair by +phi, so with distance m - n this is (R_m q) . (R_n k), plain RoPE). xPos
  multiplies each pair's term by zeta_i^(distance / scale_base); RoPER sums values rotated by -distance * theta.
- ``layer_output_and_reference``: layer 0 of a tiny Llama against attention from a relative position matrix P[m][n]
  (the tests of the position-remapping methods, STRING and Dual Chunk Attention).
"""

from __future__ import annotations

import torch
from conftest import tiny_model
from transformers.modeling_utils import AttentionInterface

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


def attention_by_distance(q, k, v, dist, theta, scale):
    """Causal softmax(q_m . R(-P[m][n] theta) k_n * scale) v, float64, pair by pair (half-rotate layout)."""
    h = q.shape[-1] // 2
    phi = -dist[..., None] * theta  # [q, kv, d/2]
    k1, k2 = turn(k[:, :, None, :, :h], k[:, :, None, :, h:], phi)  # [B, H, q, kv, d/2]
    scores = (q[:, :, :, None, :h] * k1 + q[:, :, :, None, h:] * k2).sum(-1) * scale
    causal = torch.ones(dist.shape, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


def layer_inputs(model, ids):
    """(q, k, v) [B, H, L, d] of layer 0, unrotated, as its attention function receives them."""
    seen, attn = {}, model.model.layers[0].self_attn
    hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
    b, length, _ = hidden.shape
    for name in ("q", "k", "v"):
        proj = getattr(attn, f"{name}_proj")(hidden)
        seen[name] = proj.view(b, length, -1, attn.head_dim).transpose(1, 2).double()
    return seen["q"], seen["k"], seen["v"]


def layer_output_and_reference(
    rope: dict, implementation: str, positions: torch.Tensor, seed: int, theta=None, gain=1.0
):
    """(the attention output of layer 0 [B, H, L, d] float64, the pair-by-pair one from ``positions`` [L, L]) of a
    one-layer Llama with ``rope`` on 2 random sequences of L tokens; ``theta`` [d/2] (default plain RoPE's, base
    10000) and ``gain`` (on the scores) as the method should rotate and scale."""
    length = positions.shape[0]
    model = tiny_model("llama", rope, num_hidden_layers=1, num_key_value_heads=4, attn_implementation=implementation)
    ids = torch.randint(3, 97, (2, length), generator=torch.Generator().manual_seed(seed))
    out = {}
    hook = model.model.layers[0].self_attn.o_proj.register_forward_hook(lambda m, a, o: out.setdefault("x", a[0]))
    with torch.no_grad():
        model(ids)
        q, k, v = layer_inputs(model, ids)
    hook.remove()
    dim = q.shape[-1]
    if theta is None:
        theta = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    expected = attention_by_distance(q, k, v, positions, theta, gain * dim**-0.5)
    return out["x"].view(2, length, -1, dim).transpose(1, 2).double(), expected
