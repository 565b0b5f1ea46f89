"""The one module that touches transformers' internals, through its extension points only.

- ``ROPE_INIT_FUNCTIONS[name]``: the frequency function of each of this package's rope types;
- ``RotaryEmbeddingConfigMixin._validate_<name>_rope_parameters``: validation when a config is built.

``install()`` is idempotent and leaves every built-in entry untouched, so stock behaviour is unchanged
for models that do not name one of this package's types.
"""

from __future__ import annotations

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin

from . import registry
from .frequencies.common import rope_setup


def _identity_frequencies(method: registry.RopeMethod):
    """For attention-level types: zero frequencies, so q and k reach the attention function (and cache) unrotated."""

    def init_fn(config, device=None, seq_len=None, layer_type=None):
        dim = rope_setup(config, layer_type).dim
        return torch.zeros(dim // 2, dtype=torch.float32, device=device), 1.0

    init_fn.__name__ = f"hf_rope_ext_{method.name}_identity"
    init_fn.method = method
    return init_fn


def _validator(method: registry.RopeMethod):
    def validate(self, rope_parameters, ignore_keys=None):
        params = {k: v for k, v in rope_parameters.items() if k not in (ignore_keys or ())}
        registry.validate(params, self)

    validate.__name__ = f"_validate_{method.name}_rope_parameters"
    return validate


def init_function(method: registry.RopeMethod):
    """What ``ROPE_INIT_FUNCTIONS`` holds for ``method``."""
    return method.frequencies if method.kind == "frequency" else _identity_frequencies(method)


def install() -> None:
    """Register every method of the registry into transformers (safe to call any number of times)."""
    for method in registry.methods():
        existing = ROPE_INIT_FUNCTIONS.get(method.name)
        if existing is not None and getattr(existing, "method", method) is not method and existing is not method.frequencies:
            raise ValueError(f"transformers already has a rope_type {method.name!r}; hf_rope_ext will not replace it")
        ROPE_INIT_FUNCTIONS[method.name] = init_function(method)
        setattr(RotaryEmbeddingConfigMixin, f"_validate_{method.name}_rope_parameters", _validator(method))
