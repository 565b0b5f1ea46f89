"""Checkpoints that resume exactly: ``accelerator.save_state`` keeps the trainable weights, optimizer, scheduler and RNG
states (one RNG file per process); the checkpoint's ``trainer_state.json`` keeps the optimizer step and the plan it
was written under (stages, batch, schedule, seed, processes), which a resume must match. A checkpoint holds the
trainable weights and their optimizer state only, never the frozen base: under FSDP the model part is written by
``sharded`` (accelerate's would hold every parameter); under DeepSpeed the engine is told to leave frozen ones out.

A process may die at any moment (SIGKILL, a lost node), so a checkpoint counts only once every process's part is on
disk (:func:`save_checkpoint`): every process writes its part into ``step-NNNNNN.tmp``; once all have met, the main
process checks that each part is there, writes ``trainer_state.json`` last (with the number of processes and every
file's size), flushes the files to disk and renames the folder to ``step-NNNNNN``. :func:`missing_part` says what a
folder lacks to be complete; :func:`latest_checkpoint` returns complete ones only."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ..store.files import read_json
from .sharded import WEIGHTS, is_fsdp, load_fsdp_state, save_fsdp_state

STATE_FILE = "trainer_state.json"
PLAN_DEFAULTS = {"processes": 1, "sequence_parallel": 1}  # keys older checkpoints lack, as they were then
NAME = re.compile(r"step-(\d+)")  # a complete checkpoint's folder name (``step-{step:06d}``)
UNFINISHED = ".tmp"  # suffix of a checkpoint's folder while its parts are written
REPLACED = ".old"  # suffix of a complete checkpoint of the same step while a new one takes its name
RNG_FILE = "random_states_{}.pkl"  # accelerate's RNG state of process {index}: every process writes its own


def keep_trainable_only(models, weights, _output_dir) -> None:
    """save_state pre-hook: write only trainable tensors (the adapter), not the frozen base. Under FSDP and DeepSpeed
    accelerate hands it no weights (the engine writes the model): nothing to filter there."""
    for i, state in enumerate(weights):
        names = {n for n, p in models[i].named_parameters() if p.requires_grad}
        weights[i] = {k: v for k, v in state.items() if k in names}


def save_checkpoint(accelerator, directory: Path, step: int, plan: dict) -> Path:
    """Write the checkpoint of optimizer step ``step`` as ``directory`` (``.../step-NNNNNN``), complete or not at all:
    every process writes its part (accelerate's state: trainable tensors, optimizer and scheduler from the main process
    or sharded over all, one RNG file per process) into ``step-NNNNNN.tmp``; once all have met, the main process checks
    every part, writes ``trainer_state.json`` last and renames the folder. FileNotFoundError on every process when a
    part is missing (processes that do not share the output folder) or the main process cannot complete it."""
    final = Path(directory)
    unfinished = final.with_name(final.name + UNFINISHED)
    if accelerator.is_main_process:
        clear_unfinished(final.parent)  # left by a run that died while writing one
    accelerator.wait_for_everyone()
    write_parts(accelerator, unfinished)
    accelerator.wait_for_everyone()  # every process's part is written
    problem = None
    if accelerator.is_main_process:
        try:
            problem = finish(accelerator, unfinished, final, step, plan)
        except OSError as err:  # a full disk, say: every process stops here, none waits for the main one
            problem = f"checkpoint {final}: {err}"
    problem = from_main(accelerator, problem)
    if problem:
        raise FileNotFoundError(problem)
    return final


def write_parts(accelerator, directory: Path) -> None:
    """This process's part of a checkpoint, written into ``directory`` (every process calls it)."""
    if is_fsdp(accelerator):
        save_fsdp_state(accelerator, directory)
    else:
        accelerator.save_state(str(directory), **save_options(accelerator))


def finish(accelerator, unfinished: Path, final: Path, step: int, plan: dict) -> str | None:
    """Main process, once every process has written its part into ``unfinished``: check the parts, write the state
    file last, flush everything to disk and give the folder its final name; returns what is missing, else None."""
    missing = [" or ".join(names) for names in required_parts(accelerator) if not any_exists(unfinished, names)]
    if missing:
        return (
            f"checkpoint {final}: {unfinished} lacks {missing[0]} after every process wrote its part; the output "
            "folder must be one that every process (on every node) writes to"
        )
    state = {"step": step, "plan": plan, "world_size": accelerator.num_processes, "files": file_sizes(unfinished)}
    (unfinished / STATE_FILE).write_text(json.dumps(state, indent=2), encoding="utf-8")
    sync_tree(unfinished)
    put_in_place(unfinished, final)
    sync_folder(final.parent)
    return None


def required_parts(accelerator) -> list[tuple[str, ...]]:
    """The parts a checkpoint written by ``accelerator`` must hold, each as the names that can carry it: every
    process's RNG state, the model's trainable tensors and the optimizer state (a DeepSpeed engine writes both into
    its own folder; an FSDP optimizer is a torch.distributed.checkpoint folder, whose ``.metadata`` comes last)."""
    rng = [(RNG_FILE.format(index),) for index in range(accelerator.num_processes)]
    if is_deepspeed(accelerator):
        return [*rng, ("pytorch_model",)]
    return [*rng, (WEIGHTS,), ("optimizer.bin", "optimizer_0/.metadata")]


def any_exists(folder: Path, names: tuple[str, ...]) -> bool:
    return any((folder / name).exists() for name in names)


def file_sizes(folder: Path) -> dict[str, int]:
    """{path relative to ``folder``: bytes} of every file under it."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def sync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder`` (written by any process of this machine, or over a shared
    filesystem) to disk, so that the rename that completes a checkpoint never lands before its contents."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
    for path in [*sorted(p for p in folder.rglob("*") if p.is_dir()), folder]:
        sync_folder(path)


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (names, renames) to disk where the system allows it."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:  # some filesystems refuse fsync on a folder
        pass
    finally:
        os.close(descriptor)


def put_in_place(unfinished: Path, final: Path) -> None:
    """Rename the completed ``unfinished`` to ``final``; a checkpoint already there (of the same step, from a run
    resumed before it) is moved aside first and removed after."""
    replaced = final.with_name(final.name + REPLACED)
    if final.exists():
        shutil.rmtree(replaced, ignore_errors=True)
        final.rename(replaced)
    unfinished.rename(final)
    shutil.rmtree(replaced, ignore_errors=True)


def clear_unfinished(checkpoint_dir: Path) -> None:
    """Remove the folders of checkpoints that a run left unfinished in ``checkpoint_dir`` (main process)."""
    if Path(checkpoint_dir).is_dir():
        for path in Path(checkpoint_dir).glob("step-*"):
            if path.is_dir() and path.name.endswith((UNFINISHED, REPLACED)):
                shutil.rmtree(path, ignore_errors=True)


def from_main(accelerator, value):
    """The main process's ``value`` on every process (a collective: every process calls it)."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0]


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
    """The complete checkpoint of the highest step under ``checkpoint_dir`` (see :func:`missing_part`), or None."""
    folder = Path(checkpoint_dir)
    found = [p for p in folder.glob("step-*") if NAME.fullmatch(p.name)] if folder.is_dir() else []
    for path in sorted(found, key=lambda p: int(NAME.fullmatch(p.name).group(1)), reverse=True):
        if missing_part(path) is None:
            return path
    return None


def missing_part(directory: Path, sizes: bool = True) -> str | None:
    """What keeps ``directory`` from being a complete checkpoint, in words ("random_states_1.pkl", ...), or None when it
    is one: its name is ``step-NNNNNN`` (not a folder still being written), it holds ``trainer_state.json`` (written
    last), every process's RNG state and every file the state file lists, at the size it lists (``sizes``). A
    checkpoint written before the state file listed them needs the state file and one RNG state per process of its
    plan."""
    directory = Path(directory)
    if not NAME.fullmatch(directory.name):
        return f"the name step-NNNNNN (it is {directory.name}: a checkpoint being written, or left unfinished)"
    state = read_state(directory)
    if state is None:
        return f"{STATE_FILE} (written last, once every process's part is on disk)"
    plan = {**PLAN_DEFAULTS, **state.get("plan", {})}
    processes = int(state.get("world_size", plan["processes"] * plan["sequence_parallel"]))
    for name in [RNG_FILE.format(index) for index in range(processes)]:
        if not (directory / name).is_file():
            return name
    for name, size in state.get("files", {}).items():
        path = directory / name
        if not path.is_file():
            return name
        if sizes and path.stat().st_size != size:
            return f"{name} of {size} bytes (it has {path.stat().st_size})"
    return None


def read_state(directory: Path) -> dict | None:
    """A checkpoint's state file, or None when it is missing or is not a state file."""
    try:
        state = json.loads((Path(directory) / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "step" in state else None
