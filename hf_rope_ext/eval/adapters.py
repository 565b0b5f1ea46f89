"""Evaluating a fine-tuned LoRA adapter as it is (not merged), the way peft's ``AutoPeftModelForCausalLM`` loads one:
``eval --adapter DIR`` (base: ``--model``, else the adapter's ``base_model_name_or_path``), or the adapter folder as
``--model``. The base is built with the adapter folder's ``config.json`` when it has one (``hf-rope-ext finetune``
saves the extended config there: the rope parameters and length it was trained with), and its tokenizer when it has
one; then the adapter goes on top.
"""

from __future__ import annotations

from pathlib import Path

from ..store.files import read_json
from ..store.sources import check_model_path, resolve_model
from ..util.quiet import peft_wrapping

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter(path) -> bool:
    return path is not None and (Path(path) / ADAPTER_CONFIG).is_file()


def split(model, adapter=None) -> tuple:
    """(base model, adapter folder or None) for ``--model`` / ``--adapter``; an adapter folder given as ``--model``
    stands for its base plus itself. ``(None, None)``: neither given."""
    if adapter is None and is_adapter(model):
        model, adapter = None, model
    if adapter is None:
        return (None if model is None else check_model_path(model)), None
    adapter = Path(adapter)
    if not is_adapter(adapter):
        raise FileNotFoundError(f"--adapter {str(adapter)!r} is not a peft adapter folder (no {ADAPTER_CONFIG} there)")
    base = model or read_json(adapter / ADAPTER_CONFIG).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter / ADAPTER_CONFIG} names no base_model_name_or_path; pass --model BASE")
    return resolve_model(str(base)), adapter


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def config_folder(base, adapter):
    """Where the config is read: the adapter folder when it holds a config.json, else the base."""
    return check_model_path(adapter) if adapter is not None and (Path(adapter) / "config.json").is_file() else base


def tokenizer_folder(base, adapter):
    """Where the tokenizer is read: the adapter folder when it holds one (``finetune`` saves it there), else the base
    (an adapter shipped with its config alone, as ``examples/smollm2-*``)."""
    held = adapter is not None and any((Path(adapter) / name).is_file() for name in TOKENIZER_FILES)
    return check_model_path(adapter) if held else base


def attach(model, adapter):
    """``model`` with the adapter of folder ``adapter`` on top (peft), unmerged."""
    from peft import PeftModel

    with peft_wrapping():
        return PeftModel.from_pretrained(model, str(adapter))


def adapter_label(adapter) -> str:
    """A row naming an adapter and the rope type it was trained under (its folder's config.json), e.g.
    "yarn x4 + LoRA smollm2-yarn4-retrieval-lora" or "dual_chunk + LoRA smollm2-dual-chunk-retrieval-lora"."""
    params = read_json(Path(adapter) / "config.json")["rope_parameters"]
    factor = f" x{params['factor']:g}" if "factor" in params else ""
    return f"{params['rope_type']}{factor} + LoRA {Path(adapter).name}"


def training_command(adapter) -> str | None:
    """The ``hf-rope-ext finetune`` command of a code block in the adapter's card (README.md), its continued lines
    joined; None when the card has none."""
    card = Path(adapter) / "README.md"
    lines, fenced = card.read_text(encoding="utf-8").splitlines() if card.is_file() else [], False
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if fenced and "hf-rope-ext finetune" in line:
            command = [line.strip()]
            while command[-1].endswith("\\") and i + len(command) < len(lines):
                command[-1] = command[-1][:-1].rstrip()
                command.append(lines[i + len(command)].strip())
            return " ".join(command)
    return None
