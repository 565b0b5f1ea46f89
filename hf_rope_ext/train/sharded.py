"""The trainable tensors of a model whose parameters may be sharded (FSDP2: DTensors), and checkpoints under FSDP that
hold them alone.

accelerate's ``save_state`` under FSDP writes every parameter (its ``save_fsdp_model``: the frozen base too; a
save-state hook cannot stop it, it is handed no weights), and ``load_state`` reads them all back. Here the model part
is ours: the trainable parameters are gathered (every process takes part), written by the main process as
``model.safetensors`` (the file and names a DDP checkpoint has), and each process copies its shard back on resume.
The optimizer state goes through accelerate's ``save_fsdp_optimizer`` / ``load_fsdp_optimizer`` (the optimizer holds
the trainable parameters only), and the rest (scheduler, one RNG state per process, samplers, scaler) through
``save_state`` / ``load_state`` with the model and optimizer hidden from them.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

WEIGHTS = "model.safetensors"


def is_fsdp(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.FSDP


def trainable_tensors(model) -> dict:
    """{name: full CPU tensor} of every trainable parameter of an FSDP2 model on the main process, {} on the others.
    Every process must call it: torch gathers each tensor from its shards (through the accelerator when they are
    offloaded to the CPU); frozen parameters are not gathered."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    state = get_model_state_dict(model, options=options)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in names}  # ignore_frozen_params keeps the buffers: dropped here


def load_trainable(model, tensors: dict) -> None:
    """Copy full tensors ({name: tensor}) into the trainable parameters; a sharded parameter takes its own shard
    (every process holds the whole tensor, so no collective: ``src_data_rank=None``). KeyError names a missing one."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name not in tensors:
            raise KeyError(f"the checkpoint lacks trainable tensor {name!r}")
        full = tensors[name].to(param.device, param.dtype)
        if isinstance(param, DTensor):
            full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        with torch.no_grad():
            param.copy_(full)


@contextmanager
def engine_parts_hidden(accelerator):
    """accelerate's ``save_state`` / ``load_state`` inside see no model and no optimizer (it would write or read the
    whole sharded model); yields (models, optimizers) as they were registered, and restores them after."""
    models, optimizers = accelerator._models, accelerator._optimizers
    accelerator._models, accelerator._optimizers = [], []
    try:
        yield models, optimizers
    finally:
        accelerator._models, accelerator._optimizers = models, optimizers


def save_fsdp_state(accelerator, directory: Path) -> None:
    """An FSDP checkpoint: trainable tensors (gathered by all, written by the main process), the optimizer's shards
    (accelerate, in the plugin's ``state_dict_type``) and accelerate's remaining state."""
    from accelerate.utils import save_fsdp_optimizer
    from safetensors.torch import save_file

    plugin = accelerator.state.fsdp_plugin
    Path(directory).mkdir(parents=True, exist_ok=True)
    with engine_parts_hidden(accelerator) as (models, optimizers):
        tensors = trainable_tensors(models[0])  # one model: the loop prepares one
        if accelerator.is_main_process:
            save_file(tensors, str(Path(directory) / WEIGHTS), metadata={"format": "pt"})
        for index, optimizer in enumerate(optimizers):
            save_fsdp_optimizer(plugin, accelerator, optimizer, models[index], str(directory), index)
        accelerator.save_state(str(directory))


def load_fsdp_state(accelerator, directory: Path) -> None:
    """Restore :func:`save_fsdp_state`'s checkpoint. accelerate's part first: under FSDP2 the scaler must be loaded
    before the optimizer (``set_optimizer_state_dict`` takes a dummy step); nothing after it draws random numbers."""
    from accelerate.utils import load_fsdp_optimizer
    from safetensors.torch import load_file

    plugin = accelerator.state.fsdp_plugin
    with engine_parts_hidden(accelerator) as (models, optimizers):
        accelerator.load_state(str(directory))
        load_trainable(models[0], load_file(str(Path(directory) / WEIGHTS)))
        for index, optimizer in enumerate(optimizers):
            load_fsdp_optimizer(plugin, accelerator, optimizer, models[index], str(directory), index)
