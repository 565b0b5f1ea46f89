"""RoFormer runtime (hf_rope_ext.attention.roformer, installed by the seam hf_rope_ext._transformers.roformer): stock
when not asked, scaled, past its table, RoPER, both layouts.

References are independent of the module: stock RoFormer whose sinusoidal table the test fills itself, transformers'
Llama rotary embedding for the same rope_parameters, and slow formula-by-formula rotations.
"""

from __future__ import annotations

import json
import math
import sys
import types

import pytest
import torch
from conftest import logits
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import (
    AutoModelForMaskedLM,
    Qwen2Config,
    RoFormerConfig,
    RoFormerForCausalLM,
    RoFormerForMaskedLM,
    RoFormerForSequenceClassification,
    modeling_rope_utils,
)
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
from transformers.models.roformer import modeling_roformer

from hf_rope_ext._transformers import roformer as seam
from hf_rope_ext.attention import roformer
from hf_rope_ext.types import registry

MAX_POS, HEADS, HIDDEN = 16, 4, 32

ROPER = {"rope_type": "roper", "value_rotary_factor": 1.0}  # RoFormer turns every value dim


HEAD_DIM = HIDDEN // HEADS
TINY = dict(
    vocab_size=61,
    hidden_size=HIDDEN,
    num_hidden_layers=2,
    num_attention_heads=HEADS,
    intermediate_size=48,
    max_position_embeddings=MAX_POS,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    initializer_range=0.2,  # large enough weights that logits depend on positions (0.02 moves them by 1e-5)
)
TOL = dict(atol=1e-4, rtol=1e-4)  # fp32 logits of magnitude ~4 computed along two routes
# a valid rope_parameters dict for each of transformers' own frequency types
BUILTIN_EXAMPLES = {
    "default": {},
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0},
    "llama3": {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
    "longrope": {
        "short_factor": [1.0, 1.1, 1.2, 1.3],
        "long_factor": [2.0, 3.0, 4.0, 5.0],
        "original_max_position_embeddings": 8,
    },
    "proportional": {"factor": 2.0, "partial_rotary_factor": 0.5},
}


def example(rope_type: str) -> dict:
    if rope_type in BUILTIN_EXAMPLES:
        return {"rope_type": rope_type, **BUILTIN_EXAMPLES[rope_type]}
    return registry.example_parameters(registry.get_method(rope_type))


FREQUENCY_TYPES = sorted(set(BUILTIN_EXAMPLES) | {m.name for m in registry.methods() if m.kind == "frequency"})
DYNAMIC = {"dynamic", "longrope"} | {m.name for m in registry.methods() if m.kind == "frequency" and m.dynamic}
STATIC_TYPES = [t for t in FREQUENCY_TYPES if t not in DYNAMIC]


def test_every_supported_type_is_tested():
    assert set(roformer.supported_types()) == set(FREQUENCY_TYPES) | {"roper"}


def build(cls=RoFormerForMaskedLM, seed: int = 0, **overrides):
    config = RoFormerConfig(**{**TINY, "is_decoder": cls is RoFormerForCausalLM, **overrides})
    torch.manual_seed(seed)
    return cls(config).eval()


def twin(model, cls=None, **overrides):
    """A model of the same weights, built from the same config plus ``overrides``."""
    keep = (*TINY, "is_decoder", "rotary_value", *roformer.CONFIG_KEYS)
    kwargs = {k: v for k, v in model.config.to_dict().items() if k in keep}
    other = build(cls or type(model), **{**kwargs, **overrides})
    other.load_state_dict(model.state_dict())
    return other


def _stock_decoder_is_causal() -> bool:
    """transformers 5.17's RoFormerForCausalLM lets positions see later tokens (fixed in later 5.x)."""
    seam.uninstall()
    try:
        model = build(RoFormerForCausalLM, num_hidden_layers=1)
        ids = torch.randint(0, 50, (1, MAX_POS))
        with torch.no_grad():
            return torch.allclose(model(ids).logits[:, :8], model(ids[:, :8]).logits, atol=1e-5)
    finally:
        seam.install()


def _from_pretrained_keeps_rope_kwargs() -> bool:
    """Whether this transformers sets unknown from_pretrained kwargs on a RoFormer config (5.17 passes them on)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        RoFormerConfig(hidden_size=HIDDEN, num_attention_heads=HEADS).save_pretrained(folder)
        config, unused = RoFormerConfig.from_pretrained(folder, rope_theta=5.0, return_unused_kwargs=True)
        return "rope_theta" not in unused


needs_causal_stock = pytest.mark.skipif(
    not _stock_decoder_is_causal(), reason="this transformers' RoFormerForCausalLM is not causal (stock bug)"
)
needs_kwargs = pytest.mark.skipif(
    not _from_pretrained_keeps_rope_kwargs(), reason="this transformers passes RoFormer rope kwargs to the model"
)


def ids(length: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def table(positions: torch.Tensor, base: float = 10000.0, dim: int = HEAD_DIM) -> torch.Tensor:
    """Slow reference table: row p = [sin(p b^(-2i/d)) for i] + [cos(...) for i], float64 then float32."""
    i = torch.arange(dim // 2, dtype=torch.float64)
    angle = positions.double()[:, None] / base ** (2 * i / dim)
    return torch.cat((angle.sin(), angle.cos()), dim=-1).float()


def stock_with_table(model, rows: torch.Tensor):
    """Stock RoFormer (no rope parameters) with the same weights, its sinusoidal table replaced by ``rows``."""
    ref = twin(model, rope_parameters=None, rope_theta=None, rope_layout=None)
    assert seam.rope_of(ref) is None
    with torch.no_grad():
        ref.roformer.encoder.embed_positions.weight.copy_(rows)
    return ref


# ---------------------------------------------------------------------------------------------------------------
# stock behaviour when nothing is asked for; install / uninstall


@pytest.mark.parametrize("cls", [RoFormerForMaskedLM, RoFormerForCausalLM])
@pytest.mark.parametrize("rotary_value", [False, True])
def test_no_rope_parameters_is_stock(cls, rotary_value):
    model = build(cls, rotary_value=rotary_value)
    x = ids(MAX_POS)
    ours = logits(model, x)
    encoder = model.roformer.encoder
    assert "_hf_rope_ext" not in vars(encoder) and "forward" not in vars(encoder.embed_positions)
    seam.uninstall()
    try:
        assert not hasattr(modeling_roformer.RoFormerEncoder.__init__, "__wrapped__")
        stock = build(cls, rotary_value=rotary_value)
        stock.load_state_dict(model.state_dict())
        torch.testing.assert_close(logits(stock, x), ours, atol=1e-6, rtol=0)
        assert torch.equal(logits(stock, x), ours)
    finally:
        seam.install()


def test_install_is_idempotent_and_uninstall_restores():
    wrapped = modeling_roformer.RoFormerEncoder.__init__, modeling_roformer.RoFormerEncoder.forward
    seam.install()
    assert (modeling_roformer.RoFormerEncoder.__init__, modeling_roformer.RoFormerEncoder.forward) == wrapped
    model = build(rope_parameters={"rope_type": "linear", "factor": 2.0})
    x = ids(MAX_POS)
    scaled = logits(model, x)
    seam.uninstall()
    seam.uninstall()
    try:
        cls = modeling_roformer.RoFormerEncoder
        assert cls.__init__ is wrapped[0].__wrapped__ and cls.forward is wrapped[1].__wrapped__
        assert "rope_parameters" not in vars(RoFormerConfig)
        assert "_hf_rope_ext" not in vars(model.roformer.encoder)  # live models are detached
        stock = logits(model, x)
        assert not torch.allclose(stock, scaled, atol=1e-4)
    finally:
        seam.install()
    torch.testing.assert_close(logits(model, x), scaled, atol=1e-6, rtol=0)  # re-attached from its config


def another_copy(live: bool):
    """A module posing as another hf_rope_ext copy's seam (an export's vendored package) that set RoFormerConfig's
    attributes; its ``uninstall`` removes them."""
    module = types.ModuleType("_hf_rope_ext_copy._transformers.roformer")
    module.LateDefault = type("LateDefault", (), {"__module__": module.__name__})
    module._ATTACHED, module.calls = ({object()} if live else set()), []
    module.uninstall = lambda: module.calls.append([delattr(RoFormerConfig, key) for key in roformer.CONFIG_KEYS])
    return module


@pytest.mark.parametrize("owner", ["copy", "live copy", "foreign"])
def test_install_takes_over_from_another_copy_only(owner, monkeypatch):
    """The package imported after an export's remote code: the other copy's idle wrappers give way; a copy with live
    encoders, or an attribute of anyone else, is an error."""
    seam.uninstall()
    try:
        module = another_copy(live=owner == "live copy")
        monkeypatch.setitem(sys.modules, module.__name__, module)
        for key in roformer.CONFIG_KEYS:
            setattr(RoFormerConfig, key, module.LateDefault() if owner != "foreign" else None)
        if owner == "copy":
            seam.install()
            assert len(module.calls) == 1 and seam.installed()
            assert isinstance(vars(RoFormerConfig)["rope_parameters"], seam.LateDefault)
        else:
            with pytest.raises(ValueError, match="in use; import hf_rope_ext before" if owner == "live copy" else
                               "already defines 'rope_parameters'"):  # fmt: skip
                seam.install()
            assert not seam.installed()
    finally:
        for key in roformer.CONFIG_KEYS:
            if key in vars(RoFormerConfig) and not isinstance(vars(RoFormerConfig)[key], seam.LateDefault):
                delattr(RoFormerConfig, key)
        seam.install()


def test_stock_config_saves_as_before(tmp_path):
    build().config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not {"rope_parameters", "rope_theta", "rope_layout", "rope_scaling"} & set(saved)


# ---------------------------------------------------------------------------------------------------------------
# frequency-level types


@pytest.mark.parametrize("cls", [RoFormerForMaskedLM, RoFormerForCausalLM])
def test_linear_equals_table_at_half_positions(cls):
    model = build(cls, rope_parameters={"rope_type": "linear", "factor": 2.0})
    ref = stock_with_table(model, table(torch.arange(MAX_POS) / 2))
    x = ids(MAX_POS)
    torch.testing.assert_close(logits(model, x), logits(ref, x), **TOL)
    unscaled = stock_with_table(model, table(torch.arange(MAX_POS).double()))
    assert (logits(unscaled, x) - logits(model, x)).abs().max() > 0.05  # the comparison can tell the tables apart


@pytest.mark.parametrize("cls", [RoFormerForMaskedLM, RoFormerForCausalLM])
def test_ntk_equals_table_with_scaled_base(cls):
    factor = 4.0
    model = build(cls, rope_parameters={"rope_type": "ntk", "factor": factor})
    scaled_base = 10000.0 * factor ** (HEAD_DIM / (HEAD_DIM - 2))
    ref = stock_with_table(model, table(torch.arange(MAX_POS).double(), base=scaled_base))
    x = ids(MAX_POS)
    torch.testing.assert_close(logits(model, x), logits(ref, x), **TOL)


@pytest.mark.parametrize(
    "overrides",
    [{"rope_theta": 50000.0}, {"rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}],
    ids=["config.rope_theta", "rope_parameters.rope_theta"],
)
def test_rope_theta_equals_table_with_that_base(overrides):
    model = build(**overrides)
    ref = stock_with_table(model, table(torch.arange(MAX_POS).double(), base=50000.0))
    x = ids(MAX_POS)
    torch.testing.assert_close(logits(model, x), logits(ref, x), **TOL)


@pytest.mark.parametrize("length", [MAX_POS // 2, 4 * MAX_POS])
@pytest.mark.parametrize("rope_type", FREQUENCY_TYPES + ["dynamic_yarn-L0"])
def test_rows_match_transformers_rotary_embedding(rope_type, length, monkeypatch):
    """RoFormer's rows equal transformers' own cos/sin (a stock rotary module), within and past the table."""
    if rope_type.startswith("dynamic_yarn"):  # Qwen2 rotates it in the attention function: give the rotary module
        method = registry.get_method("dynamic_yarn")  # (and transformers' dynamic updater) the real frequencies
        monkeypatch.setitem(modeling_rope_utils.ROPE_INIT_FUNCTIONS, "dynamic_yarn", method.frequencies)
    if rope_type == "dynamic_yarn-L0":  # L0 below max_position_embeddings: transformers keeps s = max/L0 up to max
        params = {"rope_type": "dynamic_yarn", "original_max_position_embeddings": MAX_POS // 4}
    else:
        params = example(rope_type)
    model = build(rope_parameters=dict(params))
    rows = model.roformer.encoder.embed_positions((1, length), 0)
    # Qwen2's rotary module: transformers' own cos/sin of every frequency type
    qwen2 = Qwen2Config(
        hidden_size=HIDDEN, num_attention_heads=HEADS, max_position_embeddings=MAX_POS, rope_parameters=dict(params)
    )
    cos, sin = Qwen2RotaryEmbedding(qwen2)(torch.zeros(1, dtype=torch.float32), torch.arange(length)[None])
    half = HEAD_DIM // 2
    expected = torch.cat((sin[0, :, :half], cos[0, :, :half]), dim=-1)
    torch.testing.assert_close(rows, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("rope_type", FREQUENCY_TYPES + ["roper"])
@pytest.mark.parametrize("cls", [RoFormerForMaskedLM, RoFormerForCausalLM, RoFormerForSequenceClassification])
def test_four_times_longer_than_the_table_runs(rope_type, cls):
    params = example(rope_type) if rope_type != "roper" else ROPER
    model = build(cls, rope_parameters=params)
    out = logits(model, ids(4 * MAX_POS))
    assert torch.isfinite(out).all()
    if cls is not RoFormerForSequenceClassification:
        assert out.shape[1] == 4 * MAX_POS


@needs_causal_stock
@pytest.mark.parametrize("rope_type", STATIC_TYPES + ["roper"])
def test_decoder_prefix_equals_prefix_alone(rope_type):
    params = example(rope_type) if rope_type != "roper" else ROPER
    model = build(RoFormerForCausalLM, rope_parameters=params)
    x = ids(4 * MAX_POS)
    torch.testing.assert_close(logits(model, x)[:, :MAX_POS], logits(model, x[:, :MAX_POS]), **TOL)


@pytest.mark.parametrize("rope_type", ["dynamic", "dynamic_yarn"])
def test_dynamic_types_are_stock_up_to_the_table(rope_type):
    model = build(RoFormerForCausalLM, rope_parameters=example(rope_type))
    ref = twin(model, rope_parameters=None)
    x = ids(MAX_POS)
    torch.testing.assert_close(logits(model, x), logits(ref, x), **TOL)
    assert not torch.allclose(logits(model, ids(2 * MAX_POS))[:, :MAX_POS], logits(model, x), atol=1e-4)


@needs_causal_stock
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rope_type", ["linear", "roper"])
def test_kv_cache_equals_no_cache(rope_type, layout):
    params = {"rope_type": rope_type, "factor": 2.0} if rope_type == "linear" else ROPER
    model = build(RoFormerForCausalLM, rope_parameters=params, rope_layout=layout)
    x = ids(2 * MAX_POS + 3)
    full = logits(model, x)
    with torch.no_grad():
        out = model(x[:, : MAX_POS + 1], use_cache=True)
        steps = [out.logits]
        for t in range(MAX_POS + 1, x.shape[1]):
            out = model(x[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL)


def test_bf16_follows_fp32_past_the_table():
    model = build(rope_parameters={"rope_type": "yarn", "factor": 4.0})
    x = ids(4 * MAX_POS)
    low = twin(model).to(torch.bfloat16)
    out = logits(low, x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), logits(model, x), atol=0.1, rtol=0.05)


# ---------------------------------------------------------------------------------------------------------------
# RoPER


def rotation(angle: torch.Tensor) -> torch.Tensor:
    """[..., 2, 2] matrices (cos -sin; sin cos)."""
    c, s = angle.cos(), angle.sin()
    return torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)


def heads_of(attn, heads):
    return heads(attn.query), heads(attn.key), heads(attn.value)


def roper_reference(attn, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Slow RoPER for one self-attention: explicit 2x2 rotations of each interleaved pair (no mask)."""
    b, n, _ = hidden.shape

    def heads(linear):  # [B, H, L, d/2, 2]: pair i holds dims (2i, 2i+1)
        return linear(hidden).view(b, n, HEADS, HEAD_DIM // 2, 2).transpose(1, 2).double()

    theta = 10000.0 ** (-2 * torch.arange(HEAD_DIM // 2, dtype=torch.float64) / HEAD_DIM)
    turn = rotation(positions.double()[:, None] * theta)  # [L, d/2, 2, 2]
    q, k, v = (torch.einsum("lipq,bhliq->bhlip", turn, t) for t in heads_of(attn, heads))
    scores = torch.einsum("bhlip,bhmip->bhlm", q, k) / math.sqrt(HEAD_DIM)
    mixed = torch.einsum("bhlm,bhmip->bhlip", scores.softmax(-1), v)
    back = torch.einsum("lipq,bhliq->bhlip", turn.transpose(-1, -2), mixed)  # R(-n theta) = R(n theta)^T
    return back.reshape(b, HEADS, n, HEAD_DIM).transpose(1, 2).reshape(b, n, HIDDEN).float()


def run_self_attention(encoder, hidden, past: int):
    rows = encoder.embed_positions(hidden.shape[:-1], past)[None, None]
    with torch.no_grad():
        return encoder.layer[0].attention.self(hidden, attention_mask=None, sinusoidal_pos=rows)[0]


def test_roper_attention_equals_slow_reference():
    encoder = build(rope_parameters=ROPER).roformer.encoder
    hidden = torch.randn(2, 2 * MAX_POS, HIDDEN, generator=torch.Generator().manual_seed(3))
    past = 5
    expected = roper_reference(encoder.layer[0].attention.self, hidden, torch.arange(past, past + 2 * MAX_POS))
    torch.testing.assert_close(run_self_attention(encoder, hidden, past), expected, **TOL)


def test_roper_is_relative_and_rotary_value_is_not():
    """RoPER's output depends on relative positions only; stock rotary_value's (values never turned back) does not."""
    hidden = torch.randn(1, MAX_POS, HIDDEN, generator=torch.Generator().manual_seed(4))
    roper_enc = build(rope_parameters=ROPER).roformer.encoder
    torch.testing.assert_close(
        run_self_attention(roper_enc, hidden, 0), run_self_attention(roper_enc, hidden, 9), **TOL
    )
    value_enc = build(rotary_value=True, rope_parameters={"rope_type": "default"}).roformer.encoder
    assert not torch.allclose(run_self_attention(value_enc, hidden, 0), run_self_attention(value_enc, hidden, 9))


def test_rotary_value_keeps_stock_behaviour_with_rope_parameters():
    model = build(rotary_value=True, rope_parameters={"rope_type": "default"})
    ref = twin(model, rope_parameters=None)
    x = ids(MAX_POS)
    torch.testing.assert_close(logits(model, x), logits(ref, x), **TOL)


# ---------------------------------------------------------------------------------------------------------------
# layouts


def interleaved_to_half_rows(weight: torch.Tensor) -> torch.Tensor:
    """Permute each head's rows: half-layout row j takes interleaved row 2j (j < d/2) or 2(j - d/2) + 1."""
    order = torch.cat((torch.arange(0, HEAD_DIM, 2), torch.arange(1, HEAD_DIM, 2)))
    rows = torch.cat([h * HEAD_DIM + order for h in range(HEADS)])
    return weight[rows]


def converted_state_dict(model) -> dict:
    state = dict(model.state_dict())
    for name in list(state):
        if ".attention.self.query." in name or ".attention.self.key." in name:
            state[name] = interleaved_to_half_rows(state[name])
    return state


@pytest.mark.parametrize("cls", [RoFormerForMaskedLM, RoFormerForCausalLM])
@pytest.mark.parametrize(
    "params",
    [None, {"rope_type": "linear", "factor": 2.0}, ROPER],
    ids=["none", "linear", "roper"],
)
def test_half_layout_on_converted_weights_equals_interleaved(cls, params):
    model = build(cls, rope_parameters=params, rotary_value=params is None)
    half = build(cls, rope_parameters=params, rotary_value=params is None, rope_layout="half")
    half.load_state_dict(converted_state_dict(model))
    assert seam.rope_of(half).layout == "half"
    x = ids(2 * MAX_POS if params else MAX_POS)
    torch.testing.assert_close(logits(half, x), logits(model, x), **TOL)


def test_layout_set_on_a_live_model_takes_effect():
    """What convert_layout does to a loaded model: permute q/k rows in place and record config.rope_layout."""
    model = build()
    x = ids(MAX_POS)
    expected = logits(model, x)
    model.load_state_dict(converted_state_dict(model))
    model.config.rope_layout = "half"
    torch.testing.assert_close(logits(model, x), expected, **TOL)


# ---------------------------------------------------------------------------------------------------------------
# configs: from_pretrained kwargs, legacy spelling, save and reload


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rope_parameters": {"rope_type": "ntk_by_parts", "factor": 4.0}, "rope_layout": "half"},
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 20000.0}},
        {"rope_parameters": ROPER},
    ],
    ids=["ntk_by_parts-half", "yarn-theta", "roper"],
)
def test_save_and_reload_keep_everything(tmp_path, kwargs):
    model = build(**kwargs)
    x = ids(4 * MAX_POS)
    expected = logits(model, x)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == kwargs["rope_parameters"]["rope_type"]
    assert saved.get("rope_layout") == kwargs.get("rope_layout")
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(reloaded, x), expected, atol=1e-6, rtol=0)


@needs_kwargs
def test_from_pretrained_kwargs_select_the_method(tmp_path):
    stock = build()
    stock.save_pretrained(tmp_path)
    x = ids(MAX_POS)
    expected = logits(stock_with_table(stock, table(torch.arange(MAX_POS) / 2)), x)
    for kwargs in (
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
    ):
        model = AutoModelForMaskedLM.from_pretrained(tmp_path, **kwargs).eval()
        torch.testing.assert_close(logits(model, x), expected, **TOL)
    model = AutoModelForMaskedLM.from_pretrained(tmp_path, rope_layout="half").eval()
    assert seam.rope_of(model).layout == "half"


# ---------------------------------------------------------------------------------------------------------------
# bad input


def fake_attention_method() -> registry.RopeMethod:
    return registry.RopeMethod(name="fake_attention_type", kind="attention", frequencies=lambda *a, **k: None)


# a ValueError raised while a config is built reaches the caller wrapped by huggingface_hub's strict dataclasses
INVALID = (ValueError, StrictDataclassClassValidationError)
BAD_INPUT = [
    ({"rope_parameters": {"rope_type": "no_such_type"}}, INVALID, ["'no_such_type'", "allowed", "ntk"]),
    ({"rope_parameters": {"rope_type": "fake_attention_type"}}, INVALID, ["attention-level", "roper"]),
    ({"rope_parameters": {"rope_type": "ntk"}}, KeyError, ["factor"]),
    ({"rope_parameters": {"rope_type": "ntk", "factor": 0.5}}, INVALID, ["factor", "0.5", ">= 1"]),
    ({"rope_parameters": {**ROPER, "no_such_key": 2.0}}, INVALID, ["no_such_key"]),
    ({"rope_parameters": {**ROPER, "value_rotary_factor": 0.5}}, INVALID, ["value_rotary_factor", "0.5", "1.0"]),
    ({"rope_layout": "sideways"}, INVALID, ["rope_layout", "sideways", "interleaved"]),
    ({"rope_theta": -1.0}, INVALID, ["rope_theta", "-1.0"]),
    ({"rope_theta": 500.0, "rope_parameters": {"rope_type": "default", "rope_theta": 600.0}}, INVALID, ["600"]),
]


@pytest.mark.parametrize("overrides, error, words", BAD_INPUT)
def test_bad_config_fails_when_built(monkeypatch, overrides, error, words):
    monkeypatch.setitem(registry._METHODS, "fake_attention_type", fake_attention_method())
    with pytest.raises(error) as info:
        build(**overrides)
    for word in words:
        assert word in str(info.value)


@needs_kwargs
@pytest.mark.parametrize("overrides, error, words", BAD_INPUT[:6])
def test_bad_from_pretrained_kwargs_fail_when_the_model_is_built(tmp_path, monkeypatch, overrides, error, words):
    """from_pretrained sets its kwargs on a config already built: the model build raises the plain error."""
    monkeypatch.setitem(registry._METHODS, "fake_attention_type", fake_attention_method())
    build().save_pretrained(tmp_path)
    with pytest.raises(ValueError if error is INVALID else error) as info:
        AutoModelForMaskedLM.from_pretrained(tmp_path, **overrides)
    for word in words:
        assert word in str(info.value)


def test_replacing_a_recorded_base_needs_rope_theta(tmp_path):
    build(rope_parameters={"rope_type": "default", "rope_theta": 20000.0}).save_pretrained(tmp_path)
    with pytest.raises(KeyError, match="rope_theta"):
        AutoModelForMaskedLM.from_pretrained(tmp_path, rope_parameters={"rope_type": "ntk", "factor": 2.0})
    model = AutoModelForMaskedLM.from_pretrained(
        tmp_path, rope_parameters={"rope_type": "ntk", "factor": 2.0, "rope_theta": 20000.0}
    )
    assert seam.rope_of(model).view.rope_parameters["rope_theta"] == 20000.0


@pytest.mark.parametrize("params", [None, {"rope_type": "yarn", "factor": 4.0}, ROPER])
def test_convert_layout_round_trip_and_reload(tmp_path, params):
    """hf_rope_ext.convert_layout on a live RoFormer (q/k rows permuted, rope_layout recorded), saved and reloaded."""
    from hf_rope_ext import convert_layout

    model = build(RoFormerForCausalLM, rope_parameters=params, rotary_value=params is None)
    x = ids(4 * MAX_POS if params else MAX_POS)
    expected = logits(model, x)
    half = convert_layout(model, to="half")
    assert seam.rope_of(half).layout == "half"
    torch.testing.assert_close(logits(half, x), expected, **TOL)
    half.save_pretrained(tmp_path)
    reloaded = RoFormerForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(reloaded, x), expected, **TOL)
    torch.testing.assert_close(logits(convert_layout(reloaded, to="interleaved"), x), expected, **TOL)


def test_deepcopy_runs_the_same_and_changes_independently():
    import copy

    model = build(RoFormerForCausalLM, rope_parameters=ROPER)
    x = ids(2 * MAX_POS)
    expected = logits(model, x)
    clone = copy.deepcopy(model)
    torch.testing.assert_close(logits(clone, x), expected, atol=1e-6, rtol=0)
    clone.config.rope_parameters = {"rope_type": "linear", "factor": 2.0}
    assert not torch.allclose(logits(clone, x), expected, atol=1e-2)
    torch.testing.assert_close(logits(model, x), expected, atol=1e-6, rtol=0)
