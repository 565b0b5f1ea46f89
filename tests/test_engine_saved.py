"""What the fast engine keeps for the backward of a banded call on the CPU kernel (``engine.banded``): the queries,
keys and values as given, the output and its log-sum-exp, nothing else (no rotated copies, masks, piece outputs or
merge weights), however many pieces the call takes; the gradients themselves are the reference engine's
(tests/test_attention_engines.py)."""

from __future__ import annotations

import weakref

import pytest
import torch
from conftest import ENGINE_PARAMS, tiny_model
from torch.utils.checkpoint import checkpoint

from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import two_band

BANDED = ["dual_chunk", "leaky_rerope", "rerope", "self_extend", "string"]  # the two-band and chunked forms


@pytest.mark.parametrize("name", BANDED)
def test_a_banded_call_saves_only_its_inputs_output_and_lse(name, monkeypatch):
    monkeypatch.setattr(two_band, "near_block", lambda window: 3)  # many pieces per band
    monkeypatch.setattr(two_band, "FAR_BLOCK", 7)
    model = tiny_model("llama", {"rope_type": name, **ENGINE_PARAMS[name]}, num_hidden_layers=1)
    module = model.model.layers[0].self_attn.train()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 40, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 40, 16, generator=g, requires_grad=True) for _ in range(2))
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = function.attend("sdpa", module, q, k, v, None, position_ids=torch.arange(40)[None])[0]
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    new = sorted(n for ptr, n in saved.items() if ptr not in inputs)
    assert inputs <= set(saved)
    assert new == sorted([out.numel() * 4, 2 * 4 * 40 * 4]), new  # the output [2, 4, 40, 16] and lse [2, 4, 40]
    out.sum().backward()
    assert all(t.grad is not None and t.grad.isfinite().all() for t in (q, k, v))


@pytest.mark.parametrize("name", BANDED)
def test_under_activation_checkpointing_the_forward_keeps_no_query_key_or_value(name):
    """Non-reentrant checkpointing drops what a call saves; nothing else of the call (the bands' rotations) may hold
    its q, k or v until the backward: they are freed once the forward returns, and the gradients still come."""
    model = tiny_model("llama", {"rope_type": name, **ENGINE_PARAMS[name]}, num_hidden_layers=1)
    module = model.model.layers[0].self_attn.train()
    x = torch.randn(2, 4, 40, 16, generator=torch.Generator().manual_seed(0), requires_grad=True)
    made = []

    def layer(x):
        q, k, v = x * 1.5, x[:, :2] * 0.5, x[:, 2:] * 2.0  # made inside: freed unless something holds them
        made.extend(weakref.ref(t) for t in (q, k, v))
        return function.attend("sdpa", module, q, k, v, None, position_ids=torch.arange(40)[None])[0]

    out = checkpoint(layer, x, use_reentrant=False)
    assert [ref() for ref in made[:3]] == [None, None, None]
    out.sum().backward()
    assert x.grad is not None and x.grad.isfinite().all()
