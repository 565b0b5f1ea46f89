"""Scores and value sums of keys (values) turned without writing them (``engine.traced_scores``) against turning them
with ``rotation.rotate`` and multiplying: GQA, partial rotary, fractional positions, xPos's pair factors, batch rows
at their own positions; the opaque cos/sin op's registration (torch.library.opcheck) and a compiled call."""

from __future__ import annotations

import pytest
import torch

from hf_rope_ext.attention.engine.reference import grouped_product
from hf_rope_ext.attention.engine.traced_scores import kept_cos_sin, turned_scores, turned_values
from hf_rope_ext.attention.rotation import cos_sin, rotate

INV_FREQ = 1.0 / 10000 ** (torch.arange(0, 8, dtype=torch.float64) / 8)  # r = 16 rotary dims


def inputs(dim: int, seed: int = 0, dtype=torch.float32):
    """query [2, 6, 1, dim], keys and values [2, 3, 11, dim], fractional positions [2, 11] (the rows differ)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 6, 1, dim, generator=g).to(dtype)
    k, v = (torch.randn(2, 3, 11, dim, generator=g).to(dtype) for _ in range(2))
    positions = torch.stack((torch.arange(11) * 2.5, torch.arange(11) / 3.0 + 1000.0))
    return q, k, v, positions


@pytest.mark.parametrize("dim", [16, 24])  # every dim rotary; 8 dims past the rotary ones
def test_turned_scores_equal_the_scores_of_rotated_keys(dim):
    q, k, _, positions = inputs(dim)
    expected = grouped_product(q, rotate(k, positions, INV_FREQ).transpose(-1, -2))
    torch.testing.assert_close(turned_scores(q, k, positions, INV_FREQ), expected, rtol=1e-5, atol=1e-5)


def test_turned_scores_take_xpos_factors_per_pair():
    q, k, _, positions = inputs(16, seed=1)
    log_scale = -torch.rand(2, 1, 11, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 3
    expected = grouped_product(q, rotate(k, positions, INV_FREQ, log_scale).transpose(-1, -2))
    torch.testing.assert_close(turned_scores(q, k, positions, INV_FREQ, log_scale), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [16, 24])
def test_turned_values_equal_weights_times_rotated_values(dim):
    _, _, v, positions = inputs(dim, seed=3)
    w = torch.softmax(torch.randn(2, 6, 1, 11, generator=torch.Generator().manual_seed(4)), dim=-1)
    expected = grouped_product(w, rotate(v, positions, INV_FREQ))
    torch.testing.assert_close(turned_values(w, v, positions, INV_FREQ), expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_stay_within_rounding_of_float32():
    q, k, v, positions = inputs(16, seed=5, dtype=torch.bfloat16)
    got = turned_scores(q, k, positions, INV_FREQ)
    expected = turned_scores(q.float(), k.float(), positions, INV_FREQ)
    assert got.dtype == torch.bfloat16 and (got.float() - expected).abs().max() <= 2**-8 * expected.abs().max()


def test_the_cos_sin_op_is_registered_for_the_compiler():
    """Fake (meta) shapes, schema, autograd registration as torch.library checks them; its values are cos_sin's."""
    positions, log_scale = torch.arange(7.0)[None, None] * 300, -torch.rand(1, 1, 7, 8, dtype=torch.float64)
    torch.library.opcheck(kept_cos_sin, (positions, INV_FREQ))
    torch.library.opcheck(kept_cos_sin, (positions, INV_FREQ, log_scale))
    for got, expected in zip(kept_cos_sin(positions, INV_FREQ), cos_sin(positions, INV_FREQ), strict=True):
        assert torch.equal(got, expected)


def test_inductor_compiles_them_whole():
    """fullgraph (no break at the op), the values as uncompiled."""
    q, k, v, positions = inputs(24, seed=6)
    w = torch.softmax(torch.randn(2, 6, 1, 11, generator=torch.Generator().manual_seed(7)), dim=-1)

    def both(q, k, v, w, positions):
        return turned_scores(q, k, positions, INV_FREQ), turned_values(w, v, positions, INV_FREQ)

    torch._dynamo.reset()
    got = torch.compile(both, fullgraph=True, backend="inductor")(q, k, v, w, positions)
    for a, b in zip(got, both(q, k, v, w, positions), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
