"""Next-token losses without the whole sequence's logits (``eval.losses``) against the plain forward pass."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

from hf_rope_ext.eval import losses


def plain(model, ids: torch.Tensor, last: int) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[:, -last - 1 : -1]
    return F.cross_entropy(logits.float().transpose(1, 2), ids[:, -last:], reduction="none")


@pytest.mark.parametrize("rope", [None, {"rope_type": "rerope", "window": 4}], ids=["default", "rerope"])
def test_lean_losses_equal_the_forward_pass_in_head_sized_pieces(rope, monkeypatch):
    model = tiny_model("llama", rope, attn_implementation="sdpa")
    ids = torch.randint(3, 90, (2, 40), generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(losses, "HEAD_ROWS", 7)  # 5 pieces, the last one short
    assert losses.lean_logits_match(model)
    torch.testing.assert_close(losses.next_token_losses(model, ids, last=33), plain(model, ids, 33))
    torch.testing.assert_close(losses.next_token_losses(model, ids), plain(model, ids, 39))


def test_a_model_whose_logits_are_not_head_of_decoder_takes_its_own_forward():
    """Gemma 2 soft-caps its logits after the head: the lean path would be wrong, so it is not taken."""
    config = AutoConfig.for_model(
        "gemma2",
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        final_logit_softcapping=2.0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(3, 90, (1, 24), generator=torch.Generator().manual_seed(1))
    assert not losses.lean_logits_match(model)
    torch.testing.assert_close(losses.next_token_losses(model, ids, last=10), plain(model, ids, 10))
