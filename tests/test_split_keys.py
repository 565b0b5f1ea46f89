"""A CPU decode piece with its keys split into parts (``engine.split_keys``): against the unsplit kernel call, the
rule choosing the parts, and every type's decode step through it against the reference engine."""

from __future__ import annotations

import pytest
import torch
from conftest import ENGINE_PARAMS, tiny_model, with_rope

from hf_rope_ext.attention import function
from hf_rope_ext.attention.engine import kernels, rotated_cache, split_keys
from hf_rope_ext.attention.engine.piece import Piece

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def qkv(rows=6, kv=103, heads=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, rows, 16, generator=g)
    k, v = torch.randn(2, 1, heads, kv + 5, 16, generator=g)  # views of longer buffers, as a static cache's rows
    return q.to(dtype), k[..., :kv, :].to(dtype), v[..., :kv, :].to(dtype)


def hiding(rows, kv, heads, seed=1):
    """An additive mask [1, heads, rows, kv] hiding with float32's minimum (as the engine's rules and padding):
    random holes, row 0 seeing only the last 3 keys (nothing in the first parts), row 1 seeing no key at all."""
    g = torch.Generator().manual_seed(seed)
    seen = torch.rand(1, heads, rows, kv, generator=g) > 0.3
    seen[:, :, 0, : kv - 3] = False
    seen[:, :, 1] = False
    return torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("kv, count", [(96, 2), (103, 2), (103, 3), (103, 16), (40, 40)])  # 103: 1-15 keys left over
@pytest.mark.parametrize("mask_heads", [None, 1, 3])
def test_split_equals_one_call(kv, count, mask_heads):
    q, k, v = qkv(kv=kv)
    mask = None if mask_heads is None else hiding(q.shape[2], kv, mask_heads)
    out, lse = split_keys.split_flash(FLASH, q, k, v, mask, 0.3, count)
    expected, expected_lse = FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=0.3)[:2]
    assert out.shape == expected.shape and lse.shape == expected_lse.shape
    seen = expected_lse > -1e30  # row 1 sees no key: lse about the minimum, its output meaningless, split or not
    torch.testing.assert_close(out[seen], expected[seen], rtol=0, atol=1e-6)
    torch.testing.assert_close(lse[seen], expected_lse[seen], rtol=0, atol=1e-5)
    assert (lse[~seen] < -1e30).all() and seen.sum() == seen.numel() - (mask_heads is not None) * seen[:, :, 1].numel()


def test_split_in_bfloat16_within_its_rounding():
    q, k, v = qkv(kv=4099, dtype=torch.bfloat16)
    out, _ = split_keys.split_flash(FLASH, q, k, v, None, 0.25, 5)
    reference = torch.softmax(q.float() @ k.float().transpose(-1, -2) * 0.25, -1) @ v.float()
    unsplit = FLASH(q, k, v, 0.0, False, scale=0.25)[0].float()
    bound = 2 * (unsplit - reference).abs().max() + 2**-8 * reference.abs().max()
    assert (out.float() - reference).abs().max() <= bound


@pytest.mark.parametrize(
    "batch, heads, rows, kv, causal, grad, parts",
    [
        (1, 3, 9, 32768, False, False, 3),  # 3 kv heads: 3 parts for 9 tasks
        (1, 3, 9, 3072, False, False, 3),  # at least 1024 keys a part
        (1, 3, 3, 2048, False, False, 2),
        (1, 3, 3, 2047, False, False, 1),  # fewer than two parts' keys
        (1, 3, 9, 3071, False, False, 2),
        (1, 1, 3, 10**6, False, False, split_keys.TASKS),
        (1, 5, 9, 32768, False, False, 2),
        (1, 8, 9, 32768, False, False, 1),  # tasks enough
        (2, 3, 3, 32768, False, False, 1),  # a batch: its rows are tasks already
        (1, 3, split_keys.MOST_ROWS, 32768, False, False, 3),
        (1, 3, split_keys.MOST_ROWS + 1, 32768, False, False, 1),  # a prefill's rows
        (1, 3, 9, 32768, True, False, 1),
        (1, 3, 9, 32768, False, True, 1),  # autograd: the kernel's backward takes one call
    ],
)
def test_parts(batch, heads, rows, kv, causal, grad, parts):
    q = torch.zeros(batch, heads, rows, 16, requires_grad=grad)
    k = torch.zeros(batch, heads, kv, 16)
    assert split_keys.parts(q, k, causal) == parts


def test_no_split_inside_a_compiled_graph(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert split_keys.parts(torch.zeros(1, 3, 3, 16), torch.zeros(1, 3, 32768, 16), False) == 1


@pytest.mark.parametrize("pad", [0, 5])
@pytest.mark.parametrize("name", sorted(ENGINE_PARAMS))
def test_each_types_decode_step_through_split_keys_equals_eager(name, pad, monkeypatch):
    """One query after 60 keys (GQA; ``pad`` keys of left padding hidden by the mask), parts of 7 keys: every
    type's decode pieces run split and equal the reference engine."""
    monkeypatch.setattr(split_keys, "PART_KEYS", 7)
    model = tiny_model("llama", with_rope(name, ENGINE_PARAMS[name]), num_hidden_layers=1)
    module, kv = model.model.layers[0].self_attn, 60
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 16, generator=g)
    k, v = torch.randn(2, 1, 2, kv, 16, generator=g)
    pos = torch.tensor([[kv - 1 - pad]])
    mask = None if not pad else (torch.arange(kv) >= pad)[None, None, None]  # [1, 1, 1, kv]
    before = kernels.RAN["cpu_flash_split"]
    with torch.no_grad():
        fast = function.attend("sdpa", module, q, k, v, mask, position_ids=pos)[0]
        reference = function.attend("eager", module, q, k, v, mask, position_ids=pos)[0]
    assert kernels.RAN["cpu_flash_split"] > before
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-5)
    rotated_cache.forget(module)


def test_a_window_piece_is_not_split(monkeypatch):
    """The CPU kernel's own window mask hides by -inf (a row hidden from a whole part would take lse 0 there):
    such a piece runs as one call, its result that of the unsplit kernel."""
    q, k, v = qkv(rows=2, kv=60)
    window = Piece(row0=59, column0=1, low=0, high=5)  # each row sees its last 5 keys only
    expected = kernels.cpu_flash(q, k, v, window, 0.3)
    monkeypatch.setattr(split_keys, "PART_KEYS", 7)
    before = kernels.RAN["cpu_flash_split"]
    out = kernels.cpu_flash(q, k, v, window, 0.3)
    assert kernels.RAN["cpu_flash_split"] == before
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
