"""``train.memory.tiled_mlp``: the decoder layers' MLPs over sequence tiles give the untiled step's loss and
gradients (LoRA on attention or on the MLP, with and without activation checkpointing, a sequence the tile does not
divide, two rows), recompute each tile in the backward (counted, and against a slow per-tile loop with LoRA dropout),
accumulate each parameter's gradient once, evaluate without grad, come off exactly, and hold less at the peak
(``LivePeak``); the flag's values and ALST's default tile."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from conftest import random_lora_b, tiny_model
from torch import nn

from hf_rope_ext.train.lora import apply_lora
from hf_rope_ext.train.memory.tiled_mlp import check_tile, decoder_mlps, default_tile, enable_tiled_mlp
from hf_rope_ext.util.memory_peak import LivePeak
from hf_rope_ext.util.quiet import enable_activation_checkpointing

SHAPE = dict(hidden_size=64, intermediate_size=256, vocab_size=512, attn_implementation="sdpa")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
SEQ, TILE = 130, 48  # tiles of 48, 48, 34; ALST's default at hidden 64: 3 tiles of 44, 44, 42


def lora_model(family="llama", targets=MLP, checkpointing=False, dropout=0.0, **shape):
    """A seeded tiny ``family`` model in training mode with LoRA on ``targets`` (B random: every adapter gets a
    gradient and moves the output)."""
    model = apply_lora(tiny_model(family, **{**SHAPE, **shape}), rank=8, target_modules=targets, dropout=dropout)
    random_lora_b(model)
    if checkpointing:
        enable_activation_checkpointing(model, use_reentrant=False)
    return model.train()


def batch(rows=2, seq=SEQ, vocab=512) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, seq), generator=torch.Generator().manual_seed(1))


def step(model, ids, seed=0):
    """(loss, {name: gradient} of every trainable parameter) of one step, before any optimizer step."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_same_step(reference, other, tol=2e-6):
    """Loss and each gradient within fp32 rounding: per tensor max|a-b| <= tol * max|a|. 2e-6, not 1e-6: the
    untiled fp32 step's own gradients differ from a float64 step's by up to 1.04e-6 per tensor here (sums over 260
    tokens in another order), and tiled against untiled by up to 1.08e-6 (qwen2, LoRA on the MLP)."""
    (loss_a, grads_a), (loss_b, grads_b) = reference, other
    assert abs(loss_a - loss_b) <= tol * abs(loss_a)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, a in grads_a.items():
        assert a.abs().max() > 0, name
        assert (a - grads_b[name]).abs().max() <= tol * a.abs().max(), name


def count_calls(model) -> list[tuple[int, int]]:
    """Record (layer, tile length) at each run of each MLP's stock forward (an instance forward that the tiling
    then wraps and its disable function puts back)."""
    calls = []
    for layer, mlp in enumerate(decoder_mlps(model)):
        stock = mlp.forward

        def counted(x, stock=stock, layer=layer):
            calls.append((layer, x.shape[1]))
            return stock(x)

        mlp.forward = counted
    return calls


CASES = [(f, t, c, None) for f in ("llama", "mistral", "qwen2") for t in (ATTENTION, MLP) for c in (False, True)]


@pytest.mark.parametrize("family, targets, checkpointing, tile", CASES + [("llama", MLP, c, TILE) for c in (0, 1)])
def test_tiled_step_is_the_untiled_step(family, targets, checkpointing, tile):
    model = lora_model(family, targets, checkpointing)
    ids = batch()
    plain = step(model, ids)
    disable = enable_tiled_mlp(model, tile)
    assert_same_step(plain, step(model, ids))
    disable()
    assert_same_step(plain, step(model, ids))


def test_backward_recomputes_each_tile_latest_first():
    model = lora_model()
    calls = count_calls(model)
    enable_tiled_mlp(model, TILE)
    loss = model(input_ids=batch(), labels=batch()).loss
    assert calls == [(layer, n) for layer in (0, 1) for n in (48, 48, 34)]  # the forward: each tile once
    calls.clear()
    loss.backward()
    assert calls == [(layer, n) for layer in (1, 0) for n in (34, 48, 48)]  # the backward: each tile again


def test_recompute_inside_layer_checkpointing_covers_every_tile():
    model = lora_model(checkpointing=True)
    calls = count_calls(model)
    enable_tiled_mlp(model, TILE)
    loss = model(input_ids=batch(), labels=batch()).loss
    forward = Counter(calls)
    calls.clear()
    loss.backward()
    assert forward == Counter({(0, 48): 2, (0, 34): 1, (1, 48): 2, (1, 34): 1})
    assert all(Counter(calls)[key] >= n for key, n in forward.items())  # the layer's recompute, then the tiles'


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradients_match_a_slow_per_tile_loop_with_lora_dropout(checkpointing):
    """The reference runs each tile by hand without checkpoints: same dropout masks drawn in the same order, so the
    checkpoint's recompute must reproduce them (its saved RNG state) for the gradients to agree."""
    model = lora_model(checkpointing=checkpointing, dropout=0.2)
    ids = batch()
    mlps = decoder_mlps(model)
    for mlp in mlps:
        stock = mlp.forward
        mlp.forward = lambda x, stock=stock: torch.cat([stock(x[:, s : s + TILE]) for s in range(0, SEQ, TILE)], 1)
    reference = step(model, ids, seed=3)
    for mlp in mlps:
        del mlp.forward
    assert step(model, ids, seed=3)[0] != reference[0]  # the dropout masks depend on the tiles
    enable_tiled_mlp(model, TILE)
    assert_same_step(reference, step(model, ids, seed=3))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_each_parameter_accumulates_its_gradient_once(checkpointing):
    """What DDP's reducer and FSDP2's post-backward expect: one accumulation per parameter per backward."""
    model = lora_model(checkpointing=checkpointing)
    enable_tiled_mlp(model, TILE)
    counts = Counter()
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda p, name=name: counts.update([name]))
    step(model, batch())
    assert set(counts.values()) == {1} and len(counts) == 2 * 3 * 2  # 2 layers, 3 projections, A and B


def test_evaluation_tiles_without_grad():
    model = lora_model().eval()
    ids = batch()
    calls = count_calls(model)
    with torch.no_grad():
        stock = model(input_ids=ids).logits
        enable_tiled_mlp(model, TILE)
        calls.clear()
        tiled = model(input_ids=ids).logits
    assert calls == [(layer, n) for layer in (0, 1) for n in (48, 48, 34)]  # plain calls, no checkpoint
    assert (tiled - stock).abs().max() <= 1e-6 * stock.abs().max()


def test_disable_restores_the_stock_model():
    model = lora_model().eval()
    ids = batch()
    keys, names = list(model.state_dict()), [n for n, _ in model.named_modules()]
    with torch.no_grad():
        stock = model(input_ids=ids).logits
        disable = enable_tiled_mlp(model, TILE)
        assert list(model.state_dict()) == keys and [n for n, _ in model.named_modules()] == names
        assert all("forward" in mlp.__dict__ for mlp in decoder_mlps(model))
        model(input_ids=ids)
        disable()
        assert torch.equal(model(input_ids=ids).logits, stock)
    assert all("forward" not in mlp.__dict__ for mlp in decoder_mlps(model))
    disable()  # a second call: nothing left to remove


def test_disable_puts_back_an_earlier_instance_forward():
    model = lora_model()
    calls = count_calls(model)
    earlier = [mlp.forward for mlp in decoder_mlps(model)]
    enable_tiled_mlp(model, TILE)()
    assert [mlp.__dict__["forward"] for mlp in decoder_mlps(model)] == earlier
    model(input_ids=batch())
    assert calls == [(0, SEQ), (1, SEQ)]


@pytest.mark.parametrize("seq, tile", [(64, None), (40, 40), (40, 1000)])
def test_one_tile_is_the_stock_forward_once(seq, tile):
    model = lora_model()
    ids = batch(seq=seq)
    stock = step(model, ids)
    calls = count_calls(model)
    enable_tiled_mlp(model, tile)
    loss, grads = step(model, ids)
    assert calls == [(0, seq), (1, seq)]  # no recompute either
    assert torch.equal(loss, stock[0]) and all(torch.equal(g, stock[1][n]) for n, g in grads.items())


def test_enabling_twice_is_refused():
    model = lora_model()
    disable = enable_tiled_mlp(model)
    with pytest.raises(ValueError, match="tiled already"):
        enable_tiled_mlp(model, TILE)
    disable()
    enable_tiled_mlp(model, TILE)()
    assert all("forward" not in mlp.__dict__ for mlp in decoder_mlps(model))


def test_a_model_without_decoder_mlps_is_refused():
    with pytest.raises(ValueError, match=r"Sequential has no decoder-layer MLP.*'mlp'.*GradientCheckpointingLayer"):
        enable_tiled_mlp(nn.Sequential(nn.Linear(4, 4)))


def test_an_input_that_is_not_batch_seq_hidden_is_refused():
    model = lora_model()
    enable_tiled_mlp(model, TILE)
    with pytest.raises(ValueError, match=r"--tiled-mlp.*\(batch, seq, hidden\).*\(130, 64\)"):
        decoder_mlps(model)[0](torch.randn(SEQ, 64))


@pytest.mark.parametrize("value", [0, -1, "x", "", "-3", "+-5", 2.5, True, [8]])
def test_bad_tile_values_name_the_flag(value):
    with pytest.raises(ValueError, match=r"--tiled-mlp=.*integer >= 1") as error:
        check_tile(value)
    assert repr(value) in str(error.value)


def test_good_tile_values():
    assert check_tile(None) is None and check_tile(1) == 1 and check_tile("4096") == 4096


def test_default_tile_is_alsts_shards_in_tokens():
    """ALST: ``num_shards = ceil(seqlen / hidden)``, cut by ``torch.chunk``; our tiles are the same pieces."""
    assert default_tile(64, SEQ) == 44 and default_tile(4096, 32768) == 4096 and default_tile(4096, 4096) == 4096
    assert default_tile(64, 1) == 1 and default_tile(64, 0) == 1
    for hidden in (3, 7, 64):
        for tokens in range(1, 300, 7):
            positions = torch.arange(tokens)
            shards = torch.chunk(positions, math.ceil(tokens / hidden))
            tiles = torch.split(positions, default_tile(hidden, tokens))
            assert [len(s) for s in shards] == [len(t) for t in tiles], (hidden, tokens)
    with pytest.raises(ValueError, match="hidden_size=0"):
        default_tile(0, 8)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_tiles_lower_the_live_peak(checkpointing):
    """MLP-dominated shape (intermediate 8x hidden, 2048 tokens): the untiled step holds gate, up and their product
    (seq x intermediate each) of every layer (of one layer under checkpointing); tiled, one tile's."""
    seq, intermediate, layers = 2048, 256, 2
    model = lora_model(checkpointing=checkpointing, hidden_size=32, intermediate_size=intermediate, vocab_size=128)
    ids = batch(rows=1, seq=seq, vocab=128)
    peaks = []
    for tile in (None, 128):
        disable = enable_tiled_mlp(model, tile) if tile else lambda: None
        with LivePeak() as live:
            step(model, ids)
        disable()
        peaks.append(live.peak)
    saved = (1 if checkpointing else layers) * 3 * seq * intermediate * 4  # bytes: 3 fp32 tensors per layer
    assert peaks[0] - peaks[1] >= 0.75 * saved, peaks
