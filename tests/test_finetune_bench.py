"""benchmarks/bench_finetune_gpu.py off the GPU: it skips cleanly and says what it would measure; its FLOP count, its
reach search and its loss path hold against independent references (a built model, a slow sum, a plain search)."""

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_finetune_gpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_finetune_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip path is for machines without CUDA")
def test_skips_without_cuda_and_prints_the_plan(bench, capsys):
    assert bench.main(["--shapes", "7b", "--lengths", "8192", "32768", "--reach"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bench_finetune_gpu: skipped, no CUDA device")
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["7b plain", "7b liger"]
    assert "lengths [8192, 32768], reach from 16384 up to 524288" in lines[1]


@pytest.mark.parametrize("shape", ["1b", "7b"])
def test_matmul_params_count_the_linear_weights_of_the_shape(bench, shape):
    """The formula against a built model of the shape's structure, scaled down (GQA and tying kept)."""
    small = {**bench.SHAPES[shape], "hidden_size": 64, "intermediate_size": 96, "vocab_size": 300}
    small |= {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2 if shape == "1b" else 8}
    config = LlamaConfig(**small)
    model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert bench.matmul_params(config) == linear


def test_attention_flops_match_a_slow_causal_count(bench):
    """Per token: 3 x (QK^T and AV over each query's causal prefix), 2 FLOPs a multiply-add, per layer."""
    config = LlamaConfig(**{**bench.SHAPES["1b"], "num_hidden_layers": 2})
    length, d = 512, config.num_attention_heads * config.hidden_size // config.num_attention_heads
    slow = 3 * sum(2 * (2 * d * (i + 1)) for i in range(length)) * config.num_hidden_layers / length
    attention = bench.lora_flops_per_token(config, length) - 4 * bench.matmul_params(config)
    assert attention == pytest.approx(slow, rel=2 / length)  # the formula takes s/2 keys per query, the sum (s+1)/2


@pytest.mark.parametrize("limit", [5000, 16384, 100_000, 150_000, 524_288, 10**7])
def test_reach_finds_the_longest_length_that_fits(bench, limit):
    asked = []

    def fits_at(n):
        asked.append(n)
        return n <= limit

    found = bench.reach(fits_at, 16384, 524288, 8192)
    expected = max((n for n in range(8192, 524288 + 1, 8192) if n <= limit), default=None)
    assert found == expected
    assert len(asked) <= 12  # doubling then bisection, not a scan


def test_reach_when_nothing_fits(bench):
    assert bench.reach(lambda n: False, 16384, 524288, 8192) is None


def test_loss_path_equals_the_models_own_loss(bench):
    """The benchmark's plain loss (decoder hidden states + chunked head) == the full model's next-token loss."""
    from hf_rope_ext.train.lora import apply_lora
    from hf_rope_ext.train.loss import causal_lm_loss

    config = LlamaConfig(**{**bench.SHAPES["1b"], "hidden_size": 32, "intermediate_size": 48, "vocab_size": 100})
    config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads = 1, 4, 2
    model = apply_lora(LlamaForCausalLM(config), rank=2)
    ids = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(0))
    full = causal_lm_loss(model(input_ids=ids).logits, ids)
    assert torch.allclose(bench.loss_function("plain")(model, ids), full, atol=1e-5)
