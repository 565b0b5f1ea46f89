"""The memory techniques a fine-tuning request asks for, switched on where ``train.prepare`` builds the model:
``--tiled-mlp`` on the base model as loaded (so the evaluations before and after training tile as training does),
``--offload-checkpoints`` and ``--no-copies`` on the training model; and what an engine cannot carry."""

from __future__ import annotations

from collections.abc import Callable


def tile_model(model, tile: int | None) -> Callable[[], None]:
    """``tile``: None (no tiles), 0 (ALST's tile) or tokens a tile; returns the function that undoes it."""
    from .tiled_mlp import enable_tiled_mlp

    return (lambda: None) if tile is None else enable_tiled_mlp(model, tile or None)


def enable_techniques(model, offload: bool = False, no_copies: bool = False) -> Callable[[], None]:
    """Switch on the asked techniques on ``model`` (the peft-wrapped training model, activation checkpointing already
    set); returns the function that switches them off."""
    from .input_casting import keep_adapter_input_dtype
    from .lean_norm import enable_lean_norms
    from .offload import offload_checkpoints

    undo: list[Callable[[], None]] = []
    if no_copies:
        undo += [keep_adapter_input_dtype(model), enable_lean_norms(model)[0]]
    if offload:
        undo.append(offload_checkpoints(model))

    def disable() -> None:
        for step in reversed(undo):
            step()

    return disable


def check_engine(accelerator, offload: bool) -> None:
    """DeepSpeed checkpoints and offloads activations its own way (its ``activation_checkpointing`` config): the
    package's offload is refused under it rather than stacked on it."""
    from accelerate.utils import DistributedType

    if offload and accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise ValueError(
            "--offload-checkpoints is not supported under DeepSpeed; use DeepSpeed's own "
            "activation_checkpointing.cpu_checkpointing, or FSDP2 / DDP with --offload-checkpoints"
        )
