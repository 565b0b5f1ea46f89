"""A Dual Chunk Attention decode step (``engine.chunk_decode``): on a CPU, one batch row without padding, each band as
a piece of its own keys (``host_bands``); elsewhere one call over every key with the bands' rule. Both against the
reference engine at every phase of the chunk (r = m mod c) and every cache length, so that each band is in turn
empty, partial and whole."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model, with_rope

from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import chunk_decode, rotated_cache

PARAMS = {"chunk_size": 8, "local_size": 3}  # c = 5


def step_against_reference(kv: int, shift: int, batch: int = 1):
    """One query at position kv - 1 + shift after kv keys (consecutive positions up to it): (fast, reference)."""
    model = tiny_model("llama", with_rope("dual_chunk", PARAMS), num_hidden_layers=1)
    module = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(kv * 31 + shift)
    q = torch.randn(batch, 4, 1, 16, generator=g)
    k, v = torch.randn(2, batch, 2, kv, 16, generator=g)
    pos = torch.full((batch, 1), kv - 1 + shift)
    with torch.no_grad():
        fast = function.attend("sdpa", module, q, k, v, None, position_ids=pos)[0]
        reference = function.attend("eager", module, q, k, v, None, position_ids=pos)[0]
    rotated_cache.forget(module)
    return fast, reference


def spy(monkeypatch) -> list:
    """The spans each ``host_bands`` call ran over."""
    seen, real = [], chunk_decode.host_bands

    def counted(call, q, keys, scale):
        seen.append(chunk_decode.band_spans(call))
        return real(call, q, keys, scale)

    monkeypatch.setattr(chunk_decode, "host_bands", counted)
    return seen


@pytest.mark.parametrize("shift", [0, 2, 4, 13])
@pytest.mark.parametrize("kv", [1, 2, 4, 5, 6, 9, 10, 11, 15, 23])
def test_host_bands_equal_the_reference(kv, shift, monkeypatch):
    seen = spy(monkeypatch)
    fast, reference = step_against_reference(kv, shift)
    assert len(seen) == 1
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-5)


def test_band_spans_cover_the_keys_once_by_chunk_gap(monkeypatch):
    """Band b's keys are those whose chunk gap floor(m/c) - floor(n/c) is b (2: two and more)."""
    seen = spy(monkeypatch)
    c = PARAMS["chunk_size"] - PARAMS["local_size"]
    for kv, shift in [(23, 0), (23, 4), (12, 13), (3, 1)]:
        step_against_reference(kv, shift)
        m = kv - 1 + shift
        expected = [[j for j in range(kv) if min(2, m // c - (m - (kv - 1 - j)) // c) == b] for b in range(3)]
        assert [list(range(lo, hi)) for lo, hi in seen[-1]] == expected


@pytest.mark.parametrize("kv, shift, batch", [(23, 0, 1), (11, 4, 1), (23, 2, 2)])
def test_the_rule_plan_equals_the_reference(kv, shift, batch, monkeypatch):
    """On devices without host bands (the CPU told so here), and for a batch of rows: one call, the rule's mask."""
    if batch == 1:
        monkeypatch.setattr(chunk_decode, "HOST_BANDS", set())
    seen = spy(monkeypatch)
    fast, reference = step_against_reference(kv, shift, batch)
    assert seen == []
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-5)
