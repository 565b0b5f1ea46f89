"""Chunked next-token loss == the full-logits loss, in value and in gradients (CPU, fp32)."""

import pytest
import torch

from hf_rope_ext.train.loss import causal_lm_loss, chunked_causal_lm_loss


@pytest.mark.parametrize("chunk", [1, 5, 7, 64, 10_000])
def test_chunked_loss_and_gradients_match_full_logits(chunk):
    generator = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(2, 9, 16, generator=generator, requires_grad=True)
    weight = torch.randn(40, 16, generator=generator, requires_grad=True)
    ids = torch.randint(0, 40, (2, 9), generator=generator)
    full = causal_lm_loss(hidden @ weight.T, ids)
    full_grads = torch.autograd.grad(full, (hidden, weight))
    chunked = chunked_causal_lm_loss(hidden, weight, ids, chunk=chunk)
    chunked_grads = torch.autograd.grad(chunked, (hidden, weight))
    assert torch.allclose(chunked, full, atol=1e-6)
    for a, b in zip(chunked_grads, full_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_bad_chunk_is_refused():
    with pytest.raises(ValueError, match="chunk=0 must be"):
        chunked_causal_lm_loss(torch.zeros(1, 3, 4), torch.zeros(5, 4), torch.zeros(1, 3, dtype=torch.long), chunk=0)
