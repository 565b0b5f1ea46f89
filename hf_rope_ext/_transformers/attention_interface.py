"""Seam: transformers' ``AttentionInterface``. Installs, under every implementation registered at the first install:

- ``"eager"``, ``"sdpa"``, ``"flex_attention"`` and the flash-attention ones (``function.IMPLEMENTATIONS``, those
  transformers has): a function that sends a module whose rope request names one of the package's types that
  rotate inside attention (``attention.layer.resolve``) to ``attention.function.attend_layer``, and any other
  module, with the same arguments, to the stock function (transformers' own, or for ``"eager"`` the
  ``eager_attention_forward`` of the module's own modeling file: each family has its own); a module marked for
  sequence parallelism (``attention.ulysses``) goes through the all-to-all around that choice first;
- every other implementation registered then (``"paged|eager"``): a wrapper raising a clear error for those
  types, instead of running without their score modification; other modules pass straight through. One
  registered later (a kernel from the Hub, the user's own) is left as it is.
Each function keeps the one it wraps as ``hf_rope_ext_stock``; :func:`uninstall` registers those back.
"""

from __future__ import annotations

import sys

from transformers.modeling_utils import AttentionInterface

from ..attention.function import IMPLEMENTATIONS, attend_layer, check_module
from ..attention.layer import resolve
from ..attention.ulysses import sequence_group, ulysses_attention

_FAMILY_EAGER: dict[type, object] = {}
_WRAPPED: set[str] = set()  # the implementations found at the first install; later registrations are the user's


def _family_eager(module):
    """The ``eager_attention_forward`` of the modeling file defining ``module``'s class (or a base class)."""
    cls = type(module)
    if cls not in _FAMILY_EAGER:
        found = (getattr(sys.modules.get(c.__module__), "eager_attention_forward", None) for c in cls.__mro__)
        function = next((f for f in found if f is not None), None)
        if function is None:
            raise RuntimeError(f"{cls.__module__} defines no eager_attention_forward for {cls.__name__}")
        _FAMILY_EAGER[cls] = function
    return _FAMILY_EAGER[cls]


def _rope_attention(implementation: str, stock):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        if sequence_group(module) is not None:  # sequence parallelism asked for this model: the whole row, heads/N
            return ulysses_attention(routed, implementation, module, query, key, value, attention_mask, *args, **kwargs)
        return routed(module, query, key, value, attention_mask, *args, **kwargs)

    def routed(module, query, key, value, attention_mask, *args, **kwargs):
        layer = resolve(module)
        if layer is None:
            function = stock if stock is not None else _family_eager(module)
            return function(module, query, key, value, attention_mask, *args, **kwargs)
        return attend_layer(layer, implementation, module, query, key, value, attention_mask, *args, **kwargs)

    attention.hf_rope_ext_stock = stock
    attention.__name__ = f"hf_rope_ext_{implementation.replace('|', '_')}_attention"
    return attention


def _refusing_attention(implementation: str, stock):
    def attention(module, *args, **kwargs):
        layer = resolve(module)
        if layer is not None:
            check_module(module, layer.name, implementation)  # raises: this implementation cannot apply the type
        return stock(module, *args, **kwargs)

    attention.hf_rope_ext_stock = stock
    attention.__name__ = f"hf_rope_ext_refusing_{implementation.replace('|', '_')}"
    return attention


def install() -> None:
    """Register the attention functions (idempotent: functions already ours are left as they are)."""
    mapping = AttentionInterface._global_mapping
    _WRAPPED.update(_WRAPPED or set(mapping) | {"eager"})  # flash_attention_4 & co. only where transformers has them
    for implementation in sorted(_WRAPPED):
        current = mapping.get(implementation)
        if current is not None and hasattr(current, "hf_rope_ext_stock"):
            continue
        wrap = _rope_attention if implementation in IMPLEMENTATIONS else _refusing_attention
        AttentionInterface.register(implementation, wrap(implementation, current))


def uninstall() -> None:
    """Put back what each wrapper wraps ("eager" had no global entry: it is removed again)."""
    mapping = AttentionInterface._global_mapping
    for implementation, current in list(mapping.items()):
        if not hasattr(current, "hf_rope_ext_stock"):
            continue
        if current.hf_rope_ext_stock is None:
            del mapping[implementation]
        else:
            AttentionInterface.register(implementation, current.hf_rope_ext_stock)


def stock_attention(implementation: str):
    """The function transformers had under ``implementation`` before install (None for "eager": per family)."""
    return getattr(AttentionInterface._global_mapping[implementation], "hf_rope_ext_stock", None)
