"""The one rotation (``hf_rope_ext.attention.rotation``) against a slow reference: each pair turned by its own 2x2
matrix in float64, in both layouts, partial rotary dims passing through; its precision rule (float64 angles, even
under autocast; float32 products, cast back) and its two paths (autograd, and in place without) agreeing."""

from __future__ import annotations

import math

import pytest
import torch

from hf_rope_ext.attention import rotation

HEAD_DIM, ROTARY = 12, 8  # partial rotary: 8 of 12 dims turn, the last 4 pass through
INV_FREQ = 1 / 10000 ** (torch.arange(0, ROTARY, 2, dtype=torch.float64) / ROTARY)  # [4]
H = ROTARY // 2  # pairs
PAIRS = {"half": [(i, i + H) for i in range(H)], "interleaved": [(2 * i, 2 * i + 1) for i in range(H)]}


def slow_turn(x: torch.Tensor, positions: list[float], layout: str) -> torch.Tensor:
    """x [L, HEAD_DIM] with row l turned by positions[l]: pair i = (a, b) of ``layout`` times the matrix
    [[cos, -sin], [sin, cos]] of angle positions[l] * theta_i (math.cos in float64); float64 out."""
    out = x.double().clone()
    for row, p in enumerate(positions):
        for i, (a, b) in enumerate(PAIRS[layout]):
            phi = p * INV_FREQ[i].item()
            c, s = math.cos(phi), math.sin(phi)
            out[row, a] = c * x[row, a].double() - s * x[row, b].double()
            out[row, b] = s * x[row, a].double() + c * x[row, b].double()
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("grad", [False, True], ids=["in_place", "autograd"])
def test_turn_equals_slow_pair_rotations(layout, grad):
    positions = [0.0, 1.0, 7.5, 4096.0, 131071.0]  # fractional and far positions too
    x = torch.randn(len(positions), HEAD_DIM, generator=torch.Generator().manual_seed(0)).requires_grad_(grad)
    cos, sin = rotation.cos_sin(torch.tensor(positions), INV_FREQ)  # [L, 4] float32
    out = rotation.turn(x, cos, sin, layout)
    assert out.dtype == torch.float32 and out.requires_grad == grad
    torch.testing.assert_close(out.double(), slow_turn(x.detach(), positions, layout), rtol=0, atol=2e-6)
    assert torch.equal(out[:, ROTARY:], x[:, ROTARY:])  # past the rotary dim: unchanged


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotate_in_bf16_is_the_float32_rotation_cast_back(layout):
    g = torch.Generator().manual_seed(1)
    x, pos = torch.randn(2, 3, 5, HEAD_DIM, generator=g).bfloat16(), torch.arange(5)[None].expand(2, 5) * 30001
    out = rotation.rotate(x, pos, INV_FREQ, layout=layout)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, rotation.rotate(x.float(), pos, INV_FREQ, layout=layout).bfloat16())


def test_angles_are_float64_under_autocast_past_100k():
    """At 131071 * theta_0 (1.3e5 rad) float32 angles are off by ~1e-2 rad; these match float64 within the float32
    rounding of cos/sin."""
    positions = torch.tensor([131071, 100003])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = rotation.cos_sin(positions, INV_FREQ.float(), 0.5)
    exact = positions[:, None].double() * INV_FREQ.float().double()
    assert cos.dtype == sin.dtype == torch.float32
    torch.testing.assert_close(cos.double(), exact.cos() * 0.5, rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.double(), exact.sin() * 0.5, rtol=0, atol=1e-7)


def test_layouts_are_one_rotation_in_two_orders():
    """The interleaved turn of x equals the half turn of x with each pair's two dims moved to (i, i + r/2)."""
    x = torch.randn(4, HEAD_DIM, generator=torch.Generator().manual_seed(2))
    cos, sin = rotation.cos_sin(torch.arange(4) * 977, INV_FREQ)
    order = [a for a, _ in PAIRS["interleaved"]] + [b for _, b in PAIRS["interleaved"]] + list(range(ROTARY, HEAD_DIM))
    half = rotation.turn(x[:, order], cos, sin, "half")
    assert torch.equal(rotation.turn(x, cos, sin, "interleaved")[:, order], half)


@pytest.fixture
def one_pass_on_cpu(monkeypatch):
    """The one-pass rotation taken on CPU for tensors above 16 rows, compiled with aot_eager (dynamo's trace and
    autograd's decomposition, no code generation: quick); returns the calls it received."""
    monkeypatch.setattr(rotation, "ONE_PASS", {"cpu"})
    monkeypatch.setattr(rotation, "ROWS", 16)
    compiled, calls = torch.compile(rotation._rotate, dynamic=True, backend="aot_eager"), []

    def counted(*args):
        calls.append(args[0].shape)
        return compiled(*args)

    monkeypatch.setattr(rotation, "one_pass", lambda: counted)
    return calls


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "xpos_scaled"])
def test_a_long_tensor_rotated_in_one_pass_equals_the_pieces(layout, scaled, one_pass_on_cpu):
    """Above ROWS rows, on a one-pass device and without autograd: one compiled call, the pieces' result (partial
    rotary dims passing through, xPos's scale in the same pass); shorter tensors and autograd keep their paths."""
    g = torch.Generator().manual_seed(2)
    x, pos = torch.randn(2, 3, 40, HEAD_DIM, generator=g), torch.arange(40)[None].expand(2, 40) * 977
    log_scale = torch.randn(2, 1, 40, H, generator=g) * 0.1 if scaled else None
    out = rotation.rotate(x, pos, INV_FREQ, log_scale, layout)
    assert one_pass_on_cpu == [x.shape]
    with pytest.MonkeyPatch.context() as pieces:
        pieces.setattr(rotation, "ONE_PASS", set())
        expected = rotation.rotate(x, pos, INV_FREQ, log_scale, layout)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert torch.equal(out[..., ROTARY:], x[..., ROTARY:])
    rotation.rotate(x[:, :, :16], pos[:, :16], INV_FREQ, log_scale=None, layout=layout)
    rotation.rotate(x.requires_grad_(True), pos, INV_FREQ, log_scale, layout)
    assert len(one_pass_on_cpu) == 1


def test_the_one_pass_rotation_runs_compiled_by_inductor():
    """The real compiled rotation (inductor, C++ on CPU): a bfloat16 tensor within one bfloat16 step of the pieces'
    result, float32 within 1e-6."""
    g = torch.Generator().manual_seed(3)
    x, pos = torch.randn(1, 2, 300, HEAD_DIM, generator=g), torch.arange(300)[None] * 101
    for dtype, tolerance in ((torch.float32, 1e-6), (torch.bfloat16, 2**-7)):
        out = rotation.one_pass()(x.to(dtype), pos, INV_FREQ, None, "half")
        expected = rotation.rotate(x.to(dtype), pos, INV_FREQ)
        assert out.dtype == dtype
        assert ((out.float() - expected.float()).abs() / expected.float().abs().clamp(min=1)).max() <= tolerance
