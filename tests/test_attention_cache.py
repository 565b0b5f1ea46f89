"""The KV cache holds unrotated keys; generation with it must equal generation that recomputes the whole prefix."""

from __future__ import annotations

import pytest
import torch
from conftest import ATTENTION_PARAMS, generate_left_padded, left_padded_batch, tiny_model

from hf_rope_ext.types import registry

ATTENTION_METHODS = [m for m in registry.methods() if m.kind == "attention"]
PARAMS = ATTENTION_PARAMS


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_cache_equals_full_recompute(method, implementation):
    model = tiny_model("llama", {"rope_type": method.name, **PARAMS[method.name]}, attn_implementation=implementation)
    tokens, step_logits = generate_left_padded(model, use_cache=True)
    recomputed_tokens, recomputed_logits = generate_left_padded(model, use_cache=False)
    assert torch.equal(tokens, recomputed_tokens)
    torch.testing.assert_close(step_logits, recomputed_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_cache_equals_full_recompute_mistral_sliding_window(method):
    """Explicit head_dim 24 and a sliding window of 6: the cache keeps only the newest keys."""
    rope = {"rope_type": method.name, **PARAMS[method.name]}
    model = tiny_model("mistral", rope, head_dim=24, sliding_window=6, attn_implementation="sdpa")
    tokens, step_logits = generate_left_padded(model, use_cache=True)
    recomputed_tokens, recomputed_logits = generate_left_padded(model, use_cache=False)
    assert torch.equal(tokens, recomputed_tokens)
    torch.testing.assert_close(step_logits, recomputed_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_left_padded_row_equals_the_row_alone(method, implementation):
    model = tiny_model("llama", {"rope_type": method.name, **PARAMS[method.name]}, attn_implementation=implementation)
    ids, mask = left_padded_batch()
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        alone = model(ids[1:, 4:]).logits
    torch.testing.assert_close(batch[1, 4:], alone[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_prefill_in_two_pieces_equals_one_piece(method):
    """A cache filled by a first call (q_len > 1 with cached keys) then a second multi-token call."""
    model = tiny_model("llama", {"rope_type": method.name, **PARAMS[method.name]}, attn_implementation="sdpa")
    ids = torch.randint(3, 97, (1, 14), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = model(ids).logits
        first = model(ids[:, :9], use_cache=True)
        second = model(ids[:, 9:], past_key_values=first.past_key_values, use_cache=True).logits
    torch.testing.assert_close(second, whole[:, 9:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("method", ATTENTION_METHODS, ids=lambda m: m.name)
def test_static_cache_equals_full_recompute(method, implementation):
    """A static cache has empty slots after the newest key: their positions come from the mask, not the slot."""
    model = tiny_model("llama", {"rope_type": method.name, **PARAMS[method.name]}, attn_implementation=implementation)
    ids, mask = left_padded_batch()
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    static = model.generate(ids, cache_implementation="static", **kwargs)
    assert torch.equal(static, model.generate(ids, use_cache=False, **kwargs))
