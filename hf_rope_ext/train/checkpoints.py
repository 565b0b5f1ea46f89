"""Checkpoints that resume exactly: ``accelerator.save_state`` keeps the trainable weights, optimizer, scheduler and RNG
states (one RNG file per process); the checkpoint's ``trainer_state.json`` keeps the optimizer step and the plan it
was written under (stages, batch, schedule, seed, processes), which a resume must match. A checkpoint holds the
trainable weights and their optimizer state only, never the frozen base: under FSDP the model part is written by
``sharded`` (accelerate's would hold every parameter); under DeepSpeed the engine is told to leave frozen ones out."""

from __future__ import annotations

import json
from pathlib import Path

from ..store.files import read_json
from .sharded import is_fsdp, load_fsdp_state, save_fsdp_state

STATE_FILE = "trainer_state.json"
PLAN_DEFAULTS = {"processes": 1, "sequence_parallel": 1}  # keys older checkpoints lack, as they were then


def keep_trainable_only(models, weights, _output_dir) -> None:
    """save_state pre-hook: write only trainable tensors (the adapter), not the frozen base. Under FSDP and DeepSpeed
    accelerate hands it no weights (the engine writes the model): nothing to filter there."""
    for i, state in enumerate(weights):
        names = {n for n, p in models[i].named_parameters() if p.requires_grad}
        weights[i] = {k: v for k, v in state.items() if k in names}


def save_checkpoint(accelerator, directory: Path, step: int, plan: dict) -> Path:
    """accelerate's state (trainable tensors, optimizer, scheduler: main process; RNG: one file per process) and,
    from the main process only, ``trainer_state.json``."""
    if is_fsdp(accelerator):
        save_fsdp_state(accelerator, directory)
    else:
        accelerator.save_state(str(directory), **save_options(accelerator))
    if accelerator.is_main_process:
        (directory / STATE_FILE).write_text(json.dumps({"step": step, "plan": plan}, indent=2), encoding="utf-8")
    accelerator.wait_for_everyone()
    return directory


def load_checkpoint(accelerator, directory: Path, plan: dict) -> int:
    """Restore a checkpoint written with the same plan; returns the optimizer steps already done."""
    step = checkpoint_step(directory, plan)
    if is_fsdp(accelerator):
        load_fsdp_state(accelerator, directory)
    else:  # only trainable tensors are in the checkpoint: the model is loaded non-strict
        accelerator.load_state(str(directory), **load_options(accelerator))
    return step


def save_options(accelerator) -> dict:
    """A DeepSpeed engine writes the module itself (``save_checkpoint``): told to leave the frozen parameters out."""
    return {"exclude_frozen_parameters": True} if is_deepspeed(accelerator) else {}


def load_options(accelerator) -> dict:
    """Non-strict model loading; ``load_module_strict`` is a DeepSpeed engine's ``load_checkpoint`` name for it."""
    return {"load_module_strict": False} if is_deepspeed(accelerator) else {"strict": False}


def is_deepspeed(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def check_checkpoint_tensors(model, directory: Path) -> None:
    """Every trainable tensor of the (unwrapped) model must be in the checkpoint, since load_state runs non-strict.
    DeepSpeed checkpoints keep their tensors elsewhere and are not checked here."""
    weights = Path(directory) / "model.safetensors"
    if not weights.is_file():
        return
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as handle:
        saved = set(handle.keys())
    missing = sorted(n for n, p in model.named_parameters() if p.requires_grad and n not in saved)
    if missing:
        raise ValueError(f"--resume-from: {weights} lacks trainable tensor {missing[0]!r} ({len(missing)} missing)")


def checkpoint_step(directory: Path, plan: dict) -> int:
    """The optimizer step a checkpoint was written at; ValueError when it was written under another plan."""
    state_path = Path(directory) / STATE_FILE
    if not state_path.is_file():
        raise FileNotFoundError(f"--resume-from {str(directory)!r}: no {STATE_FILE} (not a checkpoint of this trainer)")
    state = read_json(state_path)
    saved = {**PLAN_DEFAULTS, **state["plan"]}
    differs = sorted(k for k in plan if saved.get(k) != plan[k])
    if differs:
        key = differs[0]
        raise ValueError(f"--resume-from: the checkpoint has {key}={saved.get(key)!r}, this run {plan[key]!r}")
    return int(state["step"])


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The checkpoint of the highest step under ``checkpoint_dir`` (``step-NNNNNN`` with its state file), or None."""
    found = sorted(Path(checkpoint_dir).glob("step-*/" + STATE_FILE)) if Path(checkpoint_dir).is_dir() else []
    return found[-1].parent if found else None
