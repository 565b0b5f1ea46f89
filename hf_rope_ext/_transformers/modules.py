"""Seam: where transformers keeps a family's modeling code. Installs nothing; reads transformers'
``model_type_to_module_name`` (an internal of its auto classes) to find a family's rotary embedding class, which
the portable export checks its lowerings against."""

from __future__ import annotations

import importlib

from transformers.models.auto.configuration_auto import model_type_to_module_name


def rotary_class(model_type: str):
    """The family's rotary embedding class (the one that reads ROPE_INIT_FUNCTIONS)."""
    name = model_type_to_module_name(model_type)
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name.split('.')[-1]}")
    found = [
        v
        for k, v in vars(module).items()
        if k.endswith("RotaryEmbedding") and hasattr(v, "compute_default_rope_parameters")
    ]
    if len(found) != 1:
        raise ValueError(
            f"model_type={model_type!r} has no single stock rotary embedding reading rope_parameters "
            f"(found {[c.__name__ for c in found]}); a portable export cannot be checked for it"
        )
    return found[0]
