"""Seam: transformers' rope registry. Installs, for each method of the package's registry:

- ``ROPE_INIT_FUNCTIONS[name]``: its frequency function, validated each time the rotary module asks for
  frequencies; for a type that rotates inside attention (``attention.layer.routes_through_attention``) zero
  frequencies instead, so queries and keys reach the attention function, and the cache, unrotated;
- ``RotaryEmbeddingConfigMixin._validate_<name>_rope_parameters``: validation when a config is built.

Built-in entries are never replaced (a name transformers has is refused). Undone by :func:`uninstall`, which removes
exactly these entries and validators (methods registered later stop going in).
"""

from __future__ import annotations

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin

from ..attention.layer import routes_through_attention
from ..frequencies.common import rope_setup
from ..types import registry
from ..types.rope_parameters import restore_legacy_theta


def _identity_frequencies(config, device=None, seq_len=None, layer_type=None):
    """Zero frequencies: q and k reach the attention function (and cache) unrotated."""
    dim = rope_setup(config, layer_type).dim
    return torch.zeros(dim // 2, dtype=torch.float32, device=device), 1.0


def _validator(method: registry.RopeMethod):
    def validate(self, rope_parameters, ignore_keys=None):
        params = {k: v for k, v in rope_parameters.items() if k not in (ignore_keys or ())}
        registry.validate(params, self)

    validate.__name__ = f"_validate_{method.name}_rope_parameters"
    return validate


def _validated(method: registry.RopeMethod, compute):
    """Validate the parameters each time the rotary module asks for frequencies.

    Configs validate on construction, but ``from_pretrained(path, rope_parameters=...)`` sets the attribute after
    the config was built; checking here makes bad input fail when the model is built, before any forward pass.
    A legacy ``rope_scaling=`` given to ``from_pretrained`` gets the checkpoint's rope_theta first.
    """

    def init_fn(config, device=None, seq_len=None, layer_type=None):
        params = config.rope_parameters[layer_type] if layer_type is not None else config.rope_parameters
        restore_legacy_theta(config, params, layer_type)
        ignore = set(getattr(config, "ignore_keys_at_rope_validation", None) or ())
        registry.validate({k: v for k, v in params.items() if k not in ignore}, config)
        return compute(config, device=device, seq_len=seq_len, layer_type=layer_type)

    init_fn.__name__ = f"hf_rope_ext_{method.name}"
    init_fn.method = method
    return init_fn


def _routed(method: registry.RopeMethod):
    """Identity where the attention function rotates for this type and config, the real frequencies elsewhere."""

    def compute(config, device=None, seq_len=None, layer_type=None):
        use = _identity_frequencies if routes_through_attention(method.name, config) else method.frequencies
        return use(config, device=device, seq_len=seq_len, layer_type=layer_type)

    return compute


def init_function(method: registry.RopeMethod):
    """What ``ROPE_INIT_FUNCTIONS`` holds for ``method``: validated frequencies, or the identity (see ``_routed``)."""
    compute = method.frequencies if method.kind == "frequency" and not method.dynamic else _routed(method)
    return _validated(method, compute)


def install_method(method: registry.RopeMethod) -> None:
    """Put ``method`` into ``ROPE_INIT_FUNCTIONS`` (validated) and its validator on the config mixin."""
    existing = ROPE_INIT_FUNCTIONS.get(method.name)
    # an entry of another hf_rope_ext copy (a --remote-code export's vendored package) gives way to this one
    if existing is not None and getattr(existing, "method", None) is None:
        raise ValueError(f"transformers already has a rope_type {method.name!r}; hf_rope_ext will not replace it")
    ROPE_INIT_FUNCTIONS[method.name] = init_function(method)
    setattr(RotaryEmbeddingConfigMixin, f"_validate_{method.name}_rope_parameters", _validator(method))


def install() -> None:
    for method in registry.methods():
        install_method(method)
    registry.on_register(install_method)  # methods registered later go in at once


def uninstall() -> None:
    """Remove every entry and validator of this package (of any hf_rope_ext copy) from transformers."""
    registry.off_register(install_method)
    for name, function in list(ROPE_INIT_FUNCTIONS.items()):
        if getattr(function, "method", None) is None:
            continue
        del ROPE_INIT_FUNCTIONS[name]
        if f"_validate_{name}_rope_parameters" in vars(RotaryEmbeddingConfigMixin):
            delattr(RotaryEmbeddingConfigMixin, f"_validate_{name}_rope_parameters")


def rope_types() -> list[tuple[str, registry.RopeMethod | None]]:
    """Every rope_type transformers resolves ("default", then ``ROPE_INIT_FUNCTIONS`` in its order), each with this
    package's method, or None for transformers' own. Raises if an entry of ours disagrees with the registry."""
    found = [("default", None)]
    for name, function in ROPE_INIT_FUNCTIONS.items():
        method = getattr(function, "method", None)
        if method is not None and (
            registry.get_method(name) is not method
            or getattr(RotaryEmbeddingConfigMixin, f"_validate_{name}_rope_parameters", None) is None
        ):
            raise RuntimeError(
                f"ROPE_INIT_FUNCTIONS[{name!r}] is not this hf_rope_ext's entry; import hf_rope_ext again"
            )
        found.append((name, method))
    missing = sorted(set(registry.available_rope_types()) - {name for name, _ in found})
    if missing:
        raise RuntimeError(f"registered rope types missing from ROPE_INIT_FUNCTIONS: {missing}")
    return found
