"""``train.memory.offload``: the checkpointed layer inputs kept in host memory between forward and backward. The
step is bitwise the step without it (fp32 and bf16 under autocast, twice in a row as under gradient accumulation);
the host holds every layer's input and the device at most three at once (the recomputed one, the one fetched
ahead, the first layer's, which the graph holds as a leaf), counted by ``LivePeak`` as a GPU process would count
them; the backward fetches the layer before the one it recomputes; the switch is refused without activation
checkpointing and undone by the function it returns."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_rope_ext._transformers.checkpointing import checkpointed_layers
from hf_rope_ext.train.lora import apply_lora
from hf_rope_ext.train.memory.offload import HostPool, offload_checkpoints
from hf_rope_ext.util.memory_peak import LivePeak
from hf_rope_ext.util.quiet import enable_activation_checkpointing

LAYERS, TOKENS, HIDDEN = 6, 512, 64
CONFIG = dict(
    hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=32
)  # logits small beside a layer


def lora_llama(checkpointing: bool = True):
    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG, num_hidden_layers=LAYERS, use_cache=False)
    model = apply_lora(LlamaForCausalLM._from_config(config, attn_implementation="sdpa"), rank=4)
    if checkpointing:
        enable_activation_checkpointing(model, use_reentrant=False)
    return model.train()


def steps(model, count: int = 1, half: bool = False):
    """``count`` forward/backward passes (gradients accumulate); the losses, the gradients and the LivePeak."""
    ids = torch.randint(0, 32, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    losses = []
    with LivePeak() as live:
        for _ in range(count):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            losses.append(loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return losses, grads, live


@pytest.mark.parametrize("half", [False, True])
def test_the_step_is_bitwise_the_step_without_and_the_inputs_wait_on_the_host(half):
    plain_losses, plain, plain_live = steps(lora_llama(), 2, half)
    model = lora_llama()
    offload_checkpoints(model)
    losses, grads, live = steps(model, 2, half)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses, strict=True))
    assert grads.keys() == plain.keys() and all(torch.equal(grads[k], plain[k]) for k in plain)
    layer_input = TOKENS * HIDDEN * 4  # fp32 hidden states (autocast leaves the residual stream fp32)
    assert live.host_peak == LAYERS * layer_input and plain_live.host_peak == 0
    assert live.host_live == 0  # nothing left on the host after the backward
    # on the device: the input recomputed, the one fetched ahead, and the first layer's input, which transformers makes
    # a leaf that requires grad (so that checkpointed layers see one), held by its gradient's accumulator
    assert plain_live.peak - live.peak >= (LAYERS - 3) * layer_input - layer_input // 8


def test_the_backward_fetches_the_layer_before_the_one_it_recomputes():
    pool, tensors = HostPool(), [torch.full((3,), float(i)) for i in range(4)]
    packed = [pool.pack(t) for t in tensors]
    assert all(p.fetched is None for p in packed)
    for i in reversed(range(4)):  # the backward's order
        assert torch.equal(pool.unpack(packed[i]), tensors[i])
        assert packed[i].fetched is None  # handed over, not kept
        if i:
            assert packed[i - 1].fetched is not None and torch.equal(packed[i - 1].fetched, tensors[i - 1])
        assert all(p.fetched is None for p in packed[: max(i - 1, 0)])  # nothing further ahead


def test_a_new_step_starts_a_new_order():
    pool = HostPool()
    first = pool.pack(torch.zeros(2))
    assert first.index == 0
    del first
    assert pool.pack(torch.ones(2)).index == 0


def test_without_checkpointing_it_is_refused_and_the_switch_is_undone():
    with pytest.raises(ValueError, match="grad-checkpointing"):
        offload_checkpoints(lora_llama(checkpointing=False))
    model = lora_llama()
    before = [layer._gradient_checkpointing_func for layer in checkpointed_layers(model)]
    undo = offload_checkpoints(model)
    now = [layer._gradient_checkpointing_func for layer in checkpointed_layers(model)]
    assert all(a is not b for a, b in zip(now, before, strict=True))
    undo()
    assert [layer._gradient_checkpointing_func for layer in checkpointed_layers(model)] == before
    assert len(before) == LAYERS


def test_deepspeed_is_refused_by_name_and_the_other_engines_pass():
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from hf_rope_ext.train.memory.techniques import check_engine

    with pytest.raises(ValueError, match="--offload-checkpoints is not supported under DeepSpeed"):
        check_engine(SimpleNamespace(distributed_type=DistributedType.DEEPSPEED), offload=True)
    check_engine(SimpleNamespace(distributed_type=DistributedType.DEEPSPEED), offload=False)
    for engine in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.FSDP):
        check_engine(SimpleNamespace(distributed_type=engine), offload=True)
