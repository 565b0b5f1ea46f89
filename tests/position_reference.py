"""Attention of layer 0 of a tiny Llama computed pair by pair from a relative position matrix P[m][n] (float64,
nothing shared with the engines): the reference the tests of the position-remapping methods (STRING, Dual Chunk
Attention) hold the model's own attention output to."""

from __future__ import annotations

import torch
from conftest import tiny_model


def attention_by_distance(q, k, v, dist, theta, scale):
    """Causal softmax(q_m . R(-P[m][n] theta) k_n * scale) v, float64, pair by pair (half-rotate layout)."""
    h = q.shape[-1] // 2
    phi = -dist[..., None] * theta  # [q, kv, d/2]
    k1 = k[:, :, None, :, :h] * phi.cos() - k[:, :, None, :, h:] * phi.sin()  # [B, H, q, kv, d/2]
    k2 = k[:, :, None, :, :h] * phi.sin() + k[:, :, None, :, h:] * phi.cos()
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
