"""What the fast engine keeps for the backward of a banded call on the CPU kernel (``engine.banded``): the queries,
keys and values as given, the output and its log-sum-exp, nothing else (no rotated copies, masks, piece outputs or
merge weights), however many pieces the call takes; the gradients themselves are the reference engine's
(tests/test_attention_engines.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import ENGINE_PARAMS, tiny_model

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
