"""Build ``rope_parameters`` for a saved model without losing what its config already says.

``from_pretrained(path, rope_parameters=...)`` replaces the saved dict whole, so a checkpoint's own
``rope_theta`` or ``partial_rotary_factor`` would be lost; this merges them in.
"""

from __future__ import annotations

from typing import Any

from ..store.sources import read_config
from . import registry

KEPT_KEYS = ("rope_theta", "partial_rotary_factor")
ORIGINAL = "original_max_position_embeddings"
# rope types whose parameters a config may declare elsewhere: (the config attribute, the keys taken from it); Qwen's
# Dual Chunk Attention configs (Qwen2.5-1M) hold {chunk_size, local_size, original_max_position_embeddings}
DECLARED = {"dual_chunk": ("dual_chunk_attention_config", ("chunk_size", "local_size", ORIGINAL))}


def declared_parameters(config, rope_type: str) -> dict:
    """The parameters of ``rope_type`` that ``config`` declares outside rope_parameters (``DECLARED``), or {}."""
    attribute, keys = DECLARED.get(rope_type, (None, ()))
    found = getattr(config, attribute, None) if attribute else None
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise ValueError(f"config.{attribute}={found!r}: expected a dict with keys {list(keys)}")
    return {key: found[key] for key in keys if found.get(key) is not None}


def _flat_rope_parameters(config) -> dict:
    params = dict(getattr(config, "rope_parameters", None) or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(
            f"config.rope_parameters is nested per layer type ({sorted(params)}); pass a dict per layer type yourself"
        )
    return params


def pretraining_length(config) -> int:
    """L0: the saved ``original_max_position_embeddings`` if any; for transformers' ``linear``, which has no key for
    it, ``max_position_embeddings`` / ``factor`` (linear-scaled checkpoints state the extended length); else
    ``max_position_embeddings``."""
    params = getattr(config, "rope_parameters", None) or {}  # nested per layer type: neither key at the top
    if params.get(ORIGINAL):
        return int(params[ORIGINAL])
    if params.get("rope_type") == "linear" and params.get("factor"):
        return round(config.max_position_embeddings / float(params["factor"]))
    return int(config.max_position_embeddings)


def extended_max_positions(rope_type: str | None, pretrain: int, length: int) -> int:
    """``max_position_embeddings`` of a model extended to ``length`` tokens: that length (what engines read as the
    model's context), except for transformers' ``dynamic``, which reads it as L0."""
    return int(pretrain) if rope_type == "dynamic" else int(length)


def accepted_keys(rope_type: str) -> dict[str, bool]:
    """Keys ``rope_type`` takes besides rope_type/rope_theta -> whether each is required. KeyError if unknown."""
    params, _ = registry.type_spec(rope_type)
    return {"partial_rotary_factor": False, **{key: p.default is registry.REQUIRED for key, p in params.items()}}


def rope_parameters_for(source: Any, rope_type: str | None, **params: Any) -> dict:
    """``rope_parameters`` for ``source`` (a config, a model directory, a GGUF file or a Hub repo id) switched to
    ``rope_type``.

    Keeps the saved base (``rope_theta``) and ``partial_rotary_factor``; takes what the config declares for the type
    elsewhere as defaults (``dual_chunk``: a Qwen config's ``dual_chunk_attention_config``, read only when that type
    is asked for); sets ``original_max_position_embeddings`` to the saved pretraining length
    (``max_position_embeddings`` unless the saved parameters name one) when the type takes it and it is not given.
    The result is validated as every rope dict of the package is (``registry.validate``): a key the type does not
    take, a value of the wrong type or out of range, or parameters that contradict each other raise an error naming
    the key, the value and what is allowed.
    ``rope_type=None`` returns the saved parameters unchanged.
    """
    config = read_config(source)
    saved = _flat_rope_parameters(config)
    if rope_type is None:
        return saved
    keys = accepted_keys(rope_type)
    merged = {k: saved[k] for k in KEPT_KEYS if saved.get(k) is not None}
    merged["rope_type"] = rope_type
    merged.update(declared_parameters(config, rope_type))
    if ORIGINAL in keys and ORIGINAL not in merged and params.get(ORIGINAL) is None:
        merged[ORIGINAL] = int(saved.get("original_max_position_embeddings") or config.max_position_embeddings)
    merged.update({k: v for k, v in params.items() if v is not None})
    registry.validate(merged, config)
    return merged


def saved_rope_theta(config, layer_type: str | None = None) -> float | None:
    """The rope_theta saved with the checkpoint ``config`` was loaded from (``config.name_or_path``), or None.

    Read from the checkpoint's config.json (local directory or the Hub cache; nothing is downloaded): its
    ``rope_parameters`` (the ``layer_type`` entry when nested) or, in older files, a top-level ``rope_theta``.
    """
    from transformers import PretrainedConfig

    source = getattr(config, "name_or_path", None)
    if not source:
        return None
    try:
        saved, _ = PretrainedConfig.get_config_dict(source, local_files_only=True)
    except OSError:  # not a checkpoint (a name given by hand), or not in the cache
        return None
    params = saved.get("rope_parameters") or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    theta = params.get("rope_theta", saved.get("rope_theta"))
    return theta if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None


def restore_legacy_theta(config, params: dict, layer_type: str | None = None) -> None:
    """Legacy ``from_pretrained(path, rope_scaling={...})``: put the checkpoint's rope_theta back in ``params``.

    transformers 5.23 replaces the loaded rope_parameters by the legacy dict and then fills its rope_theta from a
    ``config.rope_theta`` attribute that 5.x configs no longer have, leaving ``"rope_theta": None``. A config built
    with ``rope_scaling=`` gets its theta the same way, from what the config held; here that is the checkpoint's.
    A dict given as ``rope_parameters=`` (no rope_theta key at all) is left alone: it replaces the saved one whole.
    """
    if "rope_theta" in params and params["rope_theta"] is None:
        theta = saved_rope_theta(config, layer_type)
        if theta is not None:
            params["rope_theta"] = theta
