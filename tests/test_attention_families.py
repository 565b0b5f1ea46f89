"""Attention-level rope types on every family the attention function serves, and ``dynamic_yarn`` giving the same
output for the same input whatever came before, on every family.

The reference scores every (query m, key n) pair pair by pair in float64 (with ``pair_reference``'s distances and
turns), extended with what the families add: partial rotary (dims past the rotary dim unrotated), the family's own
softmax scale (Gemma's query_pre_attn_scalar, Granite's attention_multiplier), Gemma 2's score softcap, sliding
windows (from the ``sliding_window`` the layer passes, mask built here from indices), rope parameters per layer
type (Gemma 3's local/global thetas). It never reads the model's mask or the package's code.
"""

from __future__ import annotations

import pytest
import torch
from conftest import REFERENCE_PARAMS, TINY, error_text, generate_left_padded, logits, logits_with
from huggingface_hub.errors import StrictDataclassError
from pair_reference import distance, turn  # the pair-by-pair distances and turns of each method
from transformers import AutoConfig, AutoModelForCausalLM, RoFormerConfig, RoFormerForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from hf_rope_ext.attention.engine import rotated_cache
from hf_rope_ext.attention.methods.params import FAMILIES
from hf_rope_ext.types import registry

ATTENTION_METHODS = [m.name for m in registry.methods() if m.kind == "attention"]
PARAMS = {**REFERENCE_PARAMS, "roper": {"value_rotary_factor": 1.0}}  # the reference turns values as keys
# family -> config beyond conftest's TINY that makes its peculiarity matter in 24 tokens (windows of 6)
SETUPS = {
    "arcee": {},
    "exaone4": {"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]},  # global layer NoPE
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 24, "query_pre_attn_scalar": 20, "sliding_window": 6, "attn_logit_softcapping": 2.0},
    "gemma3_text": {
        "head_dim": 16,
        "query_pre_attn_scalar": 20,
        "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "gpt_neox": {"num_key_value_heads": 4},  # fused query_key_value, 25% rotary
    "granite": {"attention_multiplier": 0.2},
    "granitemoe": {"attention_multiplier": 0.2, "num_local_experts": 2},
    "llama": {},
    "ministral": {"head_dim": 16, "sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]},
    "mistral": {"sliding_window": 6, "head_dim": 24},
    "mixtral": {"sliding_window": 6, "num_local_experts": 2},
    "olmo": {"clip_qkv": 0.5},
    "olmo2": {},
    "olmo3": {"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]},
    "phi": {"partial_rotary_factor": 0.5, "qk_layernorm": True},
    "phi3": {"partial_rotary_factor": 0.5, "sliding_window": 6, "pad_token_id": 0},
    "qwen2": {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
    "qwen2_moe": {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32},
    "qwen3": {"head_dim": 24},
    "qwen3_moe": {"head_dim": 24, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32},
    "seed_oss": {},
    "smollm3": {"pad_token_id": 0, "no_rope_layers": [1, 0]},  # second layer NoPE
    "stablelm": {"partial_rotary_factor": 0.5, "qk_layernorm": True},
    "starcoder2": {"sliding_window": 6},
}
EAGER_ONLY = {"gemma2"}  # transformers refuses sdpa for Gemma 2 (score softcapping)
REFERENCE = "hf_rope_ext_test_family_reference"
kept_by_cache = rotated_cache.kept_by_cache


def test_setups_cover_every_supported_family():
    assert set(SETUPS) == set(FAMILIES)
    assert {"qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "stablelm", "olmo2", "granite"} <= set(FAMILIES)


def rope_parameters(config, rope: dict) -> dict:
    """``rope`` over the config's own parameters; per layer type when nested (each keeps its own theta)."""
    current = config.rope_parameters
    nested = [t for t in set(getattr(config, "layer_types", None) or ()) if isinstance(current.get(t), dict)]
    if nested:
        return {t: {**current[t], **rope} for t in nested}
    return {**current, **rope}


def build(family: str, rope: dict | None = None, implementation: str = "eager", seed: int = 0, **overrides):
    """A tiny model of ``family``. Phi3Config's own check accepts only rope_type default/longrope at construction,
    so, as ``from_pretrained(path, rope_parameters=...)`` does, the rope parameters are set on the built config."""
    kwargs = {**TINY, **SETUPS[family], **overrides}
    config = AutoConfig.for_model(family, **kwargs)
    if rope is not None:
        params = rope_parameters(config, rope)
        if family == "phi3":
            config.rope_parameters = params
        else:
            config = AutoConfig.for_model(family, **kwargs, rope_parameters=params)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation).eval()


# ---------------------------------------------------------------------------------------------------------------
# the slow reference


def layer_params(module) -> dict:
    params, layer_types = module.config.rope_parameters, getattr(module.config, "layer_types", None)
    if layer_types is not None and isinstance(params.get(layer_types[module.layer_idx]), dict):
        return params[layer_types[module.layer_idx]]
    return params


def family_rotates(module) -> bool:
    """As the families' modeling files decide: SmolLM3's no_rope_layers, EXAONE 4's global layers with a window."""
    config = module.config
    if config.model_type == "smollm3":
        return bool(config.no_rope_layers[module.layer_idx])
    if config.model_type == "exaone4":
        return config.sliding_window is None or config.layer_types[module.layer_idx] == "sliding_attention"
    return True


def reference_attention(
    module, query, key, value, attention_mask, scaling, dropout=0.0, position_ids=None, softcap=None, **kwargs
):
    """Float64, pair by pair, no cache, no padding. A layer whose type is not the package's got q/k rotated by the
    model, a NoPE layer none: their scores are plain dot products."""
    params = {"scale_base": 512.0, "gamma": 0.4, **layer_params(module)}
    name = params["rope_type"]
    groups = query.shape[1] // key.shape[1]
    q, k, v = (t.double() for t in (query, key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)))
    b, _, length, dim = q.shape
    r = int(dim * (params.get("partial_rotary_factor") or 1.0))  # rotary dims: pairs (i, i + r/2), i < r/2
    h = r // 2
    pos = position_ids.expand(b, length).double()
    dist = distance(name, params, pos[:, None, :, None], pos[:, None, None, :])  # [B, 1, q, kv]
    theta = 1.0 / params["rope_theta"] ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    phi = -dist[..., None] * theta * (name in PARAMS and family_rotates(module))  # [B, 1, q, kv, r/2]
    k1, k2 = turn(k[:, :, None, :, :h], k[:, :, None, :, h:r], phi)  # keys turned per (query, key) pair
    terms = q[:, :, :, None, :h] * k1 + q[:, :, :, None, h:r] * k2  # [B, H, q, kv, r/2]
    if name == "xpos" and family_rotates(module):
        zeta = (torch.arange(h, dtype=torch.float64) * 2 / r + params["gamma"]) / (1 + params["gamma"])
        terms = terms * zeta ** (dist.clamp(min=0)[..., None] / params["scale_base"])
    scores = (terms.sum(-1) + q[..., r:] @ k[..., r:].transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    i = torch.arange(length)
    allowed = i[None, :] <= i[:, None]
    if kwargs.get("sliding_window") is not None:
        allowed = allowed & (i[:, None] - i[None, :] < kwargs["sliding_window"])
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    if name == "roper" and family_rotates(module):
        v1, v2 = turn(v[:, :, None, :, :h], v[:, :, None, :, h:r], phi)  # v_n turned by (n - m) theta
        rest = v[:, :, None, :, r:].expand(*v1.shape[:-1], dim - r)
        out = torch.einsum("bhqk,bhqkd->bhqd", weights, torch.cat((v1, v2, rest), -1))
    else:
        out = weights @ v
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


AttentionInterface.register(REFERENCE, reference_attention)


IDS = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))
CASES = [(f, i) for f in sorted(FAMILIES) for i in ("eager", "sdpa") if not (i == "sdpa" and f in EAGER_ONLY)]


@pytest.mark.parametrize("family, implementation", CASES, ids=[f"{f}-{i}" for f, i in CASES])
@pytest.mark.parametrize("name", ATTENTION_METHODS)
def test_matches_the_slow_reference(family, implementation, name):
    model = build(family, {"rope_type": name, **PARAMS[name]}, implementation)
    pos = torch.arange(7, 7 + IDS.shape[1])[None]
    expected = logits_with(model, REFERENCE, IDS, position_ids=pos)
    torch.testing.assert_close(logits(model, IDS, position_ids=pos), expected, rtol=0, atol=1e-5)


SLIDING = sorted(f for f, setup in SETUPS.items() if "sliding_window" in setup)


@pytest.mark.parametrize("family", SLIDING)
def test_input_shorter_than_the_sliding_window_matches_the_reference(family):
    """sdpa: transformers passes no mask while every key is inside the window (5 tokens, window 6)."""
    model = build(family, {"rope_type": "rerope", "window": 2}, "eager" if family in EAGER_ONLY else "sdpa")
    pos = torch.arange(3, 8)[None]
    expected = logits_with(model, REFERENCE, IDS[:, :5], position_ids=pos)
    torch.testing.assert_close(logits(model, IDS[:, :5], position_ids=pos), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family, implementation", CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_rerope_past_the_input_is_the_stock_family(family, implementation):
    """Distances below the window are plain RoPE: the family's own rotary (partial dims, thetas per layer type,
    scale, softcap, windows) and the package's rotation inside attention give the same logits."""
    stock = build(family, None, implementation)
    model = build(family, {"rope_type": "rerope", "window": 64}, implementation)
    assert model.config.rope_parameters != stock.config.rope_parameters
    torch.testing.assert_close(logits(model, IDS), logits(stock, IDS), rtol=0, atol=1e-5)


@pytest.mark.parametrize("family, implementation", CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_stock_family_is_bit_identical_through_the_registered_functions(family, implementation, monkeypatch):
    model = build(family, None, implementation)
    mask = torch.ones_like(IDS)
    mask[0, :3] = 0
    assert hasattr(AttentionInterface._global_mapping[implementation], "hf_rope_ext_stock")  # the package's
    ours = logits(model, IDS, attention_mask=mask)
    mapping = dict(AttentionInterface._global_mapping)
    mapping.pop("eager")  # transformers' own state: the model's eager_attention_forward is the default
    mapping["sdpa"] = sdpa_attention_forward
    monkeypatch.setattr(AttentionInterface, "_global_mapping", mapping)
    assert torch.equal(ours, logits(model, IDS, attention_mask=mask))


@pytest.mark.parametrize("name", ["rerope", "self_extend"])
def test_gemma3_global_layers_only_leave_local_layers_stock(name):
    """The type on the global layers only; local layers keep transformers' own rotary (and theta 10000)."""
    model = build("gemma3_text", None, "sdpa")
    params = model.config.rope_parameters
    params["full_attention"] = {**params["full_attention"], "rope_type": name, **PARAMS[name]}
    model = build("gemma3_text", None, "sdpa", rope_parameters=params)
    rotary = model.base_model.rotary_emb
    assert rotary.full_attention_inv_freq.abs().max() == 0 and rotary.sliding_attention_inv_freq.abs().max() > 0
    pos = torch.arange(IDS.shape[1])[None]
    expected = logits_with(model, REFERENCE, IDS, position_ids=pos)
    torch.testing.assert_close(logits(model, IDS, position_ids=pos), expected)


# ---------------------------------------------------------------------------------------------------------------
# the KV cache


def generate(model, use_cache: bool):
    """Two prompts of 10, the second left-padded by 3; 6 new tokens (so sliding windows of 6 drop keys)."""
    return generate_left_padded(model, use_cache, length=10, pad=3, new_tokens=6)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("name", ATTENTION_METHODS)
def test_cache_equals_no_cache_with_left_padding(family, name):
    implementation = "eager" if family in EAGER_ONLY else "sdpa"
    model = build(family, {"rope_type": name, **PARAMS[name]}, implementation)
    tokens, step_logits = generate(model, use_cache=True)
    recomputed_tokens, recomputed_logits = generate(model, use_cache=False)
    assert torch.equal(tokens, recomputed_tokens)
    torch.testing.assert_close(step_logits, recomputed_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("cache", [None, "static"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_attention_call_finds_its_cache_layer_through_its_keys(family, cache, monkeypatch):
    """What the family's attention module does between its cache update and the attention call keeps the keys'
    link to their layer (windows of 6 fill while decoding): every call of a cached ``generate`` reuses its layer's
    rows, trusted, where a lost link would only make it slower, not wrong."""
    found = []

    def spying(keys):
        memory = kept_by_cache(keys)
        found.append(memory is not None and memory.trusted)
        return memory

    monkeypatch.setattr(rotated_cache, "kept_by_cache", spying)
    implementation = "eager" if family in EAGER_ONLY else "sdpa"
    model = build(family, {"rope_type": "rerope", **PARAMS["rerope"]}, implementation)
    with torch.inference_mode():
        model.generate(IDS[:, :10], max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation=cache)
    assert len(found) >= 4 and all(found)  # a forward of the prompt, 3 steps: each calls every rotating layer


# ---------------------------------------------------------------------------------------------------------------
# dynamic_yarn


def scalings(model) -> list[float]:
    """Every attention factor the rotary module multiplies cos/sin by (one per layer type for Gemma 3)."""
    rotary = model.base_model.rotary_emb
    return [v for k, v in vars(rotary).items() if k.endswith("attention_scaling")]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dynamic_yarn_same_output_whatever_came_before(family):
    """L0 = 16: a 10-token input, a 56-token one (factor 3.5), the 10-token input again, with and without a cache;
    inside L0 it equals the unscaled model, and the rotary module's attention factor is 1."""
    implementation = "eager" if family in EAGER_ONLY else "sdpa"
    dyn_params = {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 16}
    dyn = build(family, dyn_params, implementation, max_position_embeddings=16)
    plain = build(family, None, implementation, max_position_embeddings=16)
    short, long = IDS[:, :10], torch.randint(3, 97, (2, 56), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    before, before_cached = logits(dyn, short), torch.stack(dyn.generate(short, **kwargs).logits, 1)
    far = logits(dyn, long)
    dyn.generate(long, **kwargs)
    assert all(s == 1.0 for s in scalings(dyn))
    torch.testing.assert_close(logits(dyn, short), before, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.stack(dyn.generate(short, **kwargs).logits, 1), before_cached, rtol=0, atol=1e-6)
    assert all(s == 1.0 for s in scalings(dyn))  # inside L0 again
    torch.testing.assert_close(before, logits(plain, short), rtol=0, atol=1e-5)
    assert (far - logits(plain, long)).abs().max() > 1e-4  # beyond L0 it does scale (errors above are ~1e-7)


def test_dynamic_yarn_on_roformer_same_output_whatever_came_before():
    """RoFormer accepts dynamic_yarn too: its own table is recomputed for each call's length, with no state kept."""
    config = RoFormerConfig(
        vocab_size=61,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=16,
        is_decoder=True,
        initializer_range=0.2,
        rope_parameters={"rope_type": "dynamic_yarn", "original_max_position_embeddings": 16},
    )
    torch.manual_seed(0)
    model = RoFormerForCausalLM(config).eval()
    short, long = IDS[:, :10] % 61, torch.randint(3, 61, (2, 56), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    before, before_cached = logits(model, short), torch.stack(model.generate(short, **kwargs).logits, 1)
    logits(model, long)
    model.generate(long, **kwargs)
    torch.testing.assert_close(logits(model, short), before, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.stack(model.generate(short, **kwargs).logits, 1), before_cached, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# what is refused


def test_sliding_layer_without_a_mask_past_its_window_is_refused():
    """transformers drops the mask only when every key is inside the window; the window is applied through it."""
    model = build("mistral", {"rope_type": "rerope", "window": 5}, "sdpa")
    attention = model.base_model.layers[0].self_attn
    q, k = torch.zeros(1, 4, 8, 24), torch.zeros(1, 2, 8, 24)
    call = dict(position_ids=torch.arange(8)[None])
    with pytest.raises(ValueError, match=r"sliding_window=6.*model_type='mistral'.*8 keys and no attention mask"):
        ALL_ATTENTION_FUNCTIONS["sdpa"](attention, q, k, k, None, sliding_window=6, **call)
    assert ALL_ATTENTION_FUNCTIONS["sdpa"](
        attention, q[:, :, :6], k[:, :, :6], k[:, :, :6], None, sliding_window=6, position_ids=torch.arange(6)[None]
    )[0].shape == (1, 6, 4, 24)


def test_gemma3_flat_type_beside_per_layer_parameters_is_refused():
    """transformers keeps a flat dict beside Gemma 3's per-layer-type ones, and its rotary module ignores it."""
    model = build("gemma3_text")
    model.config.rope_parameters.update({"rope_type": "rerope", "window": 5})
    with pytest.raises(ValueError, match=r"'rerope' is set beside the per-layer-type entries.*gemma3_text"):
        logits(model, IDS)


def test_softcap_with_sdpa_is_refused_naming_family_and_what_to_do():
    model = build("gemma2", {"rope_type": "rerope", "window": 5})
    attention = model.base_model.layers[0].self_attn
    q = torch.zeros(1, 4, 3, 24)
    with pytest.raises(ValueError, match=r"model_type='gemma2'.*attn_logit_softcapping=2\.0.*'sdpa'.*rerope.*eager"):
        ALL_ATTENTION_FUNCTIONS["sdpa"](
            attention, q, q[:, :2], q[:, :2], None, softcap=2.0, position_ids=torch.arange(3)[None]
        )


@pytest.mark.parametrize(
    "rope",
    [{"rope_type": "rerope", "window": 5}, {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 64}],
)
def test_unsupported_family_is_refused_with_the_reason(rope):
    """Cohere rotates interleaved pairs in its attention module: neither type can be served there."""
    with pytest.raises((ValueError, StrictDataclassError)) as excinfo:
        AutoConfig.for_model("cohere", **TINY, rope_parameters={"rope_theta": 10000.0, **rope})
    text = error_text(excinfo)
    assert "model_type='cohere'" in text and "interleaved" in text and rope["rope_type"] in text and "llama" in text
