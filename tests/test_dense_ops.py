"""The CUDA kernel's fused ops (``engine.dense_ops``): which pieces they take, each op's output form, the check of
its lse, and where the engine's plans use them. torch's fused CUDA ops do not run on a CPU, so each is replaced by a
twin of its meaning in its own output form (``cuda_twins.FUSED_ATEN``); ``benchmarks/check_engines.py`` runs the
real ones on a GPU."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_model
from cuda_twins import FUSED_ATEN, dense_kernel, flash_twin, fused_kernel
from torch.nn.attention import SDPBackend

from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import dense_ops, kernels, rotated_cache
from hf_rope_ext.attention.engine.piece import Piece

BACKENDS = sorted(dense_ops.OPS, key=lambda b: b.name)


@pytest.mark.parametrize(
    "piece, rows, columns, flag",
    [
        (Piece(), 20, 30, False),  # every key seen
        (Piece(row0=50, low=0), 1, 40, False),  # causal, but one row past every key: nothing cut
        (Piece(low=0), 20, 20, True),  # a square seen causally from its top left
        (Piece(low=0), 20, 21, None),  # causal, not square
        (Piece(row0=3, column0=3, low=0), 20, 20, True),
        (Piece(row0=4, column0=3, low=0), 20, 20, None),  # causal shifted by one
        (Piece(low=1), 20, 20, None),  # the diagonal hidden
        (Piece(row0=13, column0=9, low=0, high=5), 20, 24, None),  # a window
        (Piece(mask=torch.zeros(1, 1, 20, 30)), 20, 30, None),
        (Piece(), 0, 30, None),
        (Piece(), 20, 0, None),
    ],
)
def test_the_fused_ops_take_rectangles_and_top_left_causal_squares_only(piece, rows, columns, flag):
    assert dense_ops.causal_flag(piece, rows, columns) is flag


def qkv(rows, columns, heads=4, kv_heads=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, rows, 16, generator=g)
    k, v = torch.randn(2, 2, kv_heads, columns, 16, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("piece, rows, columns", [(Piece(), 20, 45), (Piece(low=0), 37, 37), (Piece(), 1, 40)])
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_each_fused_op_gives_the_pieces_output_and_lse(backend, piece, rows, columns, kv_heads, dtype):
    """Each op's output form read right (cuDNN's [B, H, c, 1] lse, the memory-efficient one's padded rows), the
    grouped kv heads passed in place, and the op, not the general kernel, run."""
    q, k, v = qkv(rows, columns, kv_heads=kv_heads, dtype=dtype)
    before = kernels.RAN.copy()
    out, lse = fused_kernel(backend)(q, k, v, piece, 0.3)
    want_out, want_lse = dense_kernel(q, k, v, piece, 0.3)
    assert lse.shape == (2, 4, rows) and out.shape == (2, 4, rows, 16)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-5)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-5)
    ran = kernels.RAN - before
    assert ran == {backend.name.lower(): 1}, ran


@pytest.mark.parametrize(
    "piece, rows, columns, grad",
    [
        (Piece(row0=13, column0=9, low=0, high=5), 20, 24, False),  # a window
        (Piece(), 20, 30, True),  # a rectangle with autograd: the ops' lse has no gradient
    ],
)
def test_pieces_the_ops_do_not_take_and_gradients_go_to_the_general_kernel(piece, rows, columns, grad):
    q, k, v = qkv(rows, columns)
    q.requires_grad_(grad)
    before = kernels.RAN.copy()
    out, lse = fused_kernel(SDPBackend.FLASH_ATTENTION)(q, k, v, piece, 0.3)
    assert kernels.RAN - before == {"flex": 1}
    torch.testing.assert_close(out, dense_kernel(q, k, v, piece, 0.3)[0], rtol=0, atol=1e-5)


def test_math_as_torchs_choice_leaves_the_piece_to_the_general_kernel():
    q, k, v = qkv(20, 30)
    before = kernels.RAN.copy()
    fused_kernel(SDPBackend.MATH)(q, k, v, Piece(), 0.3)
    assert kernels.RAN - before == {"flex": 1}


def log2_flash(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale):
    out, lse, *rest = flash_twin(q, k, v, dropout_p, is_causal, return_debug_mask, scale=scale)
    return out, lse / math.log(2), *rest


def failing_flash(*args, **kwargs):
    raise RuntimeError("no kernel image is available for execution on the device")


@pytest.mark.parametrize("op", [log2_flash, failing_flash])
def test_an_op_whose_lse_disagrees_or_that_fails_is_not_used(op, monkeypatch):
    """An op giving its lse in another form (base 2 here) or failing on the device is refused once, with a
    warning naming it, and its pieces take the general kernel, so the merge stays right."""
    monkeypatch.setattr(dense_ops, "CHECKED", {})
    aten = SimpleNamespace(**{**vars(FUSED_ATEN), "_scaled_dot_product_flash_attention": op})
    q, k, v = qkv(20, 30)
    before = kernels.RAN.copy()
    with pytest.warns(UserWarning, match="FLASH_ATTENTION op on cpu torch.float32"):
        out, lse = fused_kernel(SDPBackend.FLASH_ATTENTION, aten)(q, k, v, Piece(), 0.3)
    fused_kernel(SDPBackend.FLASH_ATTENTION, aten)(q, k, v, Piece(), 0.3)  # checked once: no second warning
    assert kernels.RAN - before == {"flex": 2}
    torch.testing.assert_close(lse, dense_kernel(q, k, v, Piece(), 0.3)[1], rtol=0, atol=1e-5)


def causal_ignored(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale):
    return flash_twin(q, k, v, dropout_p, False, return_debug_mask, scale=scale)


def test_an_op_is_checked_for_causal_pieces_apart_from_rectangles(monkeypatch):
    """An op right on rectangles and wrong on causal squares (here: one that ignores the flag) is used for the
    former and refused for the latter."""
    monkeypatch.setattr(dense_ops, "CHECKED", {})
    aten = SimpleNamespace(**{**vars(FUSED_ATEN), "_scaled_dot_product_flash_attention": causal_ignored})
    kernel, before = fused_kernel(SDPBackend.FLASH_ATTENTION, aten), kernels.RAN.copy()
    kernel(*qkv(20, 30), Piece(), 0.3)
    q, k, v = qkv(20, 20)
    with pytest.warns(UserWarning, match="FLASH_ATTENTION"):
        out, _ = kernel(q, k, v, Piece(low=0), 0.3)
    assert kernels.RAN - before == {"flash_attention": 1, "flex": 1}
    torch.testing.assert_close(out, dense_kernel(q, k, v, Piece(low=0), 0.3)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_torchs_choice_is_sdpas_own(kv_heads):
    """On CPU torch's sdpa runs its flash kernel for these shapes, grouped kv heads included (asked without
    ``enable_gqa``, torch would answer math); the choice is read, not assumed."""
    q, k, v = qkv(20, 20, kv_heads=kv_heads)
    assert dense_ops.choice(q, k, v, True, 0.3) == SDPBackend.FLASH_ATTENTION


PARAMS = {"rerope": {"window": 6}, "self_extend": {"window": 6, "group_size": 3}, "string": {"window": 6}}


def attend(name, q, k, v, pos, implementation="sdpa"):
    """A prefill of q's rows after the keys before them, with the mask transformers gives sdpa: none without a
    cache, causal on the cache with one."""
    model = tiny_model("llama", {"rope_type": name, **PARAMS[name]}, num_hidden_layers=1)
    rows, columns = q.shape[2], k.shape[2]
    mask = torch.ones(rows, columns, dtype=torch.bool).tril(columns - rows)[None, None] if columns > rows else None
    return function.attend(implementation, model.model.layers[0].self_attn, q, k, v, mask, position_ids=pos)[0]


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_two_band_prefill_runs_its_far_band_on_the_fused_op(name, monkeypatch):
    """Without a cache the far band is one causal square on the CUDA plan (whole bands): cuDNN's piece, the near
    window flex's; with 10 cached keys the far band is a rectangle and a square, both cuDNN's."""
    monkeypatch.setitem(kernels.KERNELS, "cpu", fused_kernel(SDPBackend.CUDNN_ATTENTION))
    monkeypatch.setattr(kernels, "WHOLE_BANDS", {"cpu", "cuda"})
    for cached in (0, 10):
        q, k, v = qkv(30, 30 + cached, seed=cached)
        pos = torch.arange(cached, 30 + cached)[None]
        before = kernels.RAN.copy()
        got = attend(name, q, k, v, pos)
        assert kernels.RAN - before == {"cudnn_attention": 1 if cached == 0 else 2, "flex": 1}
        torch.testing.assert_close(got, attend(name, q, k, v, pos, "eager"), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_decode_step_runs_both_bands_on_the_fused_op(name, monkeypatch):
    monkeypatch.setitem(kernels.KERNELS, "cpu", fused_kernel(SDPBackend.FLASH_ATTENTION))
    q, k, v = qkv(3, 43)
    model = tiny_model("llama", {"rope_type": name, **PARAMS[name]}, num_hidden_layers=1)
    module = model.model.layers[0].self_attn
    for step in range(3):
        kv = 41 + step
        args = (q[:, :, step : step + 1], k[:, :, :kv].clone(), v[:, :, :kv].clone(), None)
        pos = torch.tensor([[kv - 1]])
        before = kernels.RAN.copy()
        got = function.attend("sdpa", module, *args, position_ids=pos)[0]
        assert kernels.RAN - before == {"flash_attention": 2}
        torch.testing.assert_close(got, function.attend("eager", module, *args, position_ids=pos)[0], rtol=0, atol=1e-5)
    rotated_cache.forget(module)
