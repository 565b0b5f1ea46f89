"""How each process of a fine-tuning run gets the base model.

One process, DDP, ZeRO below stage 3 (or ZeRO-3 with ``zero3_init_flag: false``) and FSDP without accelerate's
``cpu_ram_efficient_loading``: every process reads the whole checkpoint and moves it to its device.

FSDP2 with ``cpu_ram_efficient_loading`` (``examples/accelerate/fsdp.yaml``), where accelerate runs FSDP2 (on GPUs;
on a machine without one it runs DDP, and every process reads): the main process alone reads the
checkpoint, into its host memory, and every other process builds the model on the meta device (its buffers, the rotary
frequencies among them, computed as usual); accelerate's ``prepare`` then shards the model and broadcasts the main
process's weights tensor by tensor into the shards, so no device ever holds more than its shards and the tensor being
broadcast, and only the main process holds the whole model, in host memory.

DeepSpeed ZeRO-3 with ``zero3_init_flag: true`` (``examples/accelerate/deepspeed_zero3.yaml``) over several processes:
the Accelerator, whose DeepSpeed config transformers reads, exists before the model; transformers builds the model
under DeepSpeed's ``zero.Init`` (each parameter partitioned over the processes as it is created) and the main process
alone reads the checkpoint's values, one module's parameters gathered at a time.

Whatever runs the model before ``prepare`` (the fp16 range check, the 'before' figures) runs after it on such runs.
"""

from __future__ import annotations

from contextlib import contextmanager

from .model import DTYPES, load_model


def engine_first() -> bool:
    """Whether the launcher asked for FSDP or DeepSpeed (``accelerate launch`` with such a config; its environment
    says so): the run's Accelerator is then created before the model, which is loaded as the engine accelerate really
    runs needs (accelerate may run FSDP as DDP where there is no GPU; ZeRO-3's ``zero.Init`` reads the Accelerator's
    DeepSpeed config)."""
    from accelerate.utils import parse_flag_from_env

    return parse_flag_from_env("ACCELERATE_USE_FSDP") or parse_flag_from_env("ACCELERATE_USE_DEEPSPEED")


def reads_once(accelerator) -> bool:
    """Whether ``accelerator`` (or None) runs FSDP2 with CPU-RAM-efficient loading over several processes."""
    if accelerator is None or accelerator.num_processes == 1 or not getattr(accelerator, "is_fsdp2", False):
        return False
    return bool(accelerator.state.fsdp_plugin.cpu_ram_efficient_loading)


def partitions_at_load(accelerator) -> bool:
    """Whether ``accelerator`` (or None) runs DeepSpeed ZeRO-3 with ``zero3_init_flag`` over several processes."""
    plugin = deepspeed_plugin(accelerator)
    if plugin is None or accelerator.num_processes == 1:
        return False
    return plugin.hf_ds_config.is_zero3() and bool(plugin.zero3_init_flag)


def deepspeed_plugin(accelerator):
    """``accelerator``'s DeepSpeed plugin; None without DeepSpeed or without an Accelerator yet."""
    return getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)


def shards_at_load(accelerator) -> bool:
    """Whether no process of the run ever holds the whole model on its device (``reads_once``, ``partitions_at_load``):
    what would run the model before ``prepare`` runs on the prepared one."""
    return reads_once(accelerator) or partitions_at_load(accelerator)


def base_model(path: str, config, precision: str, attn_implementation: str, state, accelerator=None):
    """The base model of this process (``state``: accelerate's PartialState; ``accelerator``: the run's, when it
    exists before loading): partitioned as built (ZeRO-3 ``zero.Init``); read and on the device; or, when the run reads
    once, read into host memory (main process) or built on the meta device (the others)."""
    if partitions_at_load(accelerator):
        return load_model(path, config, precision, attn_implementation)
    if not reads_once(accelerator):
        with whole_weights(accelerator):
            return load_model(path, config, precision, attn_implementation).to(state.device)
    if state.is_main_process:
        return load_model(path, config, precision, attn_implementation)
    return empty_model(config, precision, attn_implementation)


def empty_model(config, precision: str, attn_implementation: str):
    """The architecture of ``config`` with every parameter on the meta device and every buffer real."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(
            config, dtype=DTYPES[precision], attn_implementation=attn_implementation
        )


@contextmanager
def whole_weights(accelerator):
    """A context in which transformers loads a model whole: under DeepSpeed ZeRO-3 (``accelerator``'s plugin, whatever
    its ``zero3_init_flag``) transformers would build it under ``zero.Init``, partitioned, which only a DeepSpeed
    engine can run and which needs every process. transformers' switch is off inside; accelerate's plugin sets it
    again after."""
    plugin = deepspeed_plugin(accelerator)
    if plugin is None:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()
