"""hf_rope_ext.train.memory_model: its predictions against every committed measurement of a LoRA step's memory
(within 15%), its directions (tokens, N, FSDP2's P), its parameter counts against built models, a step measured here
(fp32, and bf16 under autocast) against the prediction, and docs/finetune.md's tables against the script's."""

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_rope_ext.train.lora import apply_lora
from hf_rope_ext.train.memory_model import (
    Shape,
    Step,
    layer_parameters,
    lora_parameters,
    predict,
    root_parameters,
    total,
    weight_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
LLAMA_8B = Shape(4096, 14336, 32, 32, 8, 128, 128256, tied=False)
TINY = dict(hidden_size=128, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=2048)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_step_measured_here_is_the_prediction(dtype):
    """One checkpointed LoRA step with finetune's loss on a tiny shape (bf16: weights and autocast, fp32 adapters),
    its live-tensor peak against the prediction: the fp32 path the CPU records take and the mixed-precision copies
    (norms' fp32 inputs, the adapters' casts) a GPU step makes."""
    from hf_rope_ext.train.loop import forward_loss
    from hf_rope_ext.train.sequence_parallel import ONE
    from hf_rope_ext.util.memory_peak import LivePeak
    from hf_rope_ext.util.quiet import enable_activation_checkpointing

    tokens, half = 1024, dtype == torch.bfloat16
    config = LlamaConfig(**TINY, num_hidden_layers=2, max_position_embeddings=tokens)
    torch.manual_seed(0)
    model = apply_lora(LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype), rank=8)
    enable_activation_checkpointing(model, use_reentrant=False)
    model.train()
    ids, positions = torch.randint(0, 2048, (1, tokens)), torch.arange(tokens)[None]
    engine = SimpleNamespace(parallelism_config=None, unwrap_model=lambda m: m)
    with LivePeak() as live:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
            loss = forward_loss(engine, model, ids, positions, None, ONE)
        loss.backward()
    size = 2 if half else 4
    step = Step(tokens, weight_bytes=size, act_bytes=size, device="cpu")
    predicted = total(predict(Shape(128, 512, 2, 4, 2, 32, 2048), step), ("adapter_grads", "activations"))
    assert predicted == pytest.approx(live.peak, rel=0.05)


def test_what_the_code_refuses_is_refused():
    with pytest.raises(ValueError, match="sequence_parallel=3 must divide the 32 query and 8 key-value heads"):
        predict(LLAMA_8B, Step(12288, 3))
    with pytest.raises(ValueError, match="lm_head"):
        predict(LLAMA_8B, Step(8192, targets=("q_proj", "lm_head")))
    with pytest.raises(ValueError, match="loss='fused'"):
        predict(LLAMA_8B, Step(8192, loss="fused"))


def test_the_page_shows_the_scripts_tables(bench):
    """docs/finetune.md's block is what ``benchmarks/memory_model.py --write`` puts there."""
    page = (ROOT / "docs" / "finetune.md").read_text(encoding="utf-8")
    block = re.search(rf"<!-- {bench.BLOCK}:start -->\n(.*?)\n<!-- {bench.BLOCK}:end -->", page, re.S)
    assert block, "no memory-model block in docs/finetune.md"
    assert block.group(1) == bench.report()
