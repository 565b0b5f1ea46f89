"""How each process of a fine-tuning run gets the base model.

One process, DDP, ZeRO and FSDP without accelerate's ``cpu_ram_efficient_loading``: every process reads the whole
checkpoint and moves it to its device. FSDP2 with it (``examples/accelerate/fsdp.yaml``): the main process alone reads
the checkpoint, into its host memory, and every other process builds the model on the meta device (its buffers, the
rotary frequencies among them, computed as usual); accelerate's ``prepare`` then shards the model and broadcasts the
main process's weights tensor by tensor into the shards, so no device ever holds more than its shards and the tensor
being broadcast, and only the main process holds the whole model, in host memory. Whatever runs the model before
``prepare`` (the fp16 range check, the 'before' figures) runs after it on such a run.
"""

from __future__ import annotations

import os

from .model import DTYPES, load_model


def reads_once() -> bool:
    """Whether the launcher asked for FSDP2 with CPU-RAM-efficient loading over several processes (accelerate's
    environment variables, set by ``accelerate launch`` from its config before any process starts)."""
    from accelerate.utils import parse_flag_from_env

    return (
        int(os.environ.get("WORLD_SIZE", "1")) > 1
        and parse_flag_from_env("ACCELERATE_USE_FSDP")
        and os.environ.get("FSDP_VERSION", "1") == "2"
        and parse_flag_from_env("FSDP_CPU_RAM_EFFICIENT_LOADING")
    )


def base_model(path: str, config, precision: str, attn_implementation: str, state):
    """The base model of this process (``state``: accelerate's PartialState): read and on the device; or, when the run
    reads once, read into host memory (main process) or built on the meta device (the others)."""
    if not reads_once():
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
