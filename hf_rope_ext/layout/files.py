"""Converting a saved model directory (sharded safetensors included) or a peft adapter directory.

The source directory is only read. Its top-level files are converted (``*.safetensors``) or copied (config,
tokenizer, card...); its subfolders are left out and named in the summary: a fine-tuning run's ``checkpoints/``
hold optimizer state in the old layout, and ``merged/`` is a model of its own (convert it with a second call).
The result is staged beside ``dst`` and moved into place at the end (:class:`hf_rope_ext.store.outputs.Staged`), so a
failure leaves ``dst`` as it was, and ``overwrite`` replaces only the files written here.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..models import family_of
from ..store.files import check_folder, read_json
from ..store.outputs import Staged
from ..util.progress import bar
from .card_line import relabel_layout
from .state_dict import check_direction, convert_tensors

ADAPTER_CONFIG = "adapter_config.json"
CARD = "README.md"
METADATA_KEY = "rope_layout"  # recorded in an adapter's safetensors metadata (adapter configs are peft's)


@dataclass
class Conversion:
    kind: str  # "model" or "adapter"
    source: str
    to: str
    files: dict[str, list[str]] = field(default_factory=dict)  # file name -> permuted keys
    left_out: list[str] = field(default_factory=list)  # subfolders of src not written to dst
    output_notes: list[str] = field(default_factory=list)  # files of dst kept or removed (hf_rope_ext.store.outputs)

    def summary(self) -> list[str]:
        """What was permuted, keys with layer numbers folded to ``*`` and counted over all files; what was left out."""
        keys = [key for moved in self.files.values() for key in moved]
        touched = sum(bool(moved) for moved in self.files.values())
        folded = Counter(re.sub(r"\.\d+\.", ".*.", key) for key in keys)
        head = f"permuted {len(keys)} tensors in {touched} of {len(self.files)} files:"
        lines = [head] + [f"  {key}  x{count}" for key, count in sorted(folded.items())]
        if self.left_out:
            folders = ", ".join(f"{name}/" for name in self.left_out)
            lines.append(
                f"left out, not converted: {folders} (only top-level files are converted; a merged/ model converts "
                "on its own: convert-layout SRC/merged DST2 --to ...; checkpoints/ cannot be resumed in another layout)"
            )
        return lines + self.output_notes


def convert_directory(src, dst, to: str, overwrite: bool = False, config_dir=None) -> Conversion:
    """Write ``src`` converted to ``to`` into ``dst``; ``config_dir`` gives an adapter's base model config."""
    src, dst = Path(src).resolve(), Path(dst).resolve()
    _check_paths(src, dst)
    is_adapter = (src / ADAPTER_CONFIG).is_file()
    config = _base_config(src, config_dir) if is_adapter else _load_config(src)
    family = family_of(getattr(config, "model_type", None))
    weights = sorted(src.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{src} holds no *.safetensors files; only safetensors checkpoints are converted")
    source = _adapter_layout(weights[0], family, config) if is_adapter else family.checkpoint_layout(config)
    check_direction(source, to, f"{src}")
    stage = Staged(dst, overwrite, "DST", writes_card=(src / CARD).is_file())
    result = Conversion("adapter" if is_adapter else "model", source, to, left_out=_subfolders(src))
    with stage as tmp:
        _copy_top_level(src, tmp, skip={w.name for w in weights})
        for path in _progress(weights):
            result.files[path.name] = _convert_file(path, tmp / path.name, family, config, source, to, is_adapter)
        if not is_adapter:
            _write_layout(src / "config.json", tmp / "config.json", to)
        _relabel_card(tmp / CARD, to)
    result.output_notes = stage.summary()
    return result


def _check_paths(src: Path, dst: Path) -> None:
    if not src.is_dir():
        raise (NotADirectoryError if src.exists() else FileNotFoundError)(f"SRC {str(src)!r} is not a directory")
    check_folder(src)  # a damaged file is named before DST is touched
    if dst == src or src in dst.parents or dst in src.parents:
        raise ValueError(f"DST {dst} overlaps SRC {src}; the source is never written: choose a separate directory")


def _subfolders(src: Path) -> list[str]:
    return sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))


def _copy_top_level(src: Path, dst: Path, skip: set[str]) -> None:
    """Every visible top-level file of ``src`` but ``skip`` (the weights, converted instead)."""
    for path in sorted(src.iterdir()):
        if path.is_file() and not path.name.startswith(".") and path.name not in skip:
            shutil.copy2(path, dst / path.name)


def _relabel_card(card: Path, to: str) -> None:
    """A card hf-rope-ext wrote states the layout: state the new one (a user's card is copied unchanged)."""
    if card.is_file():
        card.write_text(relabel_layout(card.read_text(encoding="utf-8"), to), encoding="utf-8")


def _load_config(directory: Path):
    from transformers import AutoConfig

    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} has neither config.json (a model) nor {ADAPTER_CONFIG} (an adapter)")
    check_folder(directory)
    return AutoConfig.from_pretrained(directory)


def _base_config(adapter: Path, config_dir):
    """The base model's config of an adapter: ``config_dir``, else its base_model_name_or_path if local."""
    if config_dir is None:
        base = read_json(adapter / ADAPTER_CONFIG).get("base_model_name_or_path")
        if not base or not (Path(base) / "config.json").is_file():
            raise ValueError(
                f"base_model_name_or_path={base!r} in {adapter / ADAPTER_CONFIG} is not a local model directory; "
                "pass --config DIR (the base model's directory or config.json) for head counts"
            )
        config_dir = base
    config_dir = Path(config_dir)
    return _load_config(config_dir.parent if config_dir.name == "config.json" else config_dir)


def _adapter_layout(weights: Path, family, config) -> str:
    """An adapter's layout: its safetensors metadata, else the layout of the live model it was trained on."""
    from safetensors import safe_open

    with safe_open(weights, "pt") as handle:
        recorded = (handle.metadata() or {}).get(METADATA_KEY)
    return recorded or family.memory_layout(config)


def _convert_file(path: Path, out: Path, family, config, source: str, to: str, is_adapter: bool) -> list[str]:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(path, "pt") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    converted, moved = convert_tensors(tensors, family, family.head_shape(config), source, to)
    if is_adapter:
        metadata[METADATA_KEY] = to
    save_file({k: v.contiguous() for k, v in converted.items()}, out, metadata=metadata or None)
    return moved


def _write_layout(config_in: Path, config_out: Path, to: str) -> None:
    """Copy config.json with ``rope_layout`` set, every other key and its order kept."""
    data = read_json(config_in)
    data["rope_layout"] = to
    config_out.write_text(json.dumps(data, indent=2) + "\n")


def _progress(items):
    return bar(items, desc="convert-layout", unit="file", enabled=len(items) >= 2)
