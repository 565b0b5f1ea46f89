"""Long-context LoRA fine-tuning with peft + accelerate + datasets (``hf-rope-ext finetune``).

``finetune(FinetuneConfig(...))`` runs a job end to end; ``load_adapter(path)`` loads its output on the base with
the extended rope parameters; ``bundle_adapter(path, base, out)`` writes the adapter and its extended base as one
folder that peft's ``AutoPeftModelForCausalLM`` loads right (``bundle``). Modules: ``data`` (text -> packed rows),
``positions`` (contiguous / PoSE / random position ids), ``model`` (base + target rope config, checks), ``lora``
(peft setup), ``loop`` (accelerate loop; ``batches``, ``checkpoints``, ``csv_log``, ``interrupt``, ``loss`` its
parts; ``run_folder`` where a run writes), ``config`` (the request, each field an option of the command, and its
checks), ``plan`` (the request's stages and loop settings), ``prepare`` (one job's state and outputs), ``job``
(the glue: ``finetune``), ``memory`` (the techniques that hold less on a device; ``memory.model``, the bytes a
process holds at a step's peak, term by term; ``memory.planner``, which techniques and how many GPUs a row needs).

The names that need torch load on first use, so that the command reads :class:`FinetuneConfig` for
``finetune --help`` without importing torch.
"""

import importlib

from .config import FinetuneConfig, parse_stages

LAZY = {  # public name -> the module of this package that defines it
    "bundle_adapter": "bundle",
    "finetune": "job",
    "load_adapter": "prepare",
    "position_ids": "positions",
    "SCHEDULES": "positions",
}
__all__ = ["bundle_adapter", "FinetuneConfig", "finetune", "load_adapter", "parse_stages", "position_ids", "SCHEDULES"]


def __getattr__(name: str):
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
