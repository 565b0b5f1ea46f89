"""Decoding with transformers' DynamicCache and StaticCache: the rotated-key memory trusts a cache's rows without
comparing them only when the cache hook saw a plain concatenation (dynamic) or one write past them (static); a
reordered, cropped or rewritten cache is compared, and rotated anew where it differs."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import ATTENTION_PARAMS, tiny_model
from transformers import DynamicCache, StaticCache

from hf_rope_ext.attention import rotated_cache

PARAMS = ATTENTION_PARAMS
TYPES = sorted(PARAMS)


@pytest.fixture
def counted(monkeypatch):
    """Counts of full comparisons (``same_bits``) and of calls trusted by the hook (``continued`` True)."""
    counts = {"compared": 0, "trusted": 0}
    same_bits, continued = rotated_cache.same_bits, rotated_cache.continued

    def counting_same_bits(a, b):
        counts["compared"] += 1
        return same_bits(a, b)

    def counting_continued(*args):
        trusted = continued(*args)
        counts["trusted"] += trusted
        return trusted

    monkeypatch.setattr(rotated_cache, "same_bits", counting_same_bits)
    monkeypatch.setattr(rotated_cache, "continued", counting_continued)
    return counts


def model_of(name: str, family: str = "llama", **rope):
    return tiny_model(family, {"rope_type": name, **PARAMS[name], **rope}, attn_implementation="sdpa")


def prompts(batch=2, length=12):
    return torch.randint(3, 97, (batch, length), generator=torch.Generator().manual_seed(3))


CASES = {  # case -> (family, rope overrides, generate's cache_implementation); StableLM: half-rotary heads
    "plain": ("llama", {}, None),
    "window-1": ("llama", {"window": 1}, None),
    "partial-rotary": ("stablelm", {}, None),
    "static-cache": ("llama", {}, "static"),
}


@pytest.mark.parametrize(
    "name, case", [(n, c) for n in TYPES for c in CASES if "window" in PARAMS[n] or "window" not in CASES[c][1]]
)
def test_generate_trusts_the_cache_and_equals_recompute(name, case, counted):
    family, rope, implementation = CASES[case]
    model = model_of(name, family, **rope)
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    cached = model.generate(prompts(), cache_implementation=implementation, **kwargs)
    assert counted == {"compared": 0, "trusted": counted["trusted"]}
    assert counted["trusted"] >= 6 * model.config.num_hidden_layers  # every step after the first, every layer
    recomputed = model.generate(prompts(), use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, recomputed.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(recomputed.logits), rtol=0, atol=1e-5)


def decode_steps(model, cache, ids, steps: int):
    """The prompt ``ids`` and ``steps`` greedy tokens into ``cache``."""
    with torch.no_grad():
        logits = model(ids, past_key_values=cache).logits
        for _ in range(steps):
            logits = model(logits[:, -1:].argmax(-1), past_key_values=cache).logits


def reorder(cache):  # beam search
    cache.reorder_cache(torch.tensor([1, 0]))


def crop(cache):  # assisted generation: rejected tokens dropped, others fed at their positions
    cache.crop(-3)


def rewrite(cache):  # written in place
    for layer in cache.layers:
        layer.keys[:, :, 2] += 1.0
        layer.values[:, :, 2] -= 1.0


@pytest.mark.parametrize(
    "kind, change",
    [("dynamic", reorder), ("dynamic", crop), ("dynamic", rewrite), ("static", reorder), ("static", rewrite)],
)
@pytest.mark.parametrize("name", TYPES)
def test_a_changed_cache_is_compared_and_rotated_anew(name, kind, change, counted):
    """After the change, a step with the memory equals the same step computed without any memory."""
    model = model_of(name)
    config = model.config
    cache = StaticCache(config=config, max_cache_len=24) if kind == "static" else DynamicCache(config=config)
    decode_steps(model, cache, prompts(), steps=3)
    change(cache)
    fed = torch.tensor([[7], [9]])
    before = copy.deepcopy(cache)
    counted["trusted"] = 0
    with torch.no_grad():
        remembered = model(fed, past_key_values=cache).logits
        assert counted["trusted"] == 0
        for layer in model.model.layers:
            rotated_cache.forget(layer.self_attn)
        fresh = model(fed, past_key_values=before).logits
    torch.testing.assert_close(remembered, fresh, rtol=0, atol=1e-5)


def test_only_modules_of_the_package_types_are_hooked():
    stock = tiny_model("llama", {"rope_type": "default"}, attn_implementation="sdpa")
    ours = model_of("rerope")
    for model in (stock, ours):
        model.generate(prompts(), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert not any(m._forward_pre_hooks for m in stock.modules())
    assert [len(layer.self_attn._forward_pre_hooks) for layer in ours.model.layers] == [1, 1]


def test_one_memory_switching_between_a_copy_and_a_rotation_stays_exact():
    """A purpose whose rows are first copies (rotate None: one buffer), then rotated, then copies again."""
    module, keys = torch.nn.Identity(), torch.randn(1, 2, 12, 4)
    positions = torch.arange(12)[None]
    double = lambda x, p: 2 * x  # noqa: E731
    for kv, turn, tag in ((9, None, "copy"), (10, double, "double"), (11, None, "copy"), (12, double, "double")):
        got = rotated_cache.rotated(module, "p", (tag,), keys[:, :, :kv], positions[:, :kv], kv - 1, turn)
        torch.testing.assert_close(got, keys[:, :, :kv] * (1 if turn is None else 2), rtol=0, atol=0)
    owned = rotated_cache.rotated(module, "p", ("copy",), keys, positions, 11, None, own=8)
    torch.testing.assert_close(owned[:, :, :8], keys[:, :, :8], rtol=0, atol=0)
