"""Static rows (``engine.static_rows``): a static cache layer keeps its keys turned by the last band's key positions
(and RoPER's values turned), written as its keys are, so that transformers' compiled decode step reads them as cached.

- transformers' compiled static ``generate`` (fullgraph) gives the uncompiled tokens and logits for every type on
  Llama (dynamo's ``aot_eager`` backend: AOT autograd's functional graph, as inductor receives it), and on a
  left-padded batch for the types that keep rows on Qwen2 and two of them on StableLM's half-rotary heads (dynamo's
  ``eager`` backend; all GQA), and leaves the rows the reference engine computes;
- through random prefills with left padding, eager steps, traced steps (``is_compiling`` patched, the path a compiled
  step takes), crops, beam reorders, resets and updates no attention call saw, the rows of every visible key are the
  ones the reference engine turns;
- a traced step on them makes no tensor of the key cache's size (transformers' own sdpa step makes two);
- the layers that cannot keep them (a sliding window's, an offloaded one's) and the types that need none keep none,
  and compiled steps then turn the cache themselves, to the uncompiled tokens.
"""

from __future__ import annotations

import random
from unittest import mock

import pytest
import torch
from conftest import ATTENTION_PARAMS, left_padded_batch, tiny_model, with_rope
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import CompileConfig
from transformers.cache_utils import StaticLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import hf_rope_ext
from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import reference, static_rows
from hf_rope_ext.types import registry

TYPES = sorted(m.name for m in registry.methods() if m.kind == "attention")
KEPT = ["dual_chunk", "leaky_rerope", "roper", "self_extend", "string"]  # the types whose layers keep static rows
MAX = 40  # a static cache's rows in the property test
NEW = 16  # tokens a generate adds: past every window and two chunks of the types' parameters here


def model_of(name: str, family: str = "llama", **overrides):
    return tiny_model(family, with_rope(name, ATTENTION_PARAMS[name]), attn_implementation="sdpa", **overrides)


def generated(model, ids, mask, backend: str | None):
    """Greedy generate with a StaticCache, compiled by transformers with ``backend`` (None: uncompiled)."""
    if backend is None:
        switch = {"disable_compile": True}
    else:
        config = CompileConfig(fullgraph=True, backend=backend)
        config._compile_all_devices = True  # transformers compiles the decode step on CPU too (its tests' switch)
        switch = {"compile_config": config}
    options = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        return model.generate(
            ids, attention_mask=mask, **options, **switch, return_dict_in_generate=True, output_logits=True
        )


def cache_of(out):
    """The cache ``generate`` returned (``cache`` from transformers 5.24, ``past_key_values`` before)."""
    return getattr(out, "cache", None) or getattr(out, "past_key_values", None)


def held_and_expected(model, cache, mask: torch.Tensor) -> list:
    """Per kept buffer of every layer: (its rows [B, Hkv, n, e] of the n = mask's written slots, the same rows as the
    reference engine turns them for a step after them, visible [B, n]); the buffers linked from the layer's keys."""
    found, n = [], mask.shape[1]
    visible = mask.bool()
    for layer_module, layer in zip(model.model.layers, cache.layers, strict=True):
        attn, rows = layer_module.self_attn, layer.__dict__.get("_rope_static")
        assert rows is not None and rows.valid and getattr(layer.keys, static_rows.STATIC, None) is rows
        keys, values = layer.keys[:, :, :n], layer.values[:, :, :n]
        query = keys.new_zeros(keys.shape[0], model.config.num_attention_heads, 1, keys.shape[-1])
        newest = mask.sum(-1, keepdim=True) - 1  # [B, 1]: the position of the newest key
        layer_call = function.make_call(
            function.resolve(attn), attn, query, keys, values, visible[:, None, None, :], newest, None
        )
        if rows.keys is not None:
            found.append((rows.keys[:, :, :n], reference.band_keys(layer_call)[-1], visible))
        if rows.values is not None:
            found.append((rows.values[:, :, :n], reference.values(layer_call), visible))
    return found


def assert_rows_are_the_references(model, cache, mask: torch.Tensor) -> None:
    """Every visible key's kept rows equal the reference engine's (within float32 rounding of a traced turn)."""
    for held, expected, visible in held_and_expected(model, cache, mask):
        seen = visible[:, None, :, None].expand_as(held)
        torch.testing.assert_close(held[seen], expected[seen], rtol=1e-6, atol=1e-6)


def assert_compiled_is_uncompiled(model, ids, mask, backend: str) -> None:
    """The compiled generate's tokens are the uncompiled ones, its logits within float32 rounding of theirs, and its
    cache's rows (of a type that keeps them) the reference engine's."""
    expected, got = generated(model, ids, mask, None), generated(model, ids, mask, backend)
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(expected.logits), rtol=0, atol=1e-5)
    if model.config.rope_parameters["rope_type"] in KEPT:
        fed = torch.ones_like(got.sequences[:, :-1]) if mask is None else torch.ones(2, NEW - 1, dtype=mask.dtype)
        written = fed if mask is None else torch.cat((mask, fed), dim=1)
        assert_rows_are_the_references(model, cache_of(got), written)


@pytest.mark.parametrize("name", TYPES)
def test_compiled_static_generate_gives_the_uncompiled_logits(name):
    """Llama, aot_eager, fullgraph. A second generate of another
    prompt (a new cache, new rows) compiles nothing anew."""
    torch._dynamo.reset()
    model = model_of(name)
    ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    assert_compiled_is_uncompiled(model, ids, None, "aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert_compiled_is_uncompiled(model, (ids * 7) % 90 + 3, None, "aot_eager")


@pytest.mark.parametrize(
    ("family", "name"), [("qwen2", name) for name in KEPT] + [("stablelm", "roper"), ("stablelm", "self_extend")]
)
def test_compiled_static_generate_of_a_left_padded_batch_on_other_families(family, name):
    """dynamo's eager backend, fullgraph, one layer: Qwen2, and StableLM's half-rotary heads (keys and RoPER's values
    turned over part of each head)."""
    torch._dynamo.reset()
    model = model_of(name, family, num_hidden_layers=1)
    assert_compiled_is_uncompiled(model, *left_padded_batch(), "eager")


def forward(model, cache, ids: torch.Tensor, mask: torch.Tensor, traced: bool) -> torch.Tensor:
    """The logits of one forward of ``ids`` [B, q] after the cache, with ``mask`` [B, written + q] (positions as
    ``generate`` gives them); ``traced``: on the path a compiled step takes (``is_compiling`` patched)."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
    with torch.no_grad(), mock.patch.object(torch.compiler, "is_compiling", lambda: traced):
        return model(
            ids, attention_mask=mask, position_ids=positions, **{hf_rope_ext.cache_keyword(model): cache}
        ).logits


def prefill(model, cache, rng: random.Random, g: torch.Generator) -> torch.Tensor:
    """A prompt of 2 to 14 tokens, the second row left-padded by a random count; returns its mask."""
    length = rng.randint(2, 14)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, : rng.randint(0, length - 1)] = 0
    forward(model, cache, torch.randint(3, 97, (2, length), generator=g), mask, False)
    return mask


def unseen_update(model, cache, mask: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A row written into every layer by ``update`` alone (no attention call turns it), then an eager step."""
    d = model.config.hidden_size // model.config.num_attention_heads
    for i in range(len(cache.layers)):
        rows = torch.randn(2, model.config.num_key_value_heads, 1, d, generator=g)
        cache.update(rows, rows, i)
    mask = torch.cat((mask, torch.ones(2, 2, dtype=mask.dtype)), dim=1)
    forward(model, cache, torch.randint(3, 97, (2, 1), generator=g), mask, False)
    return mask


def operate(model, cache, mask, op: str, rng: random.Random, g: torch.Generator) -> torch.Tensor:
    """Apply ``op`` to the cache (written as ``mask`` says); returns the mask after it."""
    if op in ("step", "traced"):
        mask = torch.cat((mask, torch.ones(2, 1, dtype=mask.dtype)), dim=1)
        forward(model, cache, torch.randint(3, 97, (2, 1), generator=g), mask, op == "traced")
    elif op == "crop":  # assisted generation: rejected tokens dropped
        removed = min(rng.randint(1, 3), mask.shape[1] - 1)
        cache.crop(-removed)
        mask = mask[:, :-removed]
    elif op == "reorder":  # beam search
        cache.reorder_cache(torch.tensor([1, 0]))
        mask = mask.flip(0)
    elif op == "unseen":
        mask = unseen_update(model, cache, mask, g)
    else:  # a new prompt into the same cache
        cache.reset()
        mask = prefill(model, cache, rng, g)
    return mask


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("name", KEPT)
def test_static_rows_hold_the_reference_engines_rows_through_cache_operations(name, seed):
    """20 random operations on a rope_cache StaticCache of 40 rows, the rows checked after each."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    model = model_of(name)
    cache = hf_rope_ext.rope_cache(model, max_cache_len=MAX)
    ops = ["step", "traced", "traced", "reorder", "reset", "unseen"] + (
        ["crop"] if hasattr(StaticLayer, "crop") else []
    )
    mask = prefill(model, cache, rng, g)
    for _ in range(20):
        op = rng.choice(ops) if mask.shape[1] < MAX - 2 else "reset"
        mask = operate(model, cache, mask, op, rng, g)
        assert_rows_are_the_references(model, cache, mask)


class Allocations(TorchDispatchMode):
    """The sizes (numel) of the tensors each operation allocates: outputs sharing no storage with its inputs."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.sizes.append(t.numel())
        return out


def traced_step_allocations(name: str, plain: bool) -> tuple[int, list[int]]:
    """(the key cache's numel, the sizes a traced decode step allocates in the first layer after a 20-token prefill
    into a 64-row static cache); ``plain``: transformers' sdpa step on the same keys, as plain RoPE runs."""
    model = model_of(name)
    cache, g = hf_rope_ext.rope_cache(model, max_cache_len=64), torch.Generator().manual_seed(1)
    with torch.no_grad():
        model(torch.randint(3, 97, (2, 20), generator=g), **{hf_rope_ext.cache_keyword(model): cache})
    attn, layer = model.model.layers[0].self_attn, cache.layers[0]
    q, k, v = torch.randn(2, 4, 1, 16, generator=g), torch.randn(2, 2, 1, 16, generator=g), torch.randn(2, 2, 1, 16)
    mask = (torch.arange(64) <= 20)[None, None, None].expand(2, 1, 1, 64)
    with torch.no_grad(), mock.patch.object(torch.compiler, "is_compiling", lambda: True):
        keys, values = layer.update(k, v)
        with Allocations() as seen:
            if plain:
                sdpa_attention_forward(attn, q, keys, values, mask, scaling=0.25)
            else:
                function.attend("sdpa", attn, q, keys, values, mask, position_ids=torch.full((2, 1), 20))
    return keys.numel(), seen.sizes


@pytest.mark.parametrize("name", [*KEPT, "rerope"])
def test_a_traced_step_makes_no_tensor_of_the_key_cache_size(name):
    """Run eagerly with ``is_compiling`` patched: the new row turned and written, the rest read as kept; no
    allocation of the key cache's size or more, where transformers' plain sdpa step (repeat_kv) makes some."""
    size, ours = traced_step_allocations(name, plain=False)
    plain_size, plain = traced_step_allocations(name, plain=True)
    big, plain_big = [n for n in ours if n >= size], [n for n in plain if n >= plain_size]
    assert big == [] and len(big) <= len(plain_big), (big, plain_big)


@pytest.mark.parametrize("name", ["xpos", "rerope", "self_extend", "dual_chunk"])
def test_only_the_types_and_layers_that_can_keep_static_rows_keep_them(name):
    """xPos (its key factor follows the query) keeps nothing, ReRoPE (its far band reads keys as cached) its near
    table alone, Self-Extend rows and table, Dual Chunk Attention rows alone; an offloaded layer drops them for good
    (its keys move between devices)."""
    model = model_of(name)
    cache = hf_rope_ext.rope_cache(model, max_cache_len=MAX)
    forward(model, cache, torch.randint(3, 97, (2, 6)), torch.ones(2, 6, dtype=torch.long), False)
    layer = cache.layers[0]
    rows = layer.__dict__.get("_rope_static")
    kept = {"xpos": None, "rerope": (False, False, True), "self_extend": (True, False, True)}
    assert (rows if rows is None else static_rows.held(rows)) == kept.get(name, (True, False, False))
    assert rows is None or rows.near is None or rows.near is cache.layers[1].__dict__["_rope_static"].near
    layer.offload()
    forward(model, cache, torch.randint(3, 97, (2, 1)), torch.ones(2, 7, dtype=torch.long), False)
    assert layer.__dict__.get("_rope_static") is None


def test_a_sliding_window_static_layer_keeps_none_and_compiles_to_the_uncompiled_tokens():
    """Mistral with a 9-token sliding window: its static layers roll once full, so they keep no static rows and the
    compiled step (dynamo's eager backend) turns the window's keys itself."""
    torch._dynamo.reset()
    model = model_of("self_extend", "mistral", sliding_window=9, num_hidden_layers=1)
    ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    expected, got = generated(model, ids, None, None), generated(model, ids, None, "eager")
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(expected.logits), rtol=0, atol=1e-5)
    assert all(layer.__dict__.get("_rope_static") is None for layer in cache_of(got).layers)


def test_hf_rope_ext_list_names_the_rows_a_static_cache_keeps():
    """``hf-rope-ext list``'s column against the buffers a prefill into a static cache leaves, type by type."""
    from hf_rope_ext.cli.list_types import rows

    listed = {row["rope_type"]: row["static_rows"] for row in rows()}
    for name in TYPES:
        model = model_of(name, num_hidden_layers=1)
        cache = hf_rope_ext.rope_cache(model, max_cache_len=MAX)
        forward(model, cache, torch.randint(3, 97, (2, 6)), torch.ones(2, 6, dtype=torch.long), False)
        rows_kept = cache.layers[0].__dict__.get("_rope_static")
        kept = [] if rows_kept is None else [k for k in ("keys", "values") if getattr(rows_kept, k) is not None]
        assert listed[name] == kept, name
    assert sorted(name for name in TYPES if listed[name]) == KEPT


@pytest.mark.parametrize("name", ["self_extend", "roper"])
def test_rope_cache_without_static_rows_keeps_none_and_steps_alike(name):
    """``rope_cache(..., static_rows=False)``: no buffers after a prompt, and a traced step (the path a compiled step
    takes, turning the cache itself) gives the logits of the same step on a cache that keeps them."""
    model, g = model_of(name), torch.Generator().manual_seed(4)
    ids, step = torch.randint(3, 97, (2, 9), generator=g), torch.randint(3, 97, (2, 1), generator=g)
    logits = []
    for keep in (True, False):
        cache = hf_rope_ext.rope_cache(model, max_cache_len=MAX, static_rows=keep)
        forward(model, cache, ids, torch.ones(2, 9, dtype=torch.long), False)
        assert all((layer.__dict__.get("_rope_static") is not None) is keep for layer in cache.layers)
        with torch.no_grad(), mock.patch.object(torch.compiler, "is_compiling", lambda: True):
            out = model(step, position_ids=torch.full((2, 1), 9), **{hf_rope_ext.cache_keyword(model): cache})
        logits.append(out.logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", KEPT)
def test_an_eager_step_reads_the_static_rows_and_keeps_no_copy_of_them(name, batch):
    """Eager steps on a static cache that keeps rows read them (its layers remember no second copy of the same turned
    rows, only a two-band type's near window) and give the logits of the same steps on one that keeps none (whose
    layers turn and remember the rows themselves); two rows left-padded, or one row."""
    model, g = model_of(name), torch.Generator().manual_seed(5)
    ids, steps = torch.randint(3, 97, (batch, 9), generator=g), torch.randint(3, 97, (batch, 6), generator=g)
    mask = torch.ones(batch, 15, dtype=torch.long)
    mask[0, : 3 if batch == 2 else 0] = 0
    logits, entries = [], []
    for keep in (True, False):
        cache = hf_rope_ext.rope_cache(model, max_cache_len=MAX, static_rows=keep)
        forward(model, cache, ids, mask[:, :9], False)
        for i in range(6):
            logits.append(forward(model, cache, steps[:, i : i + 1], mask[:, : 10 + i], False))
        entries.append({purpose for layer in cache.layers for purpose in layer.rope_entries})
    torch.testing.assert_close(logits[:6], logits[6:], rtol=0, atol=1e-5)
    assert entries[0] <= {"near_key"} and entries[0] < entries[1], entries


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"static_rows": False}, ValueError, "static_rows=False applies to a static cache"),
        ({"max_cache_len": 8, "static_rows": "no"}, TypeError, "static_rows='no'; allowed: True or False"),
    ],
)
def test_rope_cache_refuses_a_static_rows_option_it_cannot_apply(options, error, words):
    with pytest.raises(error, match=words):
        hf_rope_ext.rope_cache(model_of("self_extend"), **options)


def test_inductor_in_bfloat16_steps_on_the_static_rows_within_rounding():
    """inductor (what users compile with), bfloat16, RoPER (turned keys and turned values kept) on one Llama layer:
    the first compiled step's logits within bfloat16 rounding of the uncompiled step's."""
    torch._dynamo.reset()
    model = model_of("roper", num_hidden_layers=1).to(torch.bfloat16)
    ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(5))
    expected, got = generated(model, ids, None, None), generated(model, ids, None, "inductor")
    assert torch.equal(got.sequences[:, :14], expected.sequences[:, :14])  # the prompt's token, the first step's
    first, reference_first = got.logits[1].float(), expected.logits[1].float()  # the first compiled step's
    assert (first - reference_first).abs().max() <= 2**-7 * reference_first.abs().max()


def test_rope_cache_without_static_rows_leaves_a_stock_models_cache_stock():
    """A model of plain RoPE gets transformers' own StaticCache, its layers as transformers made them."""
    cache = hf_rope_ext.rope_cache(tiny_model("llama", attn_implementation="sdpa"), max_cache_len=8, static_rows=False)
    assert all(type(layer) is StaticLayer and "_rope_static_off" not in vars(layer) for layer in cache.layers)
