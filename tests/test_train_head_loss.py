"""The fine-tuning loss taken from the output head's input in chunks: the full-logit loss and its gradients (hidden
states, head weight and bias, LoRA weights through a model), -100 left out, bf16 under autocast within rounding, no
(tokens, vocab) tensor formed on the way; full logits for a family that changes its head's values."""

import pytest
import torch
import torch.nn.functional as F
from conftest import byte_llama_config
from torch.utils._python_dispatch import TorchDispatchMode

import hf_rope_ext  # noqa: F401
from hf_rope_ext.train.context_parallel import shifted_labels
from hf_rope_ext.train.head_loss import chunked_head, fused_head_loss, summed_loss
from hf_rope_ext.train.lora import apply_lora


def full_loss(hidden, weight, bias, labels):
    """The reference: every logit at once."""
    logits = F.linear(hidden, weight, bias).float()
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")


def tensors(bias: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 7, 8, generator=generator, requires_grad=True)
    weight = torch.randn(30, 8, generator=generator, requires_grad=True)
    labels = torch.randint(0, 30, (2, 7), generator=generator)
    labels[0, 2] = labels[1, 6] = -100
    return hidden, weight, torch.randn(30, generator=generator, requires_grad=True) if bias else None, labels


def gradients(loss, *inputs):
    return torch.autograd.grad(loss * 0.37, [t for t in inputs if t is not None])  # a scale from the caller


@pytest.mark.parametrize("chunk", [1, 3, 14, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_the_chunked_loss_and_its_gradients_are_the_full_logits(chunk, bias):
    hidden, weight, bias_, labels = tensors(bias)
    expected = full_loss(hidden, weight, bias_, labels)
    found = fused_head_loss(hidden, weight, bias_, labels, chunk)
    assert float(found) == pytest.approx(float(expected), rel=1e-6)
    for a, b in zip(gradients(found, hidden, weight, bias_), gradients(expected, hidden, weight, bias_), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_frozen_head_gets_no_gradient_and_unscored_tokens_none():
    hidden, weight, _, labels = tensors(False)
    weight.requires_grad_(False)
    labels[1] = -100
    (grad,) = gradients(fused_head_loss(hidden, weight, None, labels, 4), hidden)
    assert grad[1].abs().max() == 0 and grad[0].abs().max() > 0


def test_bf16_under_autocast_is_the_full_loss_within_rounding():
    hidden, weight, _, labels = tensors(False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = full_loss(hidden, weight, None, labels)
        found = fused_head_loss(hidden, weight, None, labels, 5)
    assert float(found) == pytest.approx(float(expected), rel=1e-3)  # the same bf16 logits, summed otherwise
    torch.testing.assert_close(gradients(found, hidden)[0], gradients(expected, hidden)[0], rtol=2e-2, atol=2e-2)


class Largest(TorchDispatchMode):
    """The most elements of any tensor an op returns while active."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        self.most = max([self.most, *sizes])
        return out


def lora_llama(**overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = byte_llama_config(max_position_embeddings=64, attn_implementation="sdpa", **overrides)
    model = AutoModelForCausalLM.from_config(config)
    return apply_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=("q_proj", "v_proj"))


def test_a_model_step_takes_the_full_logit_loss_and_gradients_without_forming_the_logits(monkeypatch):
    from hf_rope_ext.train import head_loss

    model = lora_llama()
    ids = torch.randint(2, 384, (2, 40), generator=torch.Generator().manual_seed(1))
    labels = shifted_labels(ids)
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    expected = F.cross_entropy(model(**inputs).logits.flatten(0, 1), labels.flatten(), reduction="sum")
    reference = torch.autograd.grad(expected, [p for p in model.parameters() if p.requires_grad])
    monkeypatch.setattr(head_loss, "CHUNK", 16)
    with Largest() as largest:
        found = summed_loss(model, model, labels, **inputs)
        grads = torch.autograd.grad(found, [p for p in model.parameters() if p.requires_grad])
    assert float(found) == pytest.approx(float(expected), rel=1e-6)
    for a, b in zip(grads, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert largest.most < 80 * 384  # never the (80 tokens, 384 vocab) logits; 16 tokens' at a time
    assert not model.base_model.model.lm_head._forward_hooks  # the hooks are gone again


def test_a_family_that_changes_its_heads_values_keeps_the_full_logits():
    """Gemma 2 caps its logits after the head: the loss is taken from the capped logits, as the model returns them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "gemma2", vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, final_logit_softcapping=3.0, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert not chunked_head(model.get_output_embeddings(), model.config)
    assert chunked_head(lora_llama().get_output_embeddings(), lora_llama().config)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    labels = shifted_labels(ids)
    with torch.no_grad():
        expected = F.cross_entropy(model(input_ids=ids).logits.flatten(0, 1), labels.flatten(), reduction="sum")
        assert float(summed_loss(model, model, labels, input_ids=ids)) == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize("tokens, dim, vocab", [(16384, 1024, 32000), (8192, 576, 49152), (80, 32, 384), (1, 8, 30)])
def test_a_chunks_logits_are_about_the_hidden_states_size(tokens, dim, vocab):
    """A power of two of tokens whose logits are at least the hidden states' size and below twice it (at most the
    cap): the loss's memory follows the tokens a process holds, as the activations do."""
    from hf_rope_ext.train.head_loss import CHUNK, chunk_tokens

    chunk = chunk_tokens(tokens, dim, vocab)
    assert chunk & (chunk - 1) == 0 and chunk <= CHUNK
    assert chunk == CHUNK or chunk * vocab >= tokens * dim > chunk * vocab / 2 or chunk == 1


def test_a_partitioned_head_is_chunked_while_frozen_and_whole_while_it_trains():
    """A ZeRO-3 head (parameters with a ``ds_id``): the chunked loss when frozen (the LoRA default), the full logits
    when it trains; tests/test_deepspeed.py runs the chunked one under the engine against one process."""
    model = lora_llama()
    head = model.get_output_embeddings()
    head.weight.ds_id = 7
    assert head.weight.requires_grad is False and chunked_head(head, model.config)
    head.weight.requires_grad_(True)
    assert not chunked_head(head, model.config)
