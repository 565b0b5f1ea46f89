"""An adapter and its extended base as one folder that the stock loaders read right (``bundle_adapter``).

peft's ``AutoPeftModelForCausalLM.from_pretrained(adapter)`` builds the base from the adapter's
``base_model_name_or_path`` with that model's own config: the rope parameters and length the adapter was trained with
(the ``config.json`` that ``finetune`` saves beside the adapter) are never read, and a Hub id there fetches that
repository's weights, which need not be the weights the adapter was trained on. :func:`bundle_adapter` writes
``out/``:

- ``out/base/``: the base's weights, tokenizer and generation config, with the adapter folder's ``config.json``
  (the extended rope parameters and length), or the base's own when the adapter has none;
- ``out/adapter_config.json`` (its ``base_model_name_or_path`` the absolute path of ``out/base``) and the adapter's
  weights; no ``config.json`` beside them, so that transformers takes ``out`` for an adapter, not a model.

Then ``AutoPeftModelForCausalLM.from_pretrained(out)``, ``AutoModelForCausalLM.from_pretrained(out)`` (with peft
installed), ``hf_rope_ext.train.load_adapter(out)`` and ``hf-rope-ext eval --adapter out`` all build the extended base
and put the adapter on it. The path is absolute: a moved folder must be written again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..store.files import read_json
from ..store.outputs import CARD, MANIFEST, Staged
from ..store.sources import check_model_path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
NOT_FROM_BASE = {"config.json", CARD, MANIFEST}  # the config is the adapter's; the base's card describes the base
# what the weights' shapes depend on: the base's and the adapter's config must agree on each
SHAPE_KEYS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "tie_word_embeddings",
)  # fmt: skip


def bundle_adapter(adapter, base, out, overwrite: bool = False) -> Path:
    """Write ``out`` (see the module docstring) for the peft adapter folder ``adapter`` on the model folder (or GGUF
    file) ``base``; returns ``out`` as an absolute path."""
    adapter = Path(adapter).expanduser()
    weights = adapter_weights(adapter)
    base = check_model_path(Path(base).expanduser())
    base_config = read_json(base / "config.json")
    config = read_json(adapter / "config.json") if (adapter / "config.json").is_file() else base_config
    check_same_shapes(config, base_config, adapter, base)
    target = Path(out).expanduser().resolve()
    with Staged(target, overwrite, "--out") as tmp:
        (tmp / "base").mkdir()
        for item in sorted(base.iterdir()):
            if item.is_file() and item.name not in NOT_FROM_BASE:
                shutil.copy2(item, tmp / "base" / item.name)
        write_json(tmp / "base" / "config.json", config)
        adapter_config = {**read_json(adapter / ADAPTER_CONFIG), "base_model_name_or_path": str(target / "base")}
        write_json(tmp / ADAPTER_CONFIG, adapter_config)
        for item in weights:
            shutil.copy2(item, tmp / item.name)
    return target


def adapter_weights(adapter: Path) -> list[Path]:
    """The weight files of the peft adapter folder ``adapter``; FileNotFoundError when it is not one."""
    if not (Path(adapter) / ADAPTER_CONFIG).is_file():
        raise FileNotFoundError(f"adapter {str(adapter)!r} is not a peft adapter folder (no {ADAPTER_CONFIG} there)")
    weights = [Path(adapter) / name for name in ADAPTER_WEIGHTS if (Path(adapter) / name).is_file()]
    if not weights:
        raise FileNotFoundError(f"adapter {str(adapter)!r} holds no adapter weights (one of {list(ADAPTER_WEIGHTS)})")
    return weights


def check_same_shapes(config: dict, base_config: dict, adapter: Path, base: Path) -> None:
    """The adapter's config describes the base's architecture (only rope parameters and length may differ)."""
    for key in SHAPE_KEYS:
        if config.get(key) != base_config.get(key):
            raise ValueError(
                f"{key}: {config.get(key)!r} in {str(adapter / 'config.json')!r} but {base_config.get(key)!r} in "
                f"{str(base / 'config.json')!r}; the adapter was trained on another model: pass its own base"
            )


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
