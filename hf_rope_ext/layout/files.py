"""Converting a saved model directory (sharded safetensors included) or a peft adapter directory.

The source directory is only read. The result is written to a temporary directory beside ``dst`` and moved
into place at the end, so a failure leaves no half-written ``dst``.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..models import family_of
from .state_dict import check_direction, convert_tensors

ADAPTER_CONFIG = "adapter_config.json"
METADATA_KEY = "rope_layout"  # recorded in an adapter's safetensors metadata (adapter configs are peft's)


@dataclass
class Conversion:
    kind: str  # "model" or "adapter"
    source: str
    to: str
    files: dict[str, list[str]] = field(default_factory=dict)  # file name -> permuted keys

    def summary(self) -> list[str]:
        """What was permuted, keys with layer numbers folded to ``*`` and counted over all files."""
        keys = [key for moved in self.files.values() for key in moved]
        touched = sum(bool(moved) for moved in self.files.values())
        folded = Counter(re.sub(r"\.\d+\.", ".*.", key) for key in keys)
        head = f"permuted {len(keys)} tensors in {touched} of {len(self.files)} files:"
        return [head] + [f"  {key}  x{count}" for key, count in sorted(folded.items())]


def convert_directory(src, dst, to: str, overwrite: bool = False, config_dir=None) -> Conversion:
    """Write ``src`` converted to ``to`` into ``dst``; ``config_dir`` gives an adapter's base model config."""
    src, dst = Path(src).resolve(), Path(dst).resolve()
    _check_paths(src, dst, overwrite)
    is_adapter = (src / ADAPTER_CONFIG).is_file()
    config = _base_config(src, config_dir) if is_adapter else _load_config(src)
    family = family_of(getattr(config, "model_type", None))
    weights = sorted(src.glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{src} holds no *.safetensors files; only safetensors checkpoints are converted")
    source = _adapter_layout(weights[0], family, config) if is_adapter else family.checkpoint_layout(config)
    check_direction(source, to, f"{src}")
    result = Conversion("adapter" if is_adapter else "model", source, to)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True, ignore=_top_level(src, {w.name for w in weights}))
        for path in _progress(weights):
            result.files[path.name] = _convert_file(path, tmp / path.name, family, config, source, to, is_adapter)
        if not is_adapter:
            _write_layout(src / "config.json", tmp / "config.json", to)
        _replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _check_paths(src: Path, dst: Path, overwrite: bool) -> None:
    if not src.is_dir():
        raise (NotADirectoryError if src.exists() else FileNotFoundError)(f"SRC={src} is not a directory")
    if dst == src or src in dst.parents or dst in src.parents:
        raise ValueError(f"DST={dst} overlaps SRC={src}; the source is never written: choose a separate directory")
    if dst.exists() and not overwrite:
        raise FileExistsError(f"DST={dst} exists; pass --overwrite (overwrite=True) to replace it")
    dst.parent.mkdir(parents=True, exist_ok=True)


def _load_config(directory: Path):
    from transformers import AutoConfig

    import hf_rope_ext  # noqa: F401  (so configs naming this package's rope types load)

    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} has neither config.json (a model) nor {ADAPTER_CONFIG} (an adapter)")
    return AutoConfig.from_pretrained(directory)


def _base_config(adapter: Path, config_dir):
    """The base model's config of an adapter: ``config_dir``, else its base_model_name_or_path if local."""
    if config_dir is None:
        base = json.loads((adapter / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
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
    data = json.loads(config_in.read_text())
    data["rope_layout"] = to
    config_out.write_text(json.dumps(data, indent=2) + "\n")


def _top_level(src: Path, names: set[str]):
    def ignore(directory, entries):
        return [e for e in entries if Path(directory).resolve() == src and e in names]

    return ignore


def _replace(tmp: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    tmp.rename(dst)


def _progress(items):
    from tqdm.auto import tqdm

    return tqdm(items, desc="convert-layout", unit="file", disable=len(items) < 2)
