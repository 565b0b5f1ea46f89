"""Load a causal LM with a rope type applied, the package's user-facing way: ``from_pretrained(rope_parameters=...)``.

``rope_parameters_for`` builds the dict: the saved ``rope_theta``, ``factor`` where the type takes one, and
``original_max_position_embeddings`` set to the model's pretraining length (L0) where the type takes it.
``max_position_embeddings`` is left as saved: transformers' ``dynamic`` reads it as L0.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import configure, from_gguf
from ..configure import accepted_keys

NONE_TYPES = (None, "none", "default")  # "the model as saved"
ORIGINAL = "original_max_position_embeddings"


def pretraining_length(config) -> int:
    """L0: the saved ``original_max_position_embeddings`` if any, else ``max_position_embeddings``."""
    saved = (getattr(config, "rope_parameters", None) or {}).get(ORIGINAL)
    return int(saved or config.max_position_embeddings)


def rope_parameters_for(config, rope_type: str | None, factor: float | None = None, extra: dict | None = None):
    """The ``rope_parameters`` dict applying ``rope_type`` to a model of ``config``; None for the model as saved."""
    extra = dict(extra or {})
    if rope_type in NONE_TYPES:
        if factor is not None or extra:
            raise ValueError(f"factor={factor!r} / rope parameters {extra} given without a rope_type; pass --rope-type")
        return None
    keys = accepted_keys(rope_type)
    if factor is not None:
        if "factor" not in keys:
            raise ValueError(f"factor={factor!r}: rope_type={rope_type!r} takes no factor; allowed: {sorted(keys)}")
        extra = {"factor": float(factor), **extra}
    params = configure.rope_parameters_for(config, rope_type, **extra)
    missing = [key for key, required in keys.items() if required and params.get(key) is None]
    if missing:
        raise KeyError(f"rope_type={rope_type!r} needs {missing[0]!r} (pass --factor or --rope-param {missing[0]}=...)")
    return params


def parse_rope_params(items: list[str] | None) -> dict:
    """``["window=256", "truncate=false"]`` -> ``{"window": 256, "truncate": False}`` (values read as JSON)."""
    params = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--rope-param {item!r}: expected key=value")
        params[key.strip()] = _parse_value(text.strip())
    return params


def _parse_value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def check_model_path(path) -> Path:
    """A local model folder (with config.json), or a GGUF file, converted once to a folder (``from_gguf``);
    FileNotFoundError naming what is missing."""
    path = Path(path)
    if from_gguf.is_gguf(path):
        return from_gguf.model_folder(path)
    if not path.exists():
        raise FileNotFoundError(f"model {str(path)!r} is not a model directory (no such folder)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model {str(path)!r} is not a model directory (no config.json there)")
    return path


def resolve_model(name: str) -> str:
    """A local model folder, or a Hub repo id: checked like :func:`check_model_path` when it exists here or looks
    like a path, so that a mistyped folder is never looked up on the Hub."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if Path(name).exists() or name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        return str(check_model_path(Path(name).expanduser()))
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise FileNotFoundError(
            f"model {name!r} is not a model directory (no such folder) nor a Hub repo id ('name' or 'owner/name')"
        ) from None
    return name


def check_rope_config(config, name) -> None:
    """The model must have a rotary position embedding this package drives: ``rope_parameters`` in its config."""
    if not hasattr(config, "rope_parameters"):
        raise ValueError(
            f"model {str(name)!r} is a {config.model_type!r} model, which has no rotary position embedding "
            "(rope_parameters) that hf-rope-ext can extend; use a RoPE model (llama, mistral, qwen2, qwen3, phi3, "
            "stablelm, roformer, ...)"
        )


def hub_config(name: str):
    """The config of Hub repo ``name`` (HF_HUB_OFFLINE: from the cache only); one line naming it when there is none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name)
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(
            f"model {name!r} is not a model directory (no such folder) nor a model on the Hub "
            f"that could be read: {first}"
        ) from None
    check_rope_config(config, name)
    return config


def load_config(path):
    """The saved config of a RoPE model folder (see :func:`check_rope_config`)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(check_model_path(path))
    check_rope_config(config, path)
    return config


def load_model(path, rope_parameters: dict | None = None, dtype=torch.float32, device: str = "cpu"):
    """``AutoModelForCausalLM.from_pretrained(path, rope_parameters=...)`` in eval mode (None: as saved)."""
    from transformers import AutoModelForCausalLM

    import hf_rope_ext  # noqa: F401  (registers the package's rope types)

    kwargs = {} if rope_parameters is None else {"rope_parameters": dict(rope_parameters)}
    model = AutoModelForCausalLM.from_pretrained(check_model_path(path), dtype=dtype, **kwargs)
    return model.to(device).eval()


def load_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(check_model_path(path))
