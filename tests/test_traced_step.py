"""An attention-level type's decode step as torch.compile traces it (``engine.traced_step``: the near bands over the
slots of the newest keys, gathered on the device, the last band over all, scored turned) against the reference engine,
on the masks a compiled step meets and on masks no generate makes (holes, graded and per-head additive masks), for
the banded types and the one-band ones (xPos, RoPER, dynamic_yarn); the work it leaves out; no recompilation as a
growing cache passes the window under dynamic shapes."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from conftest import ENGINE_PARAMS, ENGINE_PARAMS_WITH_DYNAMIC_YARN, tiny_model, with_rope

from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import decay_and_value_turns, reference, rotated_cache, static_rows, traced_step
from hf_rope_ext.types import registry

BANDED = sorted(m.name for m in registry.methods() if m.kind == "attention" and len(m.attention.bands) > 1)
ONE_BAND = sorted(n for n in ENGINE_PARAMS_WITH_DYNAMIC_YARN if n not in BANDED)  # xpos, roper, dynamic_yarn
KV = 20  # key slots of the step


SPANS = {3: (3, 1), 8: (6, 2), 40: (25, 5)}  # N -> Dual Chunk Attention's (chunk_size, local_size), 2c near N


def module_of(name: str, span: int):
    """A one-layer Llama's attention whose near bands reach the ``span`` newest keys (about, for Dual Chunk
    Attention: 2c of ``SPANS``)."""
    if name == "dual_chunk":
        size, local = SPANS[span]
        rope = with_rope(name, ENGINE_PARAMS[name], chunk_size=size, local_size=local)
    else:
        rope = with_rope(name, ENGINE_PARAMS[name], window=span)
    return tiny_model("llama", rope, num_hidden_layers=1).model.layers[0].self_attn


def step_inputs(seed: int = 0, batch: int = 2, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, 1, 16, generator=g).to(dtype)
    k, v = (torch.randn(batch, 2, KV, 16, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def masks() -> dict:
    """Step masks [B, 1 or H, 1, KV] a traced call can get, by name."""
    slots = torch.arange(KV)
    filled = slots < 15  # a static cache: 15 slots written, 5 unfilled
    padded = filled & (slots[None] >= torch.tensor([[0], [6]]))  # the second row left-padded by 6
    hole = filled & (slots != 12) & (slots != 9)  # holes inside the window
    graded = torch.where(filled, -0.1 * (KV - slots).float(), torch.finfo(torch.float32).min)  # an additive bias
    per_head = graded[None].repeat(4, 1) * torch.arange(1, 5)[:, None]  # a bias of its own per query head
    return {
        "none": None,
        "static": filled[None, None, None],
        "left-padded": padded[:, None, None],
        "holes": hole[None, None, None],
        "graded": graded[None, None, None],
        "per-head": per_head[None, :, None].expand(2, 4, 1, KV),
    }


def positions_of(mask, batch: int) -> torch.Tensor:
    """The step's query position: the number of keys it sees, less one (as generate counts them)."""
    if mask is None:
        return torch.full((batch, 1), KV - 1)
    seen = (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2).any(1).any(1)
    return (seen.expand(batch, KV).sum(-1, keepdim=True) - 1).long()


def traced(module, *args, **kwargs) -> torch.Tensor:
    """The attention output of the path a torch.compile trace takes, run uncompiled."""
    with mock.patch.object(torch.compiler, "is_compiling", lambda: True):
        return function.attend("sdpa", module, *args, **kwargs)[0]


def assert_traced_is_the_reference(module, mask) -> None:
    """float32: the traced path's step equals the reference engine's within 2e-6."""
    q, k, v = step_inputs()
    pos = positions_of(mask, 2)
    got = traced(module, q, k, v, mask, position_ids=pos)
    expected = function.attend("eager", module, q, k, v, mask, position_ids=pos)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def assert_bfloat16_within_rounding(module) -> None:
    """A bfloat16 traced step (left-padded) within 4 bfloat16 steps of the float32 reference's largest output."""
    mask = masks()["left-padded"]
    q, k, v = step_inputs(1, dtype=torch.bfloat16)
    pos = positions_of(mask, 2)
    got = traced(module.to(torch.bfloat16), q, k, v, mask, position_ids=pos).float()
    expected = function.attend("eager", module.float(), q.float(), k.float(), v.float(), mask, position_ids=pos)[0]
    assert (got - expected).abs().max() <= 4 * 2**-8 * float(expected.abs().max())


@pytest.mark.parametrize("mask_name", list(masks()))
@pytest.mark.parametrize("span", list(SPANS))
@pytest.mark.parametrize("name", BANDED)
def test_a_traced_decode_step_equals_the_reference_engine(name, span, mask_name):
    """float32, GQA (4 / 2 heads), two batch rows; near spans shorter than, within and longer than the cache."""
    assert_traced_is_the_reference(module_of(name, span), masks()[mask_name])


TWO_BAND = [name for name in BANDED if registry.get_method(name).attention.far is not None]


def with_near_table(module, q, k, v, mask, pos) -> None:
    """Link to ``k`` what a static cache layer keeps for this step: the near table alone (no turned rows)."""
    memory = rotated_cache.Memory({}, trusted=True)  # as a cache layer's call: the rotation tagged
    call = function.make_call(function.resolve(module), module, q, k, v, mask, pos, memory)
    assert static_rows.wanted(call)[2]
    rows = static_rows.StaticRows(call.tag, torch.tensor(KV), None, None, near=static_rows.near_table(call))
    setattr(k, static_rows.STATIC, rows)


@pytest.mark.parametrize("mask_name", list(masks()))
@pytest.mark.parametrize("span", list(SPANS))
@pytest.mark.parametrize("name", TWO_BAND)
def test_the_window_turned_by_the_near_table_equals_the_reference_engine(name, span, mask_name):
    """A static cache layer's near table: the window's keys turned by distance alone (q . R(-i) k), float32 within
    2e-6 of the reference engine (holes, padding, per-head biases, a window longer than the cache)."""
    module, mask = module_of(name, span), masks()[mask_name]
    q, k, v = step_inputs()
    pos = positions_of(mask, 2)
    expected = function.attend("eager", module, q, k, v, mask, position_ids=pos)[0]
    with_near_table(module, q, k, v, mask, pos)
    with mock.patch.object(traced_step, "window_scores", wraps=traced_step.window_scores) as used:
        got = traced(module, q, k, v, mask, position_ids=pos)
    assert used.called
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("name", BANDED)
def test_a_bfloat16_step_stays_within_rounding_of_the_float32_reference(name):
    assert_bfloat16_within_rounding(module_of(name, 8))


def one_band_module(name: str, partial: float | None = None):
    """A one-layer Llama's attention of a one-band type (dynamic_yarn: scaled past its 16 positions), its rotary dims
    ``partial`` of the head's (None: all)."""
    rope = with_rope(name, ENGINE_PARAMS_WITH_DYNAMIC_YARN[name])
    if partial is not None:
        rope["partial_rotary_factor"] = partial
    return tiny_model("llama", rope, num_hidden_layers=1).model.layers[0].self_attn


@pytest.mark.parametrize("partial", [None, 0.5])
@pytest.mark.parametrize("mask_name", list(masks()))
@pytest.mark.parametrize("name", ONE_BAND)
def test_a_traced_one_band_step_equals_the_reference_engine(name, mask_name, partial):
    """float32, GQA, two batch rows: xPos's key factors, RoPER's turned values and output, partial rotary."""
    assert_traced_is_the_reference(one_band_module(name, partial), masks()[mask_name])


@pytest.mark.parametrize("name", ONE_BAND)
def test_a_bfloat16_one_band_step_stays_within_rounding_of_the_float32_reference(name):
    assert_bfloat16_within_rounding(one_band_module(name))


@pytest.mark.parametrize("name", ONE_BAND)
def test_a_one_band_step_turns_no_cache_sized_tensor(name):
    """The query (and RoPER's output) rotated; the cache only scored turned, once (and RoPER's values summed turned)."""
    rows = rotated_rows(one_band_module(name), masks()["static"])
    assert sorted(rows) == ([-KV, 1, 1, KV] if name == "roper" else [1, KV])


def rotated_rows(module, mask) -> list[int]:
    """The rows of every tensor the traced step rotates or scores turned (``turned_scores``' keys; ``turned_values``'
    values as negative counts)."""
    rows = []

    def counting(x, *args, **kwargs):
        rows.append(x.shape[2])
        return rotate(x, *args, **kwargs)

    def counting_turned(q, k, *args):
        rows.append(k.shape[2])
        return turned_scores(q, k, *args)

    def counting_values(w, v, *args):
        rows.append(-v.shape[2])  # negative: values summed turned
        return turned_values(w, v, *args)

    rotate, turned_scores, turned_values = traced_step.rotate, traced_step.turned_scores, traced_step.turned_values
    q, k, v = step_inputs()
    with (
        mock.patch.object(traced_step, "rotate", counting),
        mock.patch.object(reference, "rotate", counting),
        mock.patch.object(decay_and_value_turns, "rotate", counting),
        mock.patch.object(traced_step, "turned_scores", counting_turned),
        mock.patch.object(traced_step, "turned_values", counting_values),
    ):
        traced(module, q, k, v, mask, position_ids=positions_of(mask, 2))
    return rows


@pytest.mark.parametrize("name", BANDED)
def test_only_the_last_band_reads_the_whole_cache(name):
    """Queries and the near span's keys (n = min(N, kv) rows) rotated for the near bands; the whole cache rotated at
    most once, for the last band, and not at all where its keys do not turn (ReRoPE's)."""
    module = module_of(name, 8)
    n = 2 * (SPANS[8][0] - SPANS[8][1]) if name == "dual_chunk" else 8
    rows = rotated_rows(module, masks()["static"])
    last = registry.get_method(name).attention.bands[-1]
    assert sorted(r for r in rows if r > n) == ([KV] if last.key_position is not traced_step.origin else [])
    assert n in rows and all(r in (1, n, KV) for r in rows)


@pytest.mark.parametrize(
    ("name", "q_len", "training", "expected"),
    [("rerope", 1, False, True), ("rerope", 3, False, False), ("rerope", 1, True, False), ("xpos", 1, False, True),
     ("xpos", 2, False, False), ("roper", 1, False, True), ("roper", 1, True, False), ("dual_chunk", 1, False, True),
     ("dual_chunk", 2, False, False), ("self_extend", 1, False, True)],
)  # fmt: skip
def test_the_step_plan_takes_one_query_of_an_attention_type(name, q_len, training, expected):
    params = dict(registry.get_method(name).example or {}) | ENGINE_PARAMS.get(name, {})
    module = tiny_model("llama", with_rope(name, params), num_hidden_layers=1).model.layers[0].self_attn
    layer = function.resolve(module)
    q, k, v = torch.randn(1, 4, q_len, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    call = function.make_call(layer, module, q, k, v, None, torch.arange(9 - q_len, 9)[None], None)
    assert traced_step.applies(call, dropout=0.1 if training else 0.0, training=training) is expected


def test_a_growing_cache_passes_the_window_without_recompiling():
    """Dynamic shapes, a DynamicCache: the step's window is min(w, kv) keys, symbolic, not a guard on kv."""
    torch._dynamo.reset()
    model = tiny_model("mistral", with_rope("rerope", {"window": 16}), attn_implementation="sdpa", num_hidden_layers=1)
    ids = torch.randint(3, 97, (1, 5), generator=torch.Generator().manual_seed(2))
    options = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(ids, **options)
        model.forward = torch.compile(model.forward, fullgraph=True, backend="eager", dynamic=True)
        model.generate(ids[:, :4], max_new_tokens=2, do_sample=False, pad_token_id=0)  # the two graphs
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = model.generate(ids, **options)
    assert torch.equal(got, expected)
