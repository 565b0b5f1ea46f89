"""Layout conversion of tensors and state dicts: round trips, an independent rotation reference, fused qkv,
LoRA merge order, and the errors bad input gets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hf_rope_ext import convert_layout
from hf_rope_ext.layout import convert_tensors
from hf_rope_ext.models import family_of

HIDDEN = 24


def attn_config(model_type="llama", heads=4, kv_heads=4, head_dim=8, partial=1.0, **extra):
    """A config-like object with only what layout conversion reads (head_dim explicit, unlike hidden/heads)."""
    return SimpleNamespace(
        model_type=model_type,
        hidden_size=HIDDEN,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial},
        **extra,
    )


def attn_state_dict(cfg, bias: bool, seed: int = 0, prefix="model.layers.0.self_attn"):
    g = torch.Generator().manual_seed(seed)
    q_rows, kv_rows = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    sd = {
        f"{prefix}.q_proj.weight": torch.randn(q_rows, HIDDEN, generator=g),
        f"{prefix}.k_proj.weight": torch.randn(kv_rows, HIDDEN, generator=g),
        f"{prefix}.v_proj.weight": torch.randn(kv_rows, HIDDEN, generator=g),
        f"{prefix}.o_proj.weight": torch.randn(HIDDEN, q_rows, generator=g),
        "model.embed_tokens.weight": torch.randn(11, HIDDEN, generator=g),
    }
    for name in ("q_proj", "k_proj", "v_proj") if bias else ():
        sd[f"{prefix}.{name}.bias"] = torch.randn(sd[f"{prefix}.{name}.weight"].shape[0], generator=g)
    return sd


# ----------------------------------------------------------------------------- independent references


def meta_rotate(x, positions, theta=10000.0):
    """Meta's LLaMA RoPE on interleaved rows: consecutive pairs (2i, 2i+1) as complex numbers times e^{i m theta_i}.

    x [L, heads, d]; positions [L].
    """
    d = x.shape[-1]
    freqs = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64)[: d // 2] / d))
    cis = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), torch.outer(positions.double(), freqs))
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(xc * cis[:, None, :]).flatten(-2)


def neox_rotate(x, positions, theta=10000.0):
    """GPT-NeoX RoPE on half rows: pair i is (i, i + d/2); written element by element along the pair index."""
    d = x.shape[-1]
    freqs = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64)[: d // 2] / d))
    ang = torch.outer(positions.double(), freqs)[:, None, :]  # [L, 1, d/2]
    a, b = x.double()[..., : d // 2], x.double()[..., d // 2 :]
    return torch.cat((a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()), dim=-1)


def scores(sd, cfg, x, layout, prefix="model.layers.0.self_attn"):
    """Attention logits q.k of one layer with GQA, rotating the first rotary dims in ``layout``; [heads, L, L]."""
    hd, rot = cfg.head_dim, int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"])
    q = x @ sd[f"{prefix}.q_proj.weight"].T + sd.get(f"{prefix}.q_proj.bias", 0)
    k = x @ sd[f"{prefix}.k_proj.weight"].T + sd.get(f"{prefix}.k_proj.bias", 0)
    q, k = q.view(len(x), -1, hd), k.view(len(x), -1, hd)
    positions = torch.arange(len(x))
    rotate = meta_rotate if layout == "interleaved" else neox_rotate
    q = torch.cat((rotate(q[..., :rot], positions), q[..., rot:].double()), dim=-1)
    k = torch.cat((rotate(k[..., :rot], positions), k[..., rot:].double()), dim=-1)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return torch.einsum("qhd,khd->hqk", q, k)


SHAPES = [(4, 4), (4, 2), (6, 1)]  # (query heads, kv heads): MHA, GQA, MQA


@pytest.mark.parametrize("head_dim", [8, 64, 80, 128])
@pytest.mark.parametrize("heads,kv_heads", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_round_trip_is_bit_identical_and_rotation_equivalent(head_dim, heads, kv_heads, bias, partial):
    cfg = attn_config(heads=heads, kv_heads=kv_heads, head_dim=head_dim, partial=partial)
    half = attn_state_dict(cfg, bias)
    inter = convert_layout(half, to="interleaved", config=cfg)
    back = convert_layout(inter, to="half", config=SimpleNamespace(**{**vars(cfg), "rope_layout": "interleaved"}))
    assert half.keys() == back.keys()
    assert all(torch.equal(half[k], back[k]) for k in half)
    moved = {k for k in half if not torch.equal(half[k], inter[k])}
    assert moved == {k for k in half if ".q_proj." in k or ".k_proj." in k}
    # pass-through dims of each head (partial rotary) stay where they were
    rot = int(head_dim * partial)
    for key in moved:
        rows_h = half[key].view(-1, head_dim, *half[key].shape[1:])
        rows_i = inter[key].view(-1, head_dim, *half[key].shape[1:])
        assert torch.equal(rows_h[:, rot:], rows_i[:, rot:])
    # the same attention logits: Meta's complex rotation on interleaved rows == NeoX rotation on half rows
    x = torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(scores(inter, cfg, x, "interleaved"), scores(half, cfg, x, "half"), rtol=1e-9, atol=1e-9)


def test_converting_to_wrong_layout_breaks_the_logits():
    """The reference can fail: half rows under Meta's interleaved rotation do not give the half logits."""
    cfg = attn_config(heads=2, kv_heads=1, head_dim=16)
    half = attn_state_dict(cfg, bias=True)
    x = torch.randn(7, HIDDEN)
    assert not torch.allclose(scores(half, cfg, x, "interleaved"), scores(half, cfg, x, "half"), atol=1e-3)


def test_fused_qkv_equals_separate_projections():
    """Phi-3's fused qkv rows [q | k | v]: q and k blocks move as the separate q_proj/k_proj would, v stays."""
    cfg = attn_config("phi3", heads=4, kv_heads=2, head_dim=16, partial=0.5)
    sep = attn_state_dict(cfg, bias=False)
    p = "model.layers.0.self_attn"
    qkv = torch.cat([sep[f"{p}.{n}_proj.weight"] for n in "qkv"])
    fused = convert_layout({f"{p}.qkv_proj.weight": qkv}, to="interleaved", config=cfg)[f"{p}.qkv_proj.weight"]
    separate = convert_layout(sep, to="interleaved", config=attn_config("llama", 4, 2, 16, 0.5))
    assert torch.equal(fused, torch.cat([separate[f"{p}.{n}_proj.weight"] for n in "qkv"]))
    assert torch.equal(fused[-32:], qkv[-32:])  # v rows


def test_roformer_state_dict_whole_head_and_default_interleaved():
    cfg = SimpleNamespace(model_type="roformer", hidden_size=32, num_attention_heads=4)
    g = torch.Generator().manual_seed(0)
    p = "roformer.encoder.layer.3.attention.self"
    sd = {
        f"{p}.{n}.{w}": torch.randn(32, 32, generator=g) if w == "weight" else torch.randn(32, generator=g)
        for n in ("query", "key", "value")
        for w in ("weight", "bias")
    }
    with pytest.raises(ValueError, match="already in rope_layout='interleaved'"):
        convert_layout(sd, to="interleaved", config=cfg)
    half = convert_layout(sd, to="half", config=cfg)
    moved = {k for k in sd if not torch.equal(sd[k], half[k])}
    assert moved == {f"{p}.{n}.{w}" for n in ("query", "key") for w in ("weight", "bias")}
    head = torch.arange(8)
    expect = torch.cat((head[0::2], head[1::2]))  # half row j <- interleaved 2j, row j+4 <- 2j+1
    assert torch.equal(half[f"{p}.query.bias"].view(4, 8), sd[f"{p}.query.bias"].view(4, 8)[:, expect])


def test_lora_state_dicts_merge_then_convert_equals_convert_then_merge():
    cfg = attn_config(heads=4, kv_heads=2, head_dim=16, partial=0.5)
    base = attn_state_dict(cfg, bias=True)
    g = torch.Generator().manual_seed(3)
    pre = "base_model.model.model.layers.0.self_attn"
    lora = {}
    for n in "qkv":
        out = base[f"model.layers.0.self_attn.{n}_proj.weight"].shape[0]
        lora[f"{pre}.{n}_proj.lora_A.weight"] = torch.randn(4, HIDDEN, generator=g)
        lora[f"{pre}.{n}_proj.lora_B.weight"] = torch.randn(out, 4, generator=g)

    def merged(base_sd, lora_sd):
        out = dict(base_sd)
        for n in "qkv":
            a, b = lora_sd[f"{pre}.{n}_proj.lora_A.weight"], lora_sd[f"{pre}.{n}_proj.lora_B.weight"]
            out[f"model.layers.0.self_attn.{n}_proj.weight"] = (
                base_sd[f"model.layers.0.self_attn.{n}_proj.weight"] + 0.5 * b @ a
            )
        return out

    lora_i = convert_layout(lora, to="interleaved", config=cfg)
    for n in "qkv":
        assert torch.equal(lora_i[f"{pre}.{n}_proj.lora_A.weight"], lora[f"{pre}.{n}_proj.lora_A.weight"])
    assert not torch.equal(lora_i[f"{pre}.q_proj.lora_B.weight"], lora[f"{pre}.q_proj.lora_B.weight"])
    a = convert_layout(merged(base, lora), to="interleaved", config=cfg)
    b = merged(convert_layout(base, to="interleaved", config=cfg), lora_i)
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)


def test_peft_key_spellings_are_matched():
    family = family_of("llama")
    from hf_rope_ext.layout import projection_of

    hits = [
        "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight",
        "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight",
        "base_model.model.model.layers.0.self_attn.k_proj.lora_magnitude_vector",
        "model.layers.0.self_attn.k_proj.lora_magnitude_vector.default.weight",
        "model.layers.12.self_attn.q_proj.bias",
    ]
    misses = [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.self_attn.xq_proj.weight",
        "model.layers.0.self_attn.q_proj.weight_scale",
    ]
    assert all(projection_of(k, family) is not None for k in hits)
    assert all(projection_of(k, family) is None for k in misses)


# ----------------------------------------------------------------------------- bad input


def test_errors_name_what_is_wrong():
    cfg = attn_config(heads=4, kv_heads=2, head_dim=8)
    sd = attn_state_dict(cfg, bias=True)
    with pytest.raises(ValueError, match=r"to='sideways'.*allowed: \['half', 'interleaved'\]"):
        convert_layout(sd, to="sideways", config=cfg)
    with pytest.raises(ValueError, match="already in rope_layout='half'"):
        convert_layout(sd, to="half", config=cfg)
    with pytest.raises(ValueError, match="config=None"):
        convert_layout(sd, to="interleaved")
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*supported model types"):
        convert_layout(sd, to="interleaved", config=attn_config("gpt2"))
    # k_proj has 2 kv heads; a config claiming 4 does not fit its rows
    wrong = attn_config(heads=4, kv_heads=4, head_dim=8)
    with pytest.raises(ValueError, match=r"k_proj.weight: shape \(16, 24\).*num_key_value_heads=4.*need 32 rows"):
        convert_layout(sd, to="interleaved", config=wrong)
    with pytest.raises(ValueError, match="num_attention_heads=4 and num_key_value_heads=3"):
        convert_layout(sd, to="interleaved", config=attn_config(heads=4, kv_heads=3))
    with pytest.raises(ValueError, match="rotary dim=3"):
        convert_layout(sd, to="interleaved", config=attn_config(heads=4, kv_heads=2, head_dim=8, partial=0.375))
    with pytest.raises(ValueError, match="rope_layout='diagonal'"):
        convert_layout(sd, to="half", config=attn_config(rope_layout="diagonal"))
    with pytest.raises(ValueError, match="takes a model or a state dict"):
        convert_layout([1, 2], to="half")


def test_convert_tensors_passes_other_tensors_through_untouched():
    cfg = attn_config(heads=4, kv_heads=2, head_dim=8)
    sd = attn_state_dict(cfg, bias=False)
    out, moved = convert_tensors(sd, family_of("llama"), family_of("llama").head_shape(cfg), "half", "interleaved")
    assert sorted(moved) == sorted(k for k in sd if ".q_proj." in k or ".k_proj." in k)
    assert all(out[k] is sd[k] for k in sd if k not in moved)
