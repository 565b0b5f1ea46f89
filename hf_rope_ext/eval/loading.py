"""Load a causal LM with a rope type applied, the package's user-facing way: ``from_pretrained(rope_parameters=...)``.

``requested_parameters`` builds the dict: the saved ``rope_theta``, ``factor`` where the type takes one, and
``original_max_position_embeddings`` set to the model's pretraining length (L0) where the type takes it.
``max_position_embeddings`` is left as saved: transformers' ``dynamic`` reads it as L0.
"""

from __future__ import annotations

import json

import torch

from ..store import sources
from ..store.sources import check_model_path, resolve_model  # noqa: F401  (the commands read them from here)
from ..types import rope_parameters
from ..types.rope_parameters import accepted_keys, pretraining_length  # noqa: F401  (pretraining_length: read from here too)
from ..util.did_you_mean import typo_of
from . import adapters

NONE_TYPES = (None, "none", "default")  # "the model as saved"


def requested_parameters(config, rope_type: str | None, factor: float | None = None, extra: dict | None = None):
    """The ``rope_parameters`` a command's flags (``--rope-type``, ``--factor``, ``--rope-param``) ask of a model of
    ``config`` (``types.rope_parameters.rope_parameters_for`` after checking the flags); None for the model as saved."""
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
    filled = ("original_max_position_embeddings",)  # from the saved config
    missing = [key for key, required in keys.items() if required and extra.get(key) is None and key not in filled]
    if missing:
        typo = typo_of(missing[0], [k for k in extra if k not in keys])
        raise KeyError(
            f"rope_type={rope_type!r} needs {missing[0]!r} (pass --factor or --rope-param {missing[0]}=...){typo}"
        )
    return rope_parameters.rope_parameters_for(config, rope_type, **extra)


def parse_rope_params(items: list[str] | None) -> dict:
    """``["window=256", "truncate=false"]`` -> ``{"window": 256, "truncate": False}`` (values read as JSON)."""
    params = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--rope-param {item!r}: expected key=value")
        params[key.strip()] = _parse_value(text.strip())
    return params


def rope_param_flags(params: dict) -> str:
    """The inverse of ``parse_rope_params``: " --rope-param KEY=VALUE" for each item, VALUE as JSON (a string bare)."""
    return "".join(f" --rope-param {k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in params.items())


def _parse_value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def check_rope_config(config, name) -> None:
    """The model must have a rotary position embedding this package drives: ``rope_parameters`` in its config."""
    if not hasattr(config, "rope_parameters"):
        raise ValueError(
            f"model {str(name)!r} is a {config.model_type!r} model, which has no rotary position embedding "
            "(rope_parameters) that hf-rope-ext can extend; use a RoPE model (llama, mistral, qwen2, qwen3, phi3, "
            "stablelm, roformer, ...)"
        )


def hub_config(name: str):
    """The config of Hub repo ``name`` (``sources.hub_config``), refused when it has no RoPE."""
    config = sources.hub_config(name)
    check_rope_config(config, name)
    return config


def load_config(path):
    """The saved config of a RoPE model folder (see :func:`check_rope_config`)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(check_model_path(path))
    check_rope_config(config, path)
    return config


def load_model(path, rope_parameters: dict | None = None, dtype=torch.float32, device: str = "cpu", adapter=None):
    """``AutoModelForCausalLM.from_pretrained(path, rope_parameters=...)`` in eval mode (None: as saved); with
    ``adapter``, the base ``path`` built with the adapter folder's config and the adapter on top (``eval.adapters``)."""
    from transformers import AutoModelForCausalLM

    import hf_rope_ext  # noqa: F401  (registers the package's rope types)

    if adapter is None:
        kwargs = {} if rope_parameters is None else {"rope_parameters": dict(rope_parameters)}
        model = AutoModelForCausalLM.from_pretrained(check_model_path(path), dtype=dtype, **kwargs)
        return model.to(device).eval()
    config = load_config(adapters.config_folder(path, adapter))
    if rope_parameters is not None:
        config.rope_parameters = dict(rope_parameters)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype)
    return adapters.attach(model, adapter).to(device).eval()


def load_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(check_model_path(path))
