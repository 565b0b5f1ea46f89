"""The fast engine (sdpa) against the reference engine (eager), called as transformers calls them (bf16 and
gradients on every engine: ``test_attention_engines.py``).

Both run through ``attention.function.attend`` on the same module and tensors; block sizes are shrunk so that every
boundary (near blocks, far blocks, masked blocks, xPos chunks) falls inside the 40 tokens used here.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ENGINE_PARAMS, fast_plans, tiny_model, with_rope
from torch.nn import functional as F

from hf_rope_ext.attention import function, rotation
from hf_rope_ext.attention.engine import (
    call,
    kernels,
    masked,
    reference,
    rotated_cache,
    single_band,
    two_band,
)

PARAMS = ENGINE_PARAMS
TYPES = sorted(PARAMS)
LENGTH = 40


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(two_band, "near_block", lambda window: 3)
    monkeypatch.setattr(two_band, "FAR_BLOCK", 7)
    monkeypatch.setattr(single_band, "ROWS", 7)
    monkeypatch.setattr(masked, "MASK_BUDGET", 2 * LENGTH * 6)  # 6 query rows per masked block at batch 2
    for engine in (single_band, reference):
        monkeypatch.setattr(engine, "decay_rows", lambda call: 22)  # xPos chunks of 11 rows (fast), 22 (eager)


def module_of(name: str, **rope):
    model = tiny_model("llama", with_rope(name, PARAMS[name], **rope), num_hidden_layers=1)
    return model.model.layers[0].self_attn


def tensors(batch=2, q_len=LENGTH, kv=LENGTH, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, q_len, 16, generator=g)
    k, v = torch.randn(batch, 2, kv, 16, generator=g), torch.randn(batch, 2, kv, 16, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def both(module, q, k, v, mask, pos):
    """(sdpa fast path, eager reference) outputs [B, q, H, d] of the same call."""
    out = {i: function.attend(i, module, q, k, v, mask, position_ids=pos)[0] for i in ("sdpa", "eager")}
    return out["sdpa"], out["eager"]


def left_padding(batch=2, length=LENGTH, pad=6):
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, :pad] = False
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return (causal & mask[:, None, :])[:, None], pos  # [B, 1, q, kv]


def packed():
    segment = torch.cat((torch.zeros(17), torch.ones(LENGTH - 17)))
    causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
    mask = (causal & (segment[:, None] == segment[None, :]))[None, None].expand(2, 1, -1, -1)
    return mask, torch.cat((torch.arange(17), torch.arange(LENGTH - 17)))[None].expand(2, -1)


# PoSE's position ids: three runs with jumps, the second past a chunk of 8 (DCA's gap-1 band empty for the third)
SKIP_WISE = torch.cat((torch.arange(3, 20), torch.arange(29, 40), torch.arange(57, 69)))[None]
CASES = {  # name -> (rope overrides, mask, position_ids) for a prefill of LENGTH tokens
    "shifted": ({}, None, torch.arange(7, 7 + LENGTH)[None]),
    "skip-wise": ({}, None, SKIP_WISE),
    "window>=length": ({"window": 64}, None, torch.arange(LENGTH)[None]),
    "window-1": ({"window": 1}, None, torch.arange(LENGTH)[None]),
    "partial-rotary": ({"partial_rotary_factor": 0.5}, None, torch.arange(LENGTH)[None]),
    "left-padding": ({}, *left_padding()),
    "packed": ({}, *packed()),
    "sliding-window-mask": ({}, torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril().triu(-9)[None, None], None),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", TYPES)
def test_fast_path_equals_eager(name, case):
    rope, mask, pos = CASES[case]
    if "window" in rope and "window" not in PARAMS[name]:
        pytest.skip("no window")
    pos = torch.arange(LENGTH)[None] if pos is None else pos
    fast_out, reference = both(module_of(name, **rope), *tensors(), mask, pos)
    valid = torch.ones(2, LENGTH, dtype=torch.bool) if case != "left-padding" else mask[:, 0].any(-1)
    torch.testing.assert_close(fast_out[valid], reference[valid], rtol=0, atol=1e-5)


@pytest.mark.parametrize("grad", [False, True])
def test_dual_chunk_on_skip_wise_positions_runs_the_chunked_plan(grad, monkeypatch):
    """PoSE's skip-wise positions (no mask) take the fast chunked plan, forward and backward, not the reference
    engine; a position that goes back (a packed restart without its mask) still takes the reference engine."""
    module = module_of("dual_chunk")
    q, k, v = (t.requires_grad_(grad) for t in tensors())
    expected = function.attend("eager", module, q, k, v, None, position_ids=SKIP_WISE)[0]
    monkeypatch.setattr(reference, "run", lambda *args: pytest.fail("the reference engine ran"))
    out = function.attend("sdpa", module, q, k, v, None, position_ids=SKIP_WISE)[0]
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    if grad:
        fast_grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        eager_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
        for fast_grad, eager_grad in zip(fast_grads, eager_grads, strict=True):
            torch.testing.assert_close(fast_grad, eager_grad, rtol=0, atol=1e-4)
    with pytest.raises(pytest.fail.Exception, match="the reference engine ran"):
        function.attend("sdpa", module, q, k, v, None, position_ids=SKIP_WISE.flip(-1))


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("name", TYPES)
def test_decode_steps_reuse_rotated_keys_and_equal_eager(name, q_len):
    """A cache grown step by step (a new key tensor each time, as DynamicCache): every step equals eager, and
    a different key tensor of the same length and positions (another prompt) is not served stale rows.
    Several new tokens come with a mask (transformers passes none only for one query or no cache)."""
    module = module_of(name)
    q, k, v = tensors(kv=LENGTH + 3 * q_len)
    for step in range(3):  # window 5 < 40 keys: the near band's window memory is used too
        kv = LENGTH + (step + 1) * q_len
        pos = torch.arange(kv - q_len, kv)[None]
        rows = slice(step * q_len, (step + 1) * q_len)
        keys, values = k[:, :, :kv].clone(), v[:, :, :kv].clone()
        mask = None if q_len == 1 else call.causal_rows(slice(0, q_len), q_len, kv, "cpu")
        fast_out, reference = both(module, q[:, :, rows], keys, values, mask, pos)
        torch.testing.assert_close(fast_out, reference, rtol=0, atol=1e-5)
    for row in (3, kv - q_len - 1):  # one old key differs (far from the query, then in its window)
        other_k = keys.clone()
        other_k[:, :, row] += 1.0
        fast_out, reference = both(module, q[:, :, rows], other_k, values, mask, pos)
        torch.testing.assert_close(fast_out, reference, rtol=0, atol=1e-5)
    both(module, q[:, :, rows], keys, values, mask, pos)
    keys[:, :, 3] += 1.0  # the last call's own key tensor, written in place (a static cache, beam reordering)
    fast_out, reference = both(module, q[:, :, rows], keys, values, mask, pos)
    torch.testing.assert_close(fast_out, reference, rtol=0, atol=1e-5)
    rotated_cache.forget(module)


@pytest.mark.parametrize("name", TYPES)
def test_long_decode_moves_and_grows_the_remembered_rows(name):
    """70 one-token steps: the near band's window memory moves past its room (64 rows) and is rebased, the
    whole-cache memory outgrows its room and is copied into larger buffers; every step equals eager."""
    module, steps = module_of(name), 70
    q, k, v = tensors(batch=1, q_len=steps, kv=LENGTH + steps)
    for step in range(steps):
        kv = LENGTH + step + 1
        pos = torch.tensor([[kv - 1]])
        keys, values = k[:, :, :kv].clone(), v[:, :, :kv].clone()
        fast_out, reference = both(module, q[:, :, step : step + 1], keys, values, None, pos)
        torch.testing.assert_close(fast_out, reference, rtol=0, atol=1e-5)
    rotated_cache.forget(module)


@pytest.mark.parametrize("name", ["rerope", "leaky_rerope", "self_extend", "string"])
def test_decode_from_a_cache_shorter_than_the_window(name):
    """One-token steps from 1 to 14 cached keys, across the window of 8: every step equals eager, and while the
    cache is within the window each step from the third on rotates only its new key (remembered rows reused)."""
    module, steps = module_of(name, window=8), 14
    q, k, v = tensors(batch=1, q_len=steps, kv=steps)
    rotated = []

    def counted(x, *args, **kwargs):
        rotated.append(x.shape[2])
        return rotation.rotate(x, *args, **kwargs)

    for step in range(steps):
        pos = torch.tensor([[step]])
        keys, values = k[:, :, : step + 1].clone(), v[:, :, : step + 1].clone()
        rotated.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(two_band, "rotate", counted)
            fast_out, reference = both(module, q[:, :, step : step + 1], keys, values, None, pos)
        torch.testing.assert_close(fast_out, reference, rtol=0, atol=1e-5)
        if 1 < step < 8:  # step 0 has no cache to remember rows of; step 1 rotates its two keys once
            assert rotated == [1, 1], rotated  # the query and the new key: no cached key rotated again
    rotated_cache.forget(module)


@pytest.mark.parametrize("name", TYPES)
def test_no_dense_mask_or_full_keys_per_query_block(name, monkeypatch):
    """Prefill of 256 tokens without a mask: no kernel call gets a mask or a score-sized tensor of q * kv
    elements, and the near band reads at most block + window - 1 keys per call."""
    if not fast_plans(name):
        pytest.skip("the fast engine plans no such declaration: the reference engine runs it")
    monkeypatch.setattr(two_band, "near_block", lambda window: 16)
    monkeypatch.setattr(two_band, "FAR_BLOCK", 64)
    monkeypatch.setattr(single_band, "ROWS", 64)
    seen = []

    def spy(kernel):
        def call(q, k, v, *args, attn_mask=None, **kwargs):
            seen.append((q.shape[2], k.shape[2], None if attn_mask is None else attn_mask.numel()))
            return kernel(q, k, v, *args, attn_mask=attn_mask, **kwargs)

        return call

    monkeypatch.setattr(kernels, "_flash", spy(kernels._flash))
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy(F.scaled_dot_product_attention))
    length = 256
    module = module_of(name)
    q, k, v = tensors(batch=1, q_len=length, kv=length)
    function.attend("sdpa", module, q, k, v, None, position_ids=torch.arange(length)[None])
    assert seen, "the fast path made no kernel call"
    assert all(m is None or m < length * length // 4 for _, _, m in seen), seen
    if "window" in PARAMS[name]:
        masked = [(rows, keys) for rows, keys, m in seen if m is not None]
        assert masked and all(keys <= rows + PARAMS[name]["window"] - 1 for rows, keys in masked), masked


def test_rotation_in_row_pieces_equals_one_piece(monkeypatch):
    """Long keys are rotated and xPos-scaled ROWS rows at a time (bounded temporaries): bit-identical; the fused
    scale equals the reference engine's rotation then scaling."""
    g = torch.Generator().manual_seed(4)
    x, pos = torch.randn(2, 3, 100, 24, generator=g), torch.arange(100)[None].expand(2, 100) * 7
    inv_freq = 1 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)  # partial rotary: 16 of 24 dims
    log_scale = -torch.rand(2, 1, 100, 8, generator=g, dtype=torch.float64)
    whole, fused = rotation.rotate(x, pos, inv_freq), rotation.rotate(x, pos, inv_freq, log_scale)
    monkeypatch.setattr(rotation, "ROWS", 7)
    assert torch.equal(rotation.rotate(x, pos, inv_freq), whole)
    assert torch.equal(rotation.rotate(x, pos, inv_freq, log_scale), fused)
    torch.testing.assert_close(fused, reference.scale_pairs(whole, log_scale), rtol=0, atol=1e-6)
