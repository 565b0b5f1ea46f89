"""The DeepSpeed config entries a LoRA run fills before ``prepare`` (``train.deepspeed_config``): an ``auto``
micro-batch becomes ``--batch-size``; an ``auto`` or absent ZeRO reduce bucket holds the trainable elements (at most
DeepSpeed's default), a value the user gave is kept; without DeepSpeed nothing is touched. The launched ZeRO-3 runs
(tests/test_deepspeed.py) train the one-process adapter with the filled bucket."""

from types import SimpleNamespace

import pytest
import torch

from hf_rope_ext.train.deepspeed_config import DEEPSPEED_BUCKET, fill_deepspeed_config


def accelerator_with(config: dict):
    plugin = SimpleNamespace(deepspeed_config=config, is_auto=lambda key: config.get(key) == "auto")
    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin))


def lora_like() -> torch.nn.Module:
    """A frozen 64 x 64 weight and a trained 4 x 64 + 64 x 4 pair: 512 trained elements."""
    model = torch.nn.ModuleDict(dict(base=torch.nn.Linear(64, 64), a=torch.nn.Linear(64, 4, bias=False)))
    model["b"] = torch.nn.Linear(4, 64, bias=False)
    model["base"].requires_grad_(False)
    return model


@pytest.mark.parametrize("zero", [{}, {"reduce_bucket_size": "auto"}, {"stage": 3}])
def test_an_unset_bucket_holds_the_trained_elements(zero):
    config = {"train_micro_batch_size_per_gpu": "auto", **({"zero_optimization": zero} if zero else {})}
    fill_deepspeed_config(accelerator_with(config), lora_like(), batch_size=3)
    assert config["train_micro_batch_size_per_gpu"] == 3
    assert config["zero_optimization"]["reduce_bucket_size"] == 512
    assert config["zero_optimization"].get("stage", 3) == 3  # the rest of the section as given


def test_a_given_bucket_and_micro_batch_are_kept_and_a_large_model_is_capped():
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"reduce_bucket_size": 1000}}
    fill_deepspeed_config(accelerator_with(config), lora_like(), batch_size=3)
    assert config == {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"reduce_bucket_size": 1000}}
    config = {}
    huge = SimpleNamespace(parameters=lambda: [SimpleNamespace(requires_grad=True, ds_numel=10**9)])
    fill_deepspeed_config(accelerator_with(config), huge, batch_size=1)
    assert config["zero_optimization"]["reduce_bucket_size"] == DEEPSPEED_BUCKET


def test_without_deepspeed_nothing_is_read_or_filled():
    unread = SimpleNamespace(parameters=lambda: pytest.fail("the model's parameters were walked without DeepSpeed"))
    fill_deepspeed_config(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None)), unread, batch_size=3)
