"""The package's attention-level types under ``attn_implementation="flex_attention"`` and flash-attention.

transformers hands those implementations masks of their own (flex: a ``BlockMask``; flash: None or a 2D padding
mask, packed sequences as restarting position_ids, a sliding window as a keyword); the package reads them
(``attention.mask_formats``) and runs the fast engine, whose CUDA kernel is compiled flex_attention. Here flex
loads and runs on CPU (transformers compiles its block masks); flash cannot be loaded without flash_attn and CUDA,
so the tests set it on a loaded model, as ``set_attn_implementation`` would. Both run with the CUDA kernel swapped
for the block-list twin (``cuda_twins``), with blocks of 8 so that pieces have partly and fully listed blocks.
The reference is the same model under ``"eager"`` (the reference engine, given transformers' eager masks).
"""

from __future__ import annotations

import pytest
import torch
from conftest import ENGINE_PARAMS_WITH_DYNAMIC_YARN, tiny_model
from cuda_twins import block_list_kernel
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from hf_rope_ext.attention import mask_formats
from hf_rope_ext.attention.engine import flex, kernels

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

PARAMS = ENGINE_PARAMS_WITH_DYNAMIC_YARN
TYPES = sorted(PARAMS)
IMPLEMENTATIONS = ["flex_attention", "flash_attention_2"]
LENGTH = 40


@pytest.fixture
def cuda_twin(monkeypatch):
    monkeypatch.setitem(kernels.KERNELS, "cpu", block_list_kernel)
    monkeypatch.setattr(flex, "BLOCK", 8)


def model_of(name: str, family: str = "llama", **overrides):
    return tiny_model(family, {"rope_type": name, **PARAMS[name]}, **overrides)


def run(model, implementation: str, ids, **inputs):
    model.config._attn_implementation = implementation
    try:
        with torch.no_grad():
            return model(ids, **inputs).logits
    finally:
        model.config._attn_implementation = "eager"


def batch(padded: bool):
    ids = torch.randint(3, 97, (2, LENGTH), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :6] = 0
    return ids, mask


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "left-padding"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", TYPES)
def test_prefill_equals_eager(name, implementation, padded, cuda_twin):
    model = model_of(name)
    ids, mask = batch(padded)
    expected, got = (run(model, i, ids, attention_mask=mask) for i in ("eager", implementation))
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", TYPES)
def test_generate_with_a_cache_equals_eager(name, implementation, cuda_twin):
    """Greedy decoding of a left-padded batch: every step's mask in the implementation's format, keys cached."""
    model = model_of(name)
    ids, mask = batch(padded=True)
    found = {}
    for chosen in ("eager", implementation):
        model.config._attn_implementation = chosen
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=4, do_sample=False, output_scores=True,
                return_dict_in_generate=True, pad_token_id=0,
            )  # fmt: skip
        found[chosen] = out
    model.config._attn_implementation = "eager"
    assert torch.equal(found[implementation].sequences, found["eager"].sequences)
    for got, expected in zip(found[implementation].scores, found["eager"].scores, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", TYPES)
def test_flash_packed_sequences_are_kept_apart(name, cuda_twin):
    """One row holding three documents (position_ids restarting at 0, no mask), as transformers' eager reads it
    (without a cache its mask keeps the documents apart); a type that does not follow the length reads each alone."""
    model = model_of(name)
    lengths = (10, 17, 13)
    ids = torch.randint(3, 97, (1, sum(lengths)), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    got = run(model, "flash_attention_2", ids, position_ids=positions, use_cache=False)
    expected = run(model, "eager", ids, position_ids=positions, use_cache=False)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    if "dynamic" not in name:  # a dynamic type's frequencies follow the row's length
        starts = torch.tensor((0, *lengths)).cumsum(0).tolist()
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            torch.testing.assert_close(got[:, a:b], run(model, "eager", ids[:, a:b]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["rerope", "xpos"])
def test_sliding_window_family(name, implementation, cuda_twin):
    """Mistral with a window of 12 over 40 tokens, padded: flash gets the window as a keyword, flex in its mask."""
    model = model_of(name, "mistral", sliding_window=12)
    ids, mask = batch(padded=True)
    expected, got = (run(model, i, ids, attention_mask=mask) for i in ("eager", implementation))
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=0, atol=1e-5)


# the mask formats, against masks written out here


def causal_and_kept(keep: torch.Tensor, q_len: int) -> torch.Tensor:
    """[B, 1, q, kv]: query i (key index kv - q + i) sees key j <= its index that ``keep`` [B, kv] keeps."""
    kv = keep.shape[1]
    causal = torch.arange(kv)[None, :] <= torch.arange(kv - q_len, kv)[:, None]
    return causal[None, None] & keep[:, None, None, :].bool()


def test_flash_masks():
    keep = torch.ones(2, 20, dtype=torch.long)
    keep[0, :3] = 0
    got = mask_formats.engine_mask("flash_attention_2", keep, 5, 20, {}, "cpu")
    assert torch.equal(got, causal_and_kept(keep, 5))
    # a static cache: the mask covers the 12 filled slots of 20; the rest are never seen
    short = mask_formats.engine_mask("flash_attention_2", keep[:, :12], 1, 20, {}, "cpu")
    assert torch.equal(short[..., :12], causal_and_kept(keep[:, :12], 1)) and not bool(short[..., 12:].any())
    # a window of 4: distance < 4
    window = mask_formats.engine_mask("flash_attention_2", None, 6, 6, {"sliding_window": 4}, "cpu")[0, 0]
    distance = torch.arange(6)[:, None] - torch.arange(6)[None, :]
    assert torch.equal(window, (distance >= 0) & (distance < 4))
    in_order = {"position_ids": torch.arange(6)[None]}
    assert mask_formats.engine_mask("flash_attention_3", None, 6, 6, in_order, "cpu") is None
    with pytest.raises(ValueError, match=r"flash-attention mask of shape \(2, 21\) does not fit 20 keys"):
        mask_formats.engine_mask("flash_attention_2", torch.ones(2, 21), 1, 20, {}, "cpu")


def test_only_causal_reads_a_mask_in_blocks_and_misses_no_entry(monkeypatch):
    """Blocks of 2 rows over 5 queries on 9 keys: the plain causal mask (bool, additive) is causal; one entry
    flipped anywhere, a padded row of a batch, or more queries than keys is not."""
    monkeypatch.setattr(mask_formats, "CAUSAL_ROWS", 2)
    causal = causal_and_kept(torch.ones(1, 9), 5)  # [1, 1, 5, 9]
    additive = torch.zeros(causal.shape).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert mask_formats.only_causal(causal) and mask_formats.only_causal(additive)
    for i, j in [(i, j) for i in range(5) for j in range(9)]:
        flipped, biased = causal.clone(), additive.clone()
        flipped[0, 0, i, j] = ~flipped[0, 0, i, j]
        biased[0, 0, i, j] = 0.5 if causal[0, 0, i, j] else 0.0
        assert not mask_formats.only_causal(flipped) and not mask_formats.only_causal(biased), (i, j)
    keep = torch.ones(2, 9)
    keep[1, 0] = 0
    assert not mask_formats.only_causal(causal_and_kept(keep, 5))
    assert not mask_formats.only_causal(torch.ones(1, 1, 9, 5, dtype=torch.bool).tril())


def test_sdpa_and_eager_masks_of_plain_causal_reads_on_a_cache_come_out_as_none():
    causal = causal_and_kept(torch.ones(1, 9), 5)
    additive = torch.zeros(causal.shape).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert mask_formats.causal_on_cache(causal, 5, 9) is None and mask_formats.causal_on_cache(additive, 5, 9) is None
    keep = torch.ones(1, 9)
    keep[0, 0] = 0
    padded = causal_and_kept(keep, 5)
    assert mask_formats.causal_on_cache(padded, 5, 9) is padded
    assert mask_formats.causal_on_cache(causal, 5, 10) is causal  # a mask of other keys: kept
    square = causal_and_kept(torch.ones(1, 5), 5)
    assert mask_formats.causal_on_cache(square, 5, 5) is square  # no cache: transformers' own None or a mask kept
    assert mask_formats.engine_mask("sdpa", causal, 5, 9, {}, "cpu") is causal  # handed on as transformers made it


def test_the_mask_every_layer_is_handed_is_read_once(monkeypatch):
    """The same mask tensor, unchanged, is read once; changed in place, or another tensor, it is read again."""
    read, only_causal = [], mask_formats.only_causal
    monkeypatch.setattr(mask_formats, "only_causal", lambda m: read.append(1) or only_causal(m))
    causal = causal_and_kept(torch.ones(1, 9), 5)
    assert mask_formats.causal_on_cache(causal, 5, 9) is None and mask_formats.causal_on_cache(causal, 5, 9) is None
    assert len(read) == 1
    causal[0, 0, 0, 0] = False
    assert mask_formats.causal_on_cache(causal, 5, 9) is causal and len(read) == 2
    assert mask_formats.causal_on_cache(causal_and_kept(torch.ones(1, 9), 5), 5, 9) is None and len(read) == 3
    with torch.inference_mode():
        frozen = causal_and_kept(torch.ones(1, 9), 5)
        assert mask_formats.causal_on_cache(frozen, 5, 9) is None and mask_formats.causal_on_cache(frozen, 5, 9) is None
    assert len(read) == 4


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["self_extend", "rerope", "dual_chunk"])
def test_a_prompt_read_on_a_cache_takes_the_unmasked_plan_and_equals_one_read(name, implementation, monkeypatch):
    """A prompt read in two pieces (the second on a cache: transformers builds a [q, kv] causal mask there) takes
    the fast engine's unmasked plan and gives the logits of one read; the mask is read once for both layers."""
    import hf_rope_ext
    from hf_rope_ext.attention.engine import fast, reference

    model = model_of(name)
    ids = torch.randint(3, 97, (1, LENGTH), generator=torch.Generator().manual_seed(1))
    whole = run(model, implementation, ids)
    masked, on_mask, on_reference, only_causal = [], fast.two_band_masked, reference.run, mask_formats.only_causal
    monkeypatch.setattr(mask_formats, "only_causal", lambda m: masked.append("checked") or only_causal(m))
    monkeypatch.setattr(fast, "two_band_masked", lambda *a: masked.append("masked") or on_mask(*a))
    if implementation != "eager":  # eager runs the reference engine, as in stock transformers
        monkeypatch.setattr(reference, "run", lambda *a: masked.append("reference") or on_reference(*a))
    cache, keyword = hf_rope_ext.rope_cache(model), hf_rope_ext.cache_keyword(model)
    run(model, implementation, ids[:, :12], **{keyword: cache})
    pieces = run(model, implementation, ids[:, 12:], **{keyword: cache})
    assert masked == ["checked"] and torch.allclose(pieces, whole[:, 12:], atol=1e-5)  # once for both layers


def padded_block_mask(keep: torch.Tensor, q_len: int, block: int = 8) -> BlockMask:
    """A BlockMask as transformers builds one for flex: causal with an offset, and padding."""
    offset = keep.shape[1] - q_len

    def mask_mod(b, h, q, kv):
        return (kv <= q + offset) & keep[b, kv].bool()

    return create_block_mask(mask_mod, keep.shape[0], None, q_len, keep.shape[1], device="cpu", BLOCK_SIZE=block)


def test_flex_block_masks_read_as_compiled_flex_reads_them():
    keep = torch.ones(2, 30, dtype=torch.long)
    keep[1, :5] = 0
    block_mask = padded_block_mask(keep, 30)
    got = mask_formats.engine_mask("flex_attention", block_mask, 30, 30, {}, "cpu")
    assert torch.equal(got, causal_and_kept(keep, 30))
    assert torch.equal(mask_formats.block_mask_allowed(padded_block_mask(keep, 3)), causal_and_kept(keep, 3))
    # plain causal comes out as None (the engines' unmasked plans)
    causal = padded_block_mask(torch.ones(1, 30), 30)
    assert mask_formats.engine_mask("flex_attention", causal, 30, 30, {}, "cpu") is None
    # the lists decide: a block the lists leave out is not attended even where mask_mod allows it
    partly = torch.tensor([[[[True, False], [True, True]]]])
    fully = torch.zeros_like(partly)
    counts = lambda blocks: blocks.sum(-1, dtype=torch.int32)  # noqa: E731
    order = lambda blocks: torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # noqa: E731
    lists = BlockMask.from_kv_blocks(
        counts(partly), order(partly), counts(fully), order(fully), BLOCK_SIZE=8,
        mask_mod=lambda b, h, q, kv: q >= 0, seq_lengths=(16, 16),
    )  # fmt: skip
    allowed = mask_formats.block_mask_allowed(lists)[0, 0]
    assert bool(allowed[:8, :8].all()) and not bool(allowed[:8, 8:].any()) and bool(allowed[8:].all())


def test_a_block_mask_per_head_is_refused():
    block_mask = create_block_mask(lambda b, h, q, kv: kv <= q + h, 1, 2, 16, 16, device="cpu", BLOCK_SIZE=8)
    with pytest.raises(ValueError, match="flex BlockMask with 2 head masks"):
        mask_formats.engine_mask("flex_attention", block_mask, 16, 16, {}, "cpu")


def test_a_decode_steps_mask_is_read_once_for_every_layer_it_is_handed(monkeypatch):
    """``step_padding``: (the end of what rows see, "none" / "left" (left padding, a sliding window) / "other" (a
    hole), the mask cut at the end), bool or additive; a static cache's unfilled end cut off and its cut mask read as
    its own; each of a few masks handed in turn (full and sliding-window layers) read once (twice with an unfilled
    end), one written in place read again."""
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or tolist(t))
    seen = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    left, window, hole, unfilled, padded_unfilled = (seen.clone() for _ in range(5))
    left[0, ..., :3] = False
    window[..., :5] = False
    hole[1, ..., 4] = False
    unfilled[..., 6:] = False
    padded_unfilled[..., 6:] = False
    padded_unfilled[1, ..., :2] = False
    additive = torch.zeros(left.shape).masked_fill(~left, torch.finfo(torch.float32).min)
    masks = dict(none=seen, left=left, window=window, additive=additive, unfilled=unfilled, both=padded_unfilled)
    expected = dict(none=(8, "none"), left=(8, "left"), window=(8, "left"), additive=(8, "left"))
    expected.update(unfilled=(6, "none"), both=(6, "left"))
    for _layer in range(3):
        for name, mask in masks.items():
            end, kind, cut = mask_formats.step_padding(mask)
            assert (end, kind) == expected[name] and torch.equal(cut, mask[..., :end]), name
            assert mask_formats.step_padding(cut) == (end, kind, cut), name  # the cut one known as it is
    assert len(reads) == 4 + 2 * 2  # a static cache's unfilled end: read twice, once a step
    assert mask_formats.step_padding(hole)[:2] == (8, "other") and len(reads) == 10
    left[0, ..., 3:] = False
    left[0, ..., -1] = True
    assert mask_formats.step_padding(left)[:2] == (8, "left") and len(reads) == 11
    left[1, ..., 2] = False
    assert mask_formats.step_padding(left)[:2] == (8, "other")


def test_an_additive_mask_with_a_bias_is_never_read_as_seen_or_hidden():
    """``graded``: a float mask holding a value other than 0 on a seen key (a bias) takes the general masked path
    (``step_padding`` says "other"), where its values are added to the scores; 0 / min masks and bool ones do not."""
    low = torch.finfo(torch.float32).min
    bias = torch.tensor([low, -0.5, 0.0, -2.0])[None, None, None]
    assert bool(mask_formats.graded(bias))
    assert not bool(mask_formats.graded(torch.tensor([low, 0.0, 0.0])[None, None, None]))
    assert not bool(mask_formats.graded(torch.ones(1, 1, 1, 4, dtype=torch.bool)))
    assert mask_formats.step_padding(bias)[:2] == (4, "other")


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("unfilled", [0, 3], ids=["full", "static"])
@pytest.mark.parametrize("name", TYPES)
def test_a_decode_step_adds_an_additive_masks_bias(name, unfilled, implementation):
    """A step mask [B, 1, 1, kv] with a graded bias (and a static cache's unfilled end at the dtype's minimum) gives
    what the reference engine gives on the mask as it is (the path a torch.compile trace takes, which never reads
    masks back), not the output of the keys seen without the bias."""
    from unittest import mock

    from hf_rope_ext.attention import function

    module = model_of(name).model.layers[0].self_attn
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(2, 4, 1, 16, generator=g), torch.randn(2, 2, 12, 16, generator=g), torch.randn(2, 2, 12, 16)
    filled = 12 - unfilled
    bias = -0.3 * torch.arange(12, 0, -1).float()
    mask = bias.masked_fill(torch.arange(12) >= filled, torch.finfo(torch.float32).min)[None, None, None]
    pos = torch.full((2, 1), filled - 1)
    got = function.attend(implementation, module, q, k, v, mask, position_ids=pos)[0]
    with mock.patch.object(torch.compiler, "is_compiling", lambda: True):
        expected = function.attend("eager", module, q, k, v, mask, position_ids=pos)[0]
    unbiased = function.attend(implementation, module, q, k, v, (mask > -1e30).float().log(), position_ids=pos)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)
    assert not torch.allclose(got, unbiased, atol=1e-3)
