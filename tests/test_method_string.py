"""``string`` (STRING, arXiv 2410.18745) against its paper: the position matrix written entry by entry, attention
computed from it pair by pair in float64 (nothing shared with the engines), and its bad input refused."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

LENGTH = 24


def paper_positions(length: int, shift: int, local: int) -> torch.Tensor:
    """The paper's relative position matrix P[m][n] (m >= n): m - n below the shift S, m - n - S + W from it on."""
    rows = [[(m - n if m - n < shift else m - n - shift + local) if n <= m else 0 for n in range(length)]
            for m in range(length)]  # fmt: skip
    return torch.tensor(rows, dtype=torch.float64)


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


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("shift, local", [(5, 2), (7, 0), (3, 2), (24, 4)])
def test_attention_equals_the_paper_position_matrix(shift, local, implementation):
    rope = {"rope_type": "string", "window": shift, "local_window": local}
    model = tiny_model("llama", rope, num_hidden_layers=1, num_key_value_heads=4, attn_implementation=implementation)
    ids = torch.randint(3, 97, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    attn = model.model.layers[0].self_attn
    out = {}
    hook = attn.o_proj.register_forward_hook(lambda m, args, o: out.setdefault("x", args[0]))
    with torch.no_grad():
        model(ids)
        q, k, v = layer_inputs(model, ids)
    hook.remove()
    dim = q.shape[-1]
    theta = 1.0 / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    expected = attention_by_distance(q, k, v, paper_positions(LENGTH, shift, local), theta, dim**-0.5)
    got = out["x"].view(2, LENGTH, -1, dim).transpose(1, 2)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)


def test_the_position_matrix_reuses_small_distances():
    p = paper_positions(12, 5, 2)
    assert p[4, 0] == 4 and p[5, 0] == 2 and p[11, 0] == 8 and p.max() == 8  # below S exact, then from W on
