"""hf_rope_ext.train.memory.model: its predictions against every committed measurement of a LoRA step's memory
(within 15%), its directions (tokens, N, FSDP2's P), its parameter counts against built models, steps measured here
(fp32, and bf16 under autocast; every combination of the techniques, LoRA on q/k/v/o and on every linear layer)
against the prediction, each technique's terms (offloaded checkpoints, the tiled MLP, no copies), the head loss's
logits, and docs/finetune.md's tables against the script's."""

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_rope_ext.train.head_loss import chunk_tokens
from hf_rope_ext.train.lora import apply_lora
from hf_rope_ext.train.memory.model import (
    Shape,
    Step,
    _default_tile,
    head_logits_bytes,
    layer_parameters,
    lora_parameters,
    predict,
    root_parameters,
    total,
    weight_bytes,
)
from hf_rope_ext.train.memory.tiled_mlp import default_tile

ROOT = Path(__file__).resolve().parents[1]
LLAMA_8B = Shape(4096, 14336, 32, 32, 8, 128, 128256, tied=False)
TINY = dict(hidden_size=128, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=2048)
TINY_SHAPE = Shape(128, 512, 4, 4, 2, 32, 2048)
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
EVERY_LINEAR = (*QKVO, "gate_proj", "up_proj", "down_proj")
# the techniques' combinations: (offload, tiled, lean)
COMBINATIONS = {
    "none": (False, False, False),
    "offload": (True, False, False),
    "tiled": (False, True, False),
    "lean": (False, False, True),
    "all": (True, True, True),
}


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("memory_model_bench", ROOT / "benchmarks" / "memory_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_measured_step_is_predicted_within_15_percent(bench):
    """Every CPU record and every H200 record; only the attention-level engine's records from before its fix (it
    kept copies per piece that plain attention does not) are set apart, and they are all from one commit."""
    points = bench.measured_points()
    assert len(points) >= 31 and sum(p["device"].startswith("NVIDIA") for p in points) >= 3
    off = {p["name"]: round(bench.error(p), 3) for p in points if abs(bench.error(p)) > 0.15 and not p["note"]}
    assert off == {}
    assert all(p["name"].startswith("before-") and p["name"] != "before-yarn-16384" for p in points if p["note"])


def test_more_tokens_more_memory_and_a_larger_split_less():
    for tokens in (8192, 65536, 524288):
        more = predict(LLAMA_8B, Step(2 * tokens))["activations"]
        assert more > predict(LLAMA_8B, Step(tokens))["activations"]
    split = [predict(LLAMA_8B, Step(262144, n))["activations"] for n in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(split, split[1:], strict=False))
    assert split[0] / split[3] == pytest.approx(8, rel=0.01)  # the all-to-all's own tensor is small beside the rest


def test_fsdp2_shards_weights_and_adapter_over_p():
    whole = weight_bytes(LLAMA_8B, Step(8192))
    gathered = (root_parameters(LLAMA_8B) + 2 * layer_parameters(LLAMA_8B)) * 2
    for p in (2, 4, 16):
        terms, alone = predict(LLAMA_8B, Step(8192, fsdp=p)), predict(LLAMA_8B, Step(8192))
        assert terms["weights"] - gathered == pytest.approx(whole / p)
        assert terms["optimizer"] == pytest.approx(alone["optimizer"] / p)
        assert terms["activations"] == alone["activations"]  # sharding weights leaves a row's activations alone


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("targets", [("q_proj", "k_proj", "v_proj", "o_proj"), ("q_proj", "v_proj", "down_proj")])
def test_parameter_counts_are_those_of_a_built_peft_model(tied, targets):
    config = LlamaConfig(**TINY, num_hidden_layers=2, tie_word_embeddings=tied)
    model = apply_lora(LlamaForCausalLM(config), rank=4, target_modules=targets)
    shape = Shape(128, 512, 2, 4, 2, 32, 2048, tied)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert lora_parameters(shape, 4, targets) == trainable
    assert 2 * layer_parameters(shape) + root_parameters(shape) == frozen


def measured_step(dtype, techniques: str, targets=QKVO, tokens=1024):
    """One checkpointed LoRA step with finetune's loss on the tiny shape (4 layers; bf16: weights and autocast, fp32
    adapters) with the techniques as ``train.prepare`` switches them on (the tiled MLP at ALST's default tile):
    (``LivePeak``, the prediction's terms)."""
    from hf_rope_ext.train.loop import forward_loss
    from hf_rope_ext.train.memory.techniques import enable_techniques, tile_model
    from hf_rope_ext.train.sequence_parallel import ONE
    from hf_rope_ext.util.memory_peak import LivePeak
    from hf_rope_ext.util.quiet import enable_activation_checkpointing

    offload, tiled, lean = COMBINATIONS[techniques]
    half = dtype == torch.bfloat16
    config = LlamaConfig(**TINY, num_hidden_layers=TINY_SHAPE.layers, max_position_embeddings=tokens)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)
    tile_model(model, 0 if tiled else None)
    model = apply_lora(model, rank=8, target_modules=list(targets))
    enable_activation_checkpointing(model, use_reentrant=False)
    enable_techniques(model, offload, lean)
    model.train()
    ids, positions = torch.randint(0, TINY["vocab_size"], (1, tokens)), torch.arange(tokens)[None]
    engine = SimpleNamespace(parallelism_config=None, unwrap_model=lambda m: m)
    with LivePeak() as live:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
            loss = forward_loss(engine, model, ids, positions, None, ONE)
        loss.backward()
    size, tile = (2 if half else 4), _default_tile(TINY_SHAPE.hidden, tokens) if tiled else 0
    step = Step(tokens, 1, 1, size, size, 8, targets, device="cpu", offload=offload, tile=tile, lean=lean)
    return live, predict(TINY_SHAPE, step)


@pytest.mark.parametrize("techniques", list(COMBINATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_step_measured_here_is_the_prediction(dtype, techniques):
    """The live-tensor peak of a step against the prediction (the live peak counts neither the frozen weights nor the
    adapter weights), within 5%, for every combination of the techniques: the fp32 path the CPU records take and the
    mixed-precision copies (norms' fp32 inputs, the adapters' casts) a GPU step makes, or not (lean); with the MLP
    tiled the peak moves to the post-attention norm's backward in bf16. Offloaded, the host holds every layer's
    input: exactly the bytes the step's host copies take."""
    live, terms = measured_step(dtype, techniques)
    assert total(terms, ("adapter_grads", "activations")) == pytest.approx(live.peak, rel=0.05)
    assert terms["host"] == live.host_peak
    assert (terms["host"] > 0) == COMBINATIONS[techniques][0]


@pytest.mark.parametrize("techniques", ["none", "all"])
def test_a_step_with_lora_on_every_linear_layer_is_the_prediction(techniques):
    """bf16, LoRA on all seven linear layers: without the techniques the recompute that ends at down_proj's adapter
    (its fp32 copy of the product and that copy's cast beside the MLP's four intermediates) is the peak; with all
    three, the lean post-attention norm's backward."""
    live, terms = measured_step(torch.bfloat16, techniques, EVERY_LINEAR)
    assert total(terms, ("adapter_grads", "activations")) == pytest.approx(live.peak, rel=0.05)
    assert terms["peak_at"] == ("mlp" if techniques == "none" else "norm")
    assert terms["host"] == live.host_peak


def test_what_the_code_refuses_is_refused():
    with pytest.raises(ValueError, match="sequence_parallel=3 must divide the 32 query and 8 key-value heads"):
        predict(LLAMA_8B, Step(12288, 3))
    with pytest.raises(ValueError, match="lm_head"):
        predict(LLAMA_8B, Step(8192, targets=("q_proj", "lm_head")))
    with pytest.raises(ValueError, match="loss='fused'"):
        predict(LLAMA_8B, Step(8192, loss="fused"))
    with pytest.raises(ValueError, match="tile=-1 >= 0"):
        predict(LLAMA_8B, Step(8192, tile=-1))


@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("lean", [False, True])
def test_offloading_moves_every_checkpoint_to_the_host_and_keeps_two_or_three(n, lean):
    """Every layer's checkpointed input goes to the host. At a layer's backward the device holds the first layer's
    (a leaf the backward holds), the one fetched ahead and, with lean norms, the recomputed layer's own (its input
    norm keeps it; an fp32 copy frees it): two or three; at the loss the first layer's only."""
    tokens, (d, a, layers) = 262144, (LLAMA_8B.hidden, 2, LLAMA_8B.layers)
    plain, offloaded = (
        predict(LLAMA_8B, Step(tokens, n, lean=lean)),
        predict(LLAMA_8B, Step(tokens, n, offload=True, lean=lean)),
    )
    assert plain["host"] == 0 and offloaded["host"] == layers * d * a * tokens // n
    on_device = 3 if lean else 2
    for moment in ("mlp", "norm", "attention"):
        assert plain["moments"][moment] - offloaded["moments"][moment] == (layers - on_device) * d * a * tokens // n
    assert plain["moments"]["loss"] - offloaded["moments"]["loss"] == (layers - 1) * d * a * tokens // n
    assert plain["peak_at"] == offloaded["peak_at"] == "mlp" and total(offloaded) < total(plain)


@pytest.mark.parametrize("tile", [1024, 4096])
def test_a_tiled_mlp_keeps_one_tiles_intermediates_and_the_norm_becomes_the_peak(tile):
    """Six intermediate-wide tensors for a tile's tokens instead of the row's, beside the MLP's input (the tiles'
    checkpoints keep it) and the input gradients of the tiles done (all but two tiles' tokens, at the tile before the
    last); the post-attention norm's backward, five fp32 hidden-wide temporaries, is then the peak."""
    tokens, (d, i, a) = 131072, (LLAMA_8B.hidden, LLAMA_8B.intermediate, 2)
    plain, tiled = predict(LLAMA_8B, Step(tokens)), predict(LLAMA_8B, Step(tokens, tile=tile))
    mlp = plain["moments"]["mlp"] - tiled["moments"]["mlp"]
    assert mlp == (tokens - tile) * (6 * i - 2 * d) * a
    assert plain["moments"]["norm"] == tiled["moments"]["norm"]
    assert (plain["peak_at"], tiled["peak_at"]) == ("mlp", "norm")
    assert total(tiled) < total(plain) and tiled["host"] == 0
    assert predict(LLAMA_8B, Step(tokens, tile=tokens)) == plain  # one tile: the MLP runs whole


def test_lean_norms_keep_less_and_make_more_in_their_backward():
    """bf16, tiled, q/k/v/o, N = 1, at the post-attention norm's backward: lean keeps 12 bytes a hidden unit less
    (the q, k, v adapters share one half input, o_proj's copy is gone: 6; no fp32 copy of the input norm's input: 4;
    the post-attention norm keeps its half input instead of an fp32 copy: 2) and its backward makes 8 more (six fp32
    temporaries and two half ones against five fp32)."""
    d, tokens = LLAMA_8B.hidden, 131072
    stock, lean = predict(LLAMA_8B, Step(tokens, tile=4096)), predict(LLAMA_8B, Step(tokens, tile=4096, lean=True))
    assert stock["peak_at"] == lean["peak_at"] == "norm"
    assert stock["moments"]["norm"] - lean["moments"]["norm"] == tokens * (12 - 8) * d


def test_the_head_loss_holds_a_chunks_gradient_beside_the_next_chunks_logits():
    """FusedHeadLoss: one chunk, its fp32 logits and log-softmax; more, the first chunk's gradient (its log-softmax
    made the softmax in place, still bound in the loop) beside the second's fp32 logits and log-softmax."""
    v, small = LLAMA_8B.vocab, Shape(128, 512, 4, 4, 2, 32, 256)
    assert chunk_tokens(1, LLAMA_8B.hidden, v) == 1 and head_logits_bytes(LLAMA_8B, 1) == 2 * v * 4
    assert chunk_tokens(131072, LLAMA_8B.hidden, v) == 4096
    assert head_logits_bytes(LLAMA_8B, 131072) == 3 * 4096 * v * 4
    assert chunk_tokens(300, 128, 256) == 256  # a second chunk of 44 tokens
    assert head_logits_bytes(small, 300) == (256 + 2 * 44) * 256 * 4


def test_the_default_tile_is_alsts_rule():
    """ceil(tokens / hidden) tiles of ceil(tokens / tiles) tokens: at most the hidden size, at least 1."""
    assert _default_tile(4096, 1048576) == 4096 and _default_tile(4096, 1000) == 1000
    assert _default_tile(4096, 4097) == 2049 and _default_tile(4096, 0) == 1
    assert all(_default_tile(576, t) <= 576 for t in range(1, 5000, 37))


def test_the_models_default_tile_is_the_tiled_mlps():
    """The model keeps its own copy of ``tiled_mlp.default_tile`` (no torch import for a plan): the same tile for
    every hidden size and length."""
    for hidden in (1, 3, 64, 128, 576, 2048, 3584, 4096, 8192):
        for tokens in (*range(0, 3000, 7), 4095, 4096, 4097, 131071, 131072, 1048576, 1048577, 16777216):
            assert _default_tile(hidden, tokens) == default_tile(hidden, tokens), (hidden, tokens)


@pytest.mark.parametrize("targets", [("q_proj", "k_proj", "v_proj", "o_proj"), ("q_proj", "v_proj", "gate_proj")])
def test_no_copies_changes_nothing_in_fp32_and_lowers_half_precision(targets):
    for loss in ("head", "chunked"):
        fp32 = dict(weight_bytes=4, act_bytes=4, targets=targets, loss=loss)
        assert predict(LLAMA_8B, Step(65536, **fp32, lean=True)) == predict(LLAMA_8B, Step(65536, **fp32))
        half, lean = (
            predict(LLAMA_8B, Step(65536, targets=targets)),
            predict(LLAMA_8B, Step(65536, targets=targets, lean=True)),
        )
        assert lean["activations"] < half["activations"] and lean["weights"] == half["weights"]


def test_no_copies_keeps_one_adapter_input_per_tensor_and_the_norms_half_inputs():
    """bf16, q/k/v/o, N = 1: the q, k, v adapters share the normed input (two copies fewer), o_proj reads attention's
    output (its copy gone); the two norms' fp32 inputs (8 bytes a hidden unit) become the post-attention norm's half
    input (2 bytes); at the loss, the final norm's fp32 input becomes its half input."""
    d, tokens = LLAMA_8B.hidden, 131072
    half, lean = predict(LLAMA_8B, Step(tokens)), predict(LLAMA_8B, Step(tokens, lean=True))
    assert half["activations"] - lean["activations"] == tokens * (3 * d * 2 + (8 - 2) * d)
    loss = predict(LLAMA_8B, Step(8192)), predict(LLAMA_8B, Step(8192, lean=True))
    assert [t["peak_at"] for t in loss] == ["loss", "loss"]
    assert loss[0]["activations"] - loss[1]["activations"] == 8192 * d * (4 - 2)


def test_the_techniques_together_hold_least_and_stay_the_same_without_them():
    """Each technique alone lowers the device total at a long row; all three lower it most."""
    step = dict(tokens=1048576, sequence_parallel=8, fsdp=8)
    plain = total(predict(LLAMA_8B, Step(**step)))
    alone = [total(predict(LLAMA_8B, Step(**step, **t))) for t in ({"offload": True}, {"tile": 4096}, {"lean": True})]
    both = total(predict(LLAMA_8B, Step(**step, offload=True, tile=4096, lean=True)))
    assert all(x < plain for x in alone) and both < min(alone)
    assert predict(LLAMA_8B, Step(**step, offload=False, tile=0, lean=False)) == predict(LLAMA_8B, Step(**step))


def test_the_page_shows_the_scripts_tables(bench):
    """docs/finetune.md's block is what ``benchmarks/memory_model.py --write`` puts there."""
    page = (ROOT / "docs" / "finetune.md").read_text(encoding="utf-8")
    block = re.search(rf"<!-- {bench.BLOCK}:start -->\n(.*?)\n<!-- {bench.BLOCK}:end -->", page, re.S)
    assert block, "no memory-model block in docs/finetune.md"
    assert block.group(1) == bench.report()
