"""Running interleaved checkpoints (config.rope_layout) and converting live models, against references written here:
Meta's LLaMA forward (RoPE as complex multiplication of consecutive pairs) and the classic per-head row permutation."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from conftest import FAMILIES, TINY, tiny_config
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, RoFormerConfig, RoFormerModel

from hf_rope_ext import convert_layout
from hf_rope_ext.attention.layer import routes_through_attention
from hf_rope_ext.types import registry
from hf_rope_ext.types.registry import REQUIRED

IDS = torch.tensor([[5, 17, 3, 88, 42, 9, 61, 23, 7, 30, 11, 2]])
LAYOUT_FAMILIES = sorted(FAMILIES) + ["phi3"]


# ----------------------------------------------------------------------------- references


def ref_to_interleaved(t: torch.Tensor, heads: int, rot: int) -> torch.Tensor:
    """Half -> interleaved rows of ``heads`` heads, first ``rot`` dims of each: (j, j+rot/2) -> (2j, 2j+1)."""
    h = t.reshape(heads, -1, *t.shape[1:])
    moved = h[:, :rot].reshape(heads, 2, rot // 2, *t.shape[1:]).transpose(1, 2).reshape(heads, rot, *t.shape[1:])
    return torch.cat((moved, h[:, rot:]), dim=1).reshape(t.shape)


def ref_checkpoint_to_interleaved(sd: dict, cfg) -> dict:
    """Every rotated tensor of a saved half checkpoint, rewritten by hand per family."""
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    partial = cfg.rope_parameters.get("partial_rotary_factor") or getattr(cfg, "partial_rotary_factor", None) or 1.0
    rot = int(hd * partial)
    heads = {"q": cfg.num_attention_heads, "k": cfg.num_key_value_heads}
    out = dict(sd)
    for key, t in sd.items():
        if ".qkv_proj." in key:  # Phi-3: [q | k | v]
            q, k, v = t.split([heads["q"] * hd, heads["k"] * hd, heads["k"] * hd])
            out[key] = torch.cat((ref_to_interleaved(q, heads["q"], rot), ref_to_interleaved(k, heads["k"], rot), v))
        elif ".q_proj." in key or ".k_proj." in key:
            out[key] = ref_to_interleaved(t, heads[key.split(".")[-2][0]], rot)
        elif ".q_norm." in key or ".k_norm." in key:  # Qwen3: one head's per-dim weight
            out[key] = ref_to_interleaved(t, 1, rot)
    return out


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def meta_llama_logits(sd: dict, cfg, ids, inv_freq, scaling=1.0):
    """Meta's LLaMA forward on an interleaved checkpoint (HF key names): pairs (2i, 2i+1) times e^{i m theta_i}.

    Computed in float64, returned in float32.
    """
    sd = {k: v.double() for k, v in sd.items()}
    heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n = ids.shape[-1]
    angles = torch.outer(torch.arange(n).double(), inv_freq.double())
    cis = scaling * torch.polar(torch.ones(n, hd // 2, dtype=torch.float64), angles)

    def lin(x, name):
        return x @ sd[f"{name}.weight"].T + sd.get(f"{name}.bias", 0)

    def rope(x):  # x [n, heads, hd]
        xc = torch.view_as_complex(x.reshape(n, x.shape[1], hd // 2, 2).contiguous())
        return torch.view_as_real(xc * cis[:, None, :]).flatten(-2)

    x = sd["model.embed_tokens.weight"][ids[0]]
    mask = torch.full((n, n), float("-inf")).triu(1)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        h = rms(x, sd[f"{p}.input_layernorm.weight"], cfg.rms_norm_eps)
        q = rope(lin(h, f"{p}.self_attn.q_proj").view(n, heads, hd))
        k = rope(lin(h, f"{p}.self_attn.k_proj").view(n, kv, hd)).repeat_interleave(heads // kv, 1)
        v = lin(h, f"{p}.self_attn.v_proj").view(n, kv, hd).repeat_interleave(heads // kv, 1)
        att = (torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask).softmax(-1)
        x = x + lin(torch.einsum("hqk,khd->qhd", att, v).reshape(n, heads * hd), f"{p}.self_attn.o_proj")
        h = rms(x, sd[f"{p}.post_attention_layernorm.weight"], cfg.rms_norm_eps)
        x = x + lin(
            torch.nn.functional.silu(lin(h, f"{p}.mlp.gate_proj")) * lin(h, f"{p}.mlp.up_proj"), f"{p}.mlp.down_proj"
        )
    return (rms(x, sd["model.norm.weight"], cfg.rms_norm_eps) @ sd["lm_head.weight"].T).float()


def randomize_(model, seed=1):
    """Random values everywhere: biases (0 by default) and norm weights (1 by default) included."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # RoFormer's sinusoidal table is the rotation itself
                continue
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if "norm" in name.lower() else 0.0))
    return model


def logits(model):
    with torch.no_grad():
        return model(IDS).logits[0]


# what each family needs beyond conftest's tiny config so that every rotated tensor kind is present
EXTRA = {
    "llama": {"attention_bias": True},
    "stablelm": {"use_qkv_bias": True},
    "phi3": {"partial_rotary_factor": 0.5, "pad_token_id": 0},
}


def family_model(family, rope_parameters=None):
    kwargs = {**TINY, **FAMILIES.get(family, {}), **EXTRA.get(family, {})}
    if rope_parameters is not None:
        kwargs["rope_parameters"] = dict(rope_parameters)
    config = AutoConfig.for_model(family, **kwargs)
    return randomize_(AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval())


def write_interleaved(model, half_dir, out_dir):
    """A checkpoint as an interleaved-layout tool would write it: rows permuted by hand, rope_layout recorded."""
    model.save_pretrained(half_dir)
    sd = load_file(half_dir / "model.safetensors")
    out_dir.mkdir()
    save_file(ref_checkpoint_to_interleaved(sd, model.config), out_dir / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((half_dir / "config.json").read_text())
    (out_dir / "config.json").write_text(json.dumps({**config, "rope_layout": "interleaved"}))
    return sd


# ----------------------------------------------------------------------------- rope types under test


def _registry_params(method) -> dict:
    params = {"rope_type": method.name, "rope_theta": 10000.0}
    for key, spec in method.params.items():
        if spec.default is REQUIRED:
            params[key] = method.example.get(key, 2.0 if spec.kind == "number" else 8)
    return params


BUILTIN = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 32},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 2.0,
        "original_max_position_embeddings": 32,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
        "original_max_position_embeddings": 32,
    },
}
ROPE_TYPES = {**BUILTIN, **{m.name: _registry_params(m) for m in registry.methods()}}
FREQUENCY_LEVEL = set(BUILTIN) | {m.name for m in registry.methods() if m.kind == "frequency"}


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_converted_checkpoint_gives_meta_reference_logits(family):
    model = family_model(family)
    half = model.state_dict()
    inter = convert_layout(half, to="interleaved", config=model.config)
    rotary = model.model.rotary_emb
    ref = meta_llama_logits(inter, model.config, IDS, rotary.inv_freq, rotary.attention_scaling)
    torch.testing.assert_close(logits(model), ref, rtol=1e-5, atol=1e-5)
    # and the reference can tell layouts apart: half rows under Meta's rotation are wrong
    assert not torch.allclose(meta_llama_logits(half, model.config, IDS, rotary.inv_freq), ref, atol=1e-3)
    # back to half: bit-identical
    back = convert_layout(inter, to="half", config=copy.copy(model.config), source="interleaved")
    assert all(torch.equal(back[k], half[k]) for k in half)


@pytest.mark.parametrize("rope_type", sorted(ROPE_TYPES))
def test_interleaved_runtime_for_every_rope_type(rope_type, tmp_path):
    stock = family_model("llama", ROPE_TYPES[rope_type])
    write_interleaved(stock, tmp_path / "half", tmp_path / "inter")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "inter", attn_implementation="eager").eval()
    assert loaded.config.rope_layout == "interleaved"
    assert loaded.config.rope_parameters["rope_type"] == rope_type
    torch.testing.assert_close(logits(loaded), logits(stock), rtol=0, atol=0)
    if rope_type in FREQUENCY_LEVEL:  # Meta's forward on the interleaved file itself
        inter = load_file(tmp_path / "inter" / "model.safetensors")
        inv_freq, scale = loaded.model.rotary_emb.inv_freq, loaded.model.rotary_emb.attention_scaling
        if routes_through_attention(rope_type, loaded.config):  # dynamic_yarn: rotated in the attention function
            inv_freq, scale = registry.get_method(rope_type).frequencies(loaded.config, seq_len=IDS.shape[1])
        ref = meta_llama_logits(inter, loaded.config, IDS, inv_freq, scale)
        torch.testing.assert_close(logits(loaded), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", LAYOUT_FAMILIES)
def test_interleaved_checkpoint_of_every_family_loads_saves_and_reloads(family, tmp_path):
    stock = family_model(family)
    write_interleaved(stock, tmp_path / "half", tmp_path / "inter")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "inter", attn_implementation="eager").eval()
    torch.testing.assert_close(logits(loaded), logits(stock), rtol=0, atol=0)
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), stock.state_dict().values(), strict=True)
    )
    # save keeps the layout: the same interleaved tensors, sharded, and rope_layout in config.json
    loaded.save_pretrained(tmp_path / "again", max_shard_size="40KB")
    assert (tmp_path / "again" / "model.safetensors.index.json").is_file()
    assert json.loads((tmp_path / "again" / "config.json").read_text())["rope_layout"] == "interleaved"
    saved = {}
    for shard in (tmp_path / "again").glob("*.safetensors"):
        saved |= load_file(shard)
    original = load_file(tmp_path / "inter" / "model.safetensors")
    assert saved.keys() == original.keys()
    assert all(torch.equal(saved[k], original[k]) for k in original)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "again", attn_implementation="eager").eval()
    torch.testing.assert_close(logits(reloaded), logits(stock), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "phi3", "qwen3"])
@pytest.mark.parametrize("loaded", [False, True], ids=["from_config", "from_pretrained"])
def test_converting_a_live_model_changes_what_it_saves_not_its_logits(family, loaded, tmp_path):
    model = family_model(family)
    if loaded:  # a loaded model saves through the conversions it recorded at load time
        model.save_pretrained(tmp_path / "stock")
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "stock", attn_implementation="eager").eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = logits(model)
    assert convert_layout(model, to="interleaved") is model
    assert model.config.rope_layout == "interleaved"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # in memory: still half
    torch.testing.assert_close(logits(model), out, rtol=0, atol=0)
    with pytest.raises(ValueError, match="already in rope_layout='interleaved'"):
        convert_layout(model, to="interleaved")
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    expected = ref_checkpoint_to_interleaved(before, model.config)
    assert all(torch.equal(saved[k], expected[k]) for k in saved)
    assert any(not torch.equal(saved[k], before[k]) for k in saved)
    # and back: a half checkpoint again
    convert_layout(model, to="half")
    model.save_pretrained(tmp_path / "half")
    assert all(torch.equal(v, before[k]) for k, v in load_file(tmp_path / "half" / "model.safetensors").items())


def _layout_ops(transforms) -> list:
    from hf_rope_ext._transformers.conversions import RopeLayoutToHalf

    return [op for t in transforms for op in getattr(t, "operations", ()) if isinstance(op, RopeLayoutToHalf)]


def test_stock_models_load_and_save_bit_identically(tmp_path):
    """A half (stock) model: no layout op on load or save, files and weights as stock."""
    from transformers import conversion_mapping

    from hf_rope_ext._transformers import install

    model = family_model("llama")
    install()  # idempotent: the lookup is wrapped once
    assert not hasattr(conversion_mapping.get_model_conversion_mapping.hf_rope_ext_stock, "hf_rope_ext_stock")
    assert conversion_mapping.get_model_conversion_mapping(model, add_legacy=False) == []
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "rope_layout" not in json.loads((tmp_path / "config.json").read_text())
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert _layout_ops(loaded._weight_conversions) == []
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True)
    )


def test_transformers_registry_is_left_as_it_was():
    """Nothing is registered by model type: stock checkpoints of every family see transformers' own mapping."""
    from transformers.conversion_mapping import _build_checkpoint_conversion_mapping, get_checkpoint_conversion_mapping

    from hf_rope_ext.models import layout_families

    original = _build_checkpoint_conversion_mapping()
    for family in layout_families():
        for model_type in family.model_types:
            assert repr(get_checkpoint_conversion_mapping(model_type)) == repr(original.get(model_type))


@pytest.mark.parametrize(
    ("family", "extra", "patterns"),
    [
        ("llama", {"attention_bias": False}, ["self_attn.q_proj.weight", "self_attn.k_proj.weight"]),
        (
            "qwen2",
            {},
            ["self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias"],
        ),
    ],
)
def test_interleaved_models_get_one_converter_per_tensor_they_have(family, extra, patterns, tmp_path):
    """Bias patterns only where the model has biases (transformers rejects a pattern that matches no key)."""
    from transformers import conversion_mapping

    model = family_model(family)
    for key, value in extra.items():
        setattr(model.config, key, value)
    model = AutoModelForCausalLM.from_config(model.config)
    assert conversion_mapping.get_model_conversion_mapping(model, add_legacy=False) == []
    model.config.rope_layout = "interleaved"
    found = conversion_mapping.get_model_conversion_mapping(model, add_legacy=False)
    assert [p for t in found for p in t.source_patterns] == patterns
    assert len(_layout_ops(found)) == len(patterns)
    # every pattern matches a key of the file the model writes
    model.save_pretrained(tmp_path)
    keys = load_file(tmp_path / "model.safetensors").keys()
    assert all(any(k.endswith(p) for k in keys) for p in patterns)


# ----------------------------------------------------------------------------- RoFormer (interleaved natively)


def tiny_roformer():
    torch.manual_seed(0)
    cfg = RoFormerConfig(
        vocab_size=50,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=48,
        num_hidden_layers=1,
        embedding_size=32,
    )
    return randomize_(RoFormerModel(cfg).eval())


def test_roformer_live_conversion_permutes_whole_heads_in_place():
    model = tiny_roformer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="already in rope_layout='interleaved'"):
        convert_layout(model, to="interleaved")
    convert_layout(model, to="half")
    assert model.config.rope_layout == "half"
    after = model.state_dict()
    for key, t in before.items():
        if ".self.query." in key or ".self.key." in key:  # interleaved -> half, whole heads of 8
            assert torch.equal(ref_to_interleaved(after[key], 4, 8), t)
            assert not torch.equal(after[key], t)
        else:
            assert torch.equal(after[key], t)
    convert_layout(model, to="interleaved")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_roformer_converted_in_memory_runs_the_same():
    """With RoFormer's layout-aware runtime (hf_rope_ext.attention.roformer): converted weights, same outputs."""
    model = tiny_roformer()
    ids = IDS % model.config.vocab_size
    with torch.no_grad():
        before = model(ids).last_hidden_state
        convert_layout(model, to="half")
        torch.testing.assert_close(model(ids).last_hidden_state, before, rtol=1e-5, atol=1e-5)
        model.config.rope_layout = "interleaved"  # a wrong record is visible in the outputs
        assert not torch.allclose(model(ids).last_hidden_state, before, atol=1e-3)


# ----------------------------------------------------------------------------- peft


def lora(model, targets):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(4)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))


def test_roformer_peft_convert_then_merge_equals_merge_then_convert():
    peft_model = lora(tiny_roformer(), ["query", "key", "value"])
    a_before = {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_A" in k}
    b_before = {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_B" in k and ".value." not in k}
    merged_first = convert_layout(copy.deepcopy(peft_model).merge_and_unload(), to="half")
    converted_first = convert_layout(peft_model, to="half")
    assert all(torch.equal(converted_first.state_dict()[k], v) for k, v in a_before.items())
    assert all(not torch.equal(converted_first.state_dict()[k], v) for k, v in b_before.items())
    merged_after = converted_first.merge_and_unload()
    for key, value in merged_first.state_dict().items():
        torch.testing.assert_close(merged_after.state_dict()[key], value, rtol=0, atol=1e-6)
    assert merged_after.config.rope_layout == "half"


def test_llama_peft_model_and_adapter(tmp_path):
    """Llama in memory stays half: converting a peft model records the layout its merged checkpoint is saved in."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict

    peft_model = lora(family_model("llama"), ["q_proj", "k_proj", "v_proj"])
    adapter = {k: v.clone() for k, v in get_peft_model_state_dict(peft_model).items()}
    peft_model.save_pretrained(tmp_path / "adapter")
    merged_first = copy.deepcopy(peft_model).merge_and_unload()
    convert_layout(merged_first, to="interleaved")
    convert_layout(peft_model, to="interleaved")
    assert all(torch.equal(get_peft_model_state_dict(peft_model)[k], v) for k, v in adapter.items())
    merged_after = peft_model.merge_and_unload()
    merged_first.save_pretrained(tmp_path / "a")
    merged_after.save_pretrained(tmp_path / "b")
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)
    # a stock adapter still loads unchanged onto a stock base although llama now has a conversion mapping
    fresh = PeftModel.from_pretrained(family_model("llama"), tmp_path / "adapter")
    assert all(torch.equal(get_peft_model_state_dict(fresh)[k], v) for k, v in adapter.items())


def test_model_errors():
    model = family_model("llama")
    with pytest.raises(ValueError, match="config= is for state dicts"):
        convert_layout(model, to="interleaved", config=tiny_config("llama"))
    with pytest.raises(ValueError, match="source='half' is for state dicts only"):
        convert_layout(model, to="interleaved", source="half")
    with pytest.raises(ValueError, match=r"to='Half'"):
        convert_layout(model, to="Half")
    model.config.num_key_value_heads = 4  # the k_proj rows hold 2 kv heads
    with pytest.raises(ValueError, match=r"k_proj.weight: shape \(32, 64\)"):
        convert_layout(model, to="interleaved")
    assert getattr(model.config, "rope_layout", None) is None  # nothing recorded on failure
