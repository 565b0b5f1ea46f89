"""Decoding through transformers' Cache API: the rotated rows live in the cache's own layers
(``_transformers.cache_layers``), which cut them back at every change they make, so decoding reuses them without reading
the cache; a plain cache a user hands to a forward is compared before reuse. Every case equals recomputing without
a cache, under ``torch.no_grad`` and ``torch.inference_mode``."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import transformers
from conftest import ATTENTION_PARAMS, fast_plans, tiny_model, with_rope
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer

import hf_rope_ext
from hf_rope_ext._transformers import cache_layers
from hf_rope_ext.attention.engine import rotated_cache, static_rows

PARAMS = ATTENTION_PARAMS
TYPES = sorted(PARAMS)
MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.fixture
def counted(monkeypatch):
    """Counts of comparisons of cached rows (``same_bits``) and of reuses of rows a cache layer kept (trusted: its
    rotated rows, or its static rows read by a call that turns no row but its new one)."""
    counts = {"compared": 0, "trusted": 0}
    same_bits, reusable_end, kept = rotated_cache.same_bits, rotated_cache.reusable_end, static_rows.kept

    def counting_same_bits(a, b):
        counts["compared"] += 1
        return same_bits(a, b)

    def counting_reusable_end(entry, tag, source, positions, rows, trusted):
        end = reusable_end(entry, tag, source, positions, rows, trusted)
        counts["trusted"] += trusted and end > rows.start
        return end

    def counting_kept(call, *args, **kwargs):
        held = kept(call, *args, **kwargs)
        counts["trusted"] += held is not None and call.query.shape[2] < call.key.shape[2]
        return held

    monkeypatch.setattr(rotated_cache, "same_bits", counting_same_bits)
    monkeypatch.setattr(rotated_cache, "reusable_end", counting_reusable_end)
    monkeypatch.setattr(static_rows, "kept", counting_kept)
    return counts


def model_of(name: str, family: str = "llama", **rope):
    return tiny_model(family, with_rope(name, PARAMS[name], **rope), attn_implementation="sdpa")


def prompts(batch=2, length=12):
    return torch.randint(3, 97, (batch, length), generator=torch.Generator().manual_seed(3))


CASES = {  # case -> (family, rope overrides, generate's cache_implementation, config overrides)
    "plain": ("llama", {}, None, {}),
    "window-1": ("llama", {"window": 1}, None, {}),
    "partial-rotary": ("stablelm", {}, None, {}),  # half-rotary heads
    "static-cache": ("llama", {}, "static", {}),
    "sliding-window": ("mistral", {}, None, {"sliding_window": 9}),  # the window drops rows while decoding
    "sliding-static": ("mistral", {}, "static", {"sliding_window": 9}),
}
GENERATE = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True)


def generate_both(model, mode: str, **kwargs):
    with MODES[mode]():
        cached = model.generate(prompts(), **GENERATE, **kwargs)
        recomputed = model.generate(prompts(), use_cache=False, **{k: v for k, v in GENERATE.items()})
    return cached, recomputed


def assert_same(cached, recomputed, atol=1e-5):
    assert torch.equal(cached.sequences, recomputed.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(recomputed.logits), rtol=0, atol=atol)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "name, case", [(n, c) for n in TYPES for c in CASES if "window" in PARAMS[n] or "window" not in CASES[c][1]]
)
def test_generate_reuses_the_cache_layers_rows_and_equals_recompute(name, case, mode, counted):
    family, rope, implementation, config = CASES[case]
    model = tiny_model(family, with_rope(name, PARAMS[name], **rope), attn_implementation="sdpa", **config)
    cached, recomputed = generate_both(model, mode, cache_implementation=implementation)
    assert counted["compared"] == 0
    # a sliding layer forgets its rows once its window is full; ReRoPE with a window of 1 keeps none (its far band
    # reads the cached keys as they are, its window is the new key), nor does the reference engine (dual_chunk)
    if not case.startswith("sliding") and (name, case) != ("rerope", "window-1") and fast_plans(name):
        assert counted["trusted"] >= 6 * model.config.num_hidden_layers  # every step after the first, every layer
    assert_same(cached, recomputed)


@pytest.mark.parametrize("name", TYPES)
def test_beam_search_equals_its_recompute(name, counted):
    model = model_of(name)
    kwargs = dict(num_beams=2, num_return_sequences=2, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        cached = model.generate(prompts(), **kwargs)
        recomputed = model.generate(prompts(), use_cache=False, **kwargs)
    assert torch.equal(cached, recomputed)
    assert counted["compared"] == 0


@pytest.mark.parametrize("name", TYPES)
def test_left_padded_batch_generates_as_each_row_alone(name):
    model = model_of(name)
    ids = prompts(batch=2, length=10)
    ids[0, :3] = 0
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, attention_mask=mask)
    with torch.inference_mode():
        cached = model.generate(ids, **kwargs)
        recomputed = model.generate(ids, use_cache=False, **kwargs)
    assert torch.equal(cached, recomputed)


def decode_steps(model, cache, ids, steps: int):
    """The prompt ``ids`` and ``steps`` greedy tokens into ``cache``."""
    with torch.no_grad():
        logits = step(model, cache, ids)
        for _ in range(steps):
            logits = step(model, cache, logits[:, -1:].argmax(-1))


def step(model, cache, fed):
    """One forward of ``fed`` through ``cache``, under the keyword the installed transformers names it."""
    with torch.no_grad():
        return model(fed, **{hf_rope_ext.cache_keyword(model): cache}).logits


def reorder(cache):  # beam search
    cache.reorder_cache(torch.tensor([1, 0]))


def crop(cache):  # assisted generation: rejected tokens dropped, others fed at their positions
    cache.crop(-3)


def repeat(cache):  # contrastive search / num_return_sequences
    cache.batch_repeat_interleave(1)


def reset(cache):  # a new prompt into the same cache
    cache.reset()


def rewrite(cache):  # written in place, outside the cache's methods: a plain cache compares and sees it
    for layer in cache.layers:
        layer.keys[:, :, 2] += 1.0
        layer.values[:, :, 2] -= 1.0


def cache_of(model, kind: str, ours: bool):
    config = model.config
    cache = StaticCache(config=config, max_cache_len=24) if kind == "static" else DynamicCache(config=config)
    if ours:
        assert cache_layers.adopt(cache)
    return cache


CHANGES = [
    ("dynamic", reorder, True),
    ("dynamic", crop, True),
    ("dynamic", repeat, True),
    ("static", reorder, True),
    ("static", crop, True),
    ("dynamic", reorder, False),
    ("dynamic", crop, False),
    ("dynamic", rewrite, False),
    ("static", reorder, False),
    ("static", rewrite, False),
]


@pytest.mark.parametrize("kind, change, ours", CHANGES, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("name", TYPES)
def test_a_changed_cache_steps_as_a_fresh_computation(name, kind, change, ours):
    """After the change, a step with the kept rows equals the same step with nothing kept (a deep copy of the cache,
    as plain transformers layers, rows forgotten)."""
    if kind == "static" and change is crop and not hasattr(StaticLayer, "crop"):
        pytest.skip(f"transformers {transformers.__version__}: a StaticLayer cannot be cropped (no StaticLayer.crop)")
    model = model_of(name)
    cache = cache_of(model, kind, ours)
    decode_steps(model, cache, prompts(), steps=3)
    change(cache)
    fed = torch.tensor([[7], [9]])
    before = copy.deepcopy(cache)
    for layer in before.layers:
        layer.__dict__.pop("_rope_entries", None)
    remembered = step(model, cache, fed)
    for layer in model.model.layers:
        rotated_cache.forget(layer.self_attn)
    fresh = step(model, before, fed)
    torch.testing.assert_close(remembered, fresh, rtol=0, atol=1e-5)


def test_reset_then_a_new_prompt_equals_a_new_cache():
    model = model_of("self_extend")
    cache = cache_of(model, "static", ours=True)
    decode_steps(model, cache, prompts(), steps=3)
    reset(cache)
    other = prompts(length=9) % 50 + 3
    reused = step(model, cache, other)
    torch.testing.assert_close(reused, step(model, cache_of(model, "static", ours=True), other), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_plain_cache_in_a_forward_is_compared_and_exact(kind, counted):
    """A cache that keeps no rows (a user's DynamicCache or StaticCache passed to the model's forward): each step
    compares the cached rows with the copy beside them, and the result equals recomputing."""
    model = model_of("leaky_rerope")
    cache, ids = cache_of(model, kind, ours=False), prompts()
    decode_steps(model, cache, ids, steps=4)
    assert counted["compared"] > 0 and counted["trusted"] == 0
    with torch.no_grad():
        full = model(torch.cat((ids, ids[:, :1]), dim=1)).logits[:, -1]
    cache2 = cache_of(model, kind, ours=False)
    decode_steps(model, cache2, ids, steps=0)
    torch.testing.assert_close(step(model, cache2, ids[:, :1])[:, -1], full, rtol=0, atol=1e-5)


def test_generate_adopts_a_cache_the_user_hands_in(counted):
    model = model_of("rerope")
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        cached = model.generate(prompts(), **GENERATE, **{hf_rope_ext.cache_keyword(model): cache})
        recomputed = model.generate(prompts(), use_cache=False, **GENERATE)
    assert all(isinstance(layer, cache_layers.RotatedRows) for layer in cache.layers)
    assert counted["compared"] == 0 and counted["trusted"] > 0
    assert_same(cached, recomputed)


def test_rope_cache_builds_rotating_dynamic_and_static_caches(counted):
    model = model_of("xpos")
    for cache in (hf_rope_ext.rope_cache(model), hf_rope_ext.rope_cache(model, max_cache_len=30)):
        decode_steps(model, cache, prompts(), steps=3)
        assert all(isinstance(layer, cache_layers.RotatedRows) for layer in cache.layers)
    assert counted["compared"] == 0 and counted["trusted"] > 0


LAYERS = {  # a rotating layer of each class: windows of 4 rows, static caches of 8
    "dynamic": lambda: cache_layers.RotatingDynamicLayer(),
    "sliding": lambda: cache_layers.RotatingDynamicSlidingWindowLayer(sliding_window=4),
    "static": lambda: cache_layers.RotatingStaticLayer(max_cache_len=8),
    "static-sliding": lambda: cache_layers.RotatingStaticSlidingWindowLayer(max_cache_len=8, sliding_window=4),
}


@pytest.mark.parametrize("kind", LAYERS)
def test_only_the_keys_a_layer_returned_last_lead_to_its_rows(kind):
    """The attention call finds its layer's rows through the keys the layer's latest update returned, once; a copy
    of those keys, keys it returned before, and copies of the layer (deepcopy, pickle) lead nowhere."""
    layer, rows = LAYERS[kind](), torch.randn(1, 2, 3, 4)
    first, _ = layer.update(rows, rows)
    latest, _ = layer.update(rows[:, :, :1], rows[:, :, :1])
    memory = rotated_cache.kept_by_cache(latest)
    assert memory is not None and memory.trusted and memory.entries is layer.rope_entries
    assert rotated_cache.kept_by_cache(latest) is None  # taken off by the call that found it
    assert first is latest or rotated_cache.kept_by_cache(first) is None  # a static layer returns one tensor
    latest, _ = layer.update(rows[:, :, :1], rows[:, :, :1])
    assert rotated_cache.kept_by_cache(latest.clone()) is None
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert type(other) is type(layer) and not other.returned(latest)
        assert rotated_cache.kept_by_cache(other.keys) is None
    assert rotated_cache.kept_by_cache(latest).entries is layer.rope_entries


CUTS = {  # a change of the layer's keys -> the rows [base, end) of an entry over all 6 of them that stay valid
    "crop": (lambda layer: layer.crop(-2), 4),
    "reset": (lambda layer: layer.reset(), None),
    "offload": (lambda layer: layer.offload(), None),
    "batch_select_indices": (lambda layer: layer.batch_select_indices(torch.tensor([1])), None),
    "batch_repeat_interleave": (lambda layer: layer.batch_repeat_interleave(2), None),
    "reorder_cache": (lambda layer: layer.reorder_cache(torch.tensor([1, 0])), 6),
}


@pytest.mark.parametrize(
    "kind, change", [("dynamic", c) for c in CUTS] + [("static", c) for c in CUTS if not c.startswith("batch")]
)
def test_a_layer_cuts_its_rows_back_at_every_change_of_its_keys(kind, change):
    layer, rows = LAYERS[kind](), torch.randn(2, 2, 6, 4)
    if not hasattr(layer, change):
        pytest.skip(f"transformers {transformers.__version__}: a StaticLayer cannot be cropped (no StaticLayer.crop)")
    layer.update(rows, rows)
    positions = torch.arange(6).expand(2, 6)
    turned = rows * torch.tensor([1.0, 2.0]).view(2, 1, 1, 1)  # batch row 1 told apart
    layer.rope_entries["p"] = rotated_cache.Entry(("t",), 0, 6, None, positions, turned)
    apply, end = CUTS[change]
    apply(layer)
    entry = layer.rope_entries.get("p")
    assert (None if entry is None else entry.end) == end
    if change == "reorder_cache":
        assert torch.equal(entry.rotated, turned.flip(0))


def test_stock_models_get_stock_caches():
    stock = tiny_model("llama", {"rope_type": "default"}, attn_implementation="sdpa")
    cache = DynamicCache(config=stock.config)
    keyword = {hf_rope_ext.cache_keyword(stock): cache}
    stock.generate(prompts(), max_new_tokens=3, do_sample=False, pad_token_id=0, **keyword)
    built = DynamicCache(config=stock.config).layers
    assert [type(layer) for layer in cache.layers] == [type(layer) for layer in built]
    assert type(hf_rope_ext.rope_cache(stock).layers[0]) is type(built[0])
    assert not any(m._forward_pre_hooks for m in stock.modules())


def test_one_memory_switching_between_rotations_stays_exact():
    """A purpose whose rows are rotated one way, then another, then the first again: never served stale rows; a
    step given its last row already rotated uses it (and only it) for that row."""
    keys, positions = torch.randn(1, 2, 12, 4), torch.arange(12)[None]
    turns = {"double": lambda x, p: 2 * x, "triple": lambda x, p: 3 * x}
    for memory in (rotated_cache.beside(torch.nn.Identity()), rotated_cache.Memory({}, trusted=True)):
        for kv, tag in ((8, "double"), (9, "double"), (10, "triple"), (11, "double"), (12, "double")):
            at = lambda: positions[:, :kv]  # noqa: B023  (called at once)
            got = rotated_cache.rotated(memory, "p", (tag,), keys[:, :, :kv], at, kv - 1, turns[tag])
            torch.testing.assert_close(got, keys[:, :, :kv] * (2 if tag == "double" else 3), rtol=0, atol=0)
        given = torch.full((1, 2, 1, 4), 7.0)
        got = rotated_cache.rotated(memory, "p", ("double",), keys, lambda: positions, 11, turns["double"], last=given)
        assert torch.equal(got[:, :, :11], 2 * keys[:, :, :11]) and torch.equal(got[:, :, 11:], given)


def kept_bytes(layer) -> int:
    """Bytes of the rows a rotating layer keeps (a buffer shared by copy and rotation counted once)."""
    buffers = {id(t): t for e in layer.rope_entries.values() for t in (e.rotated, e.source) if t is not None}
    return sum(t.numel() * t.element_size() for t in buffers.values())


@pytest.mark.parametrize("name", TYPES)
def test_a_rotating_layer_keeps_at_most_one_more_copy_of_its_cache(name):
    """Beyond the keys and values transformers caches, a layer keeps one key copy (RoPER: and one value copy),
    the window's rotated keys and room for kv/8 more rows."""
    if not fast_plans(name):
        pytest.skip("the reference engine runs it: no rotated rows kept")
    model = model_of(name)
    cache = hf_rope_ext.rope_cache(model)
    decode_steps(model, cache, prompts(length=600) % 90 + 3, steps=2)
    for layer in cache.layers:
        copies = layer.keys.numel() * layer.keys.element_size() * (2 if name == "roper" else 1)
        row = layer.keys[:, :, 0].numel() * layer.keys.element_size()
        window = (PARAMS[name]["window"] + 64) * row if "window" in PARAMS[name] else 0  # its buffer: >= 64 rows room
        assert 0 < kept_bytes(layer) <= copies * (1 + 1 / 8) + window + 2 * row
