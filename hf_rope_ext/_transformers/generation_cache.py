"""Seam: the cache ``generate`` uses. Installs a wrapper of ``GenerationMixin._prepare_cache_for_generation``
(transformers chooses and builds the cache there: ``(generation_config, model_kwargs, ...)``, the same signature
in every admitted release) that calls the stock method and then, only for a model whose config names one of the
package's types that rotate inside attention, adopts every ``Cache`` among the values it wrote into
``model_kwargs`` (under the name the model's forward takes: ``past_key_values``, ``cache`` from 5.24): a
DynamicCache, StaticCache or a user's own cache then keeps the rotated rows in its layers
(``cache_layers.adopt``). Other models get exactly the stock result. :func:`uninstall` puts the stock method back.
"""

from __future__ import annotations

import functools
import inspect

from transformers.cache_utils import Cache
from transformers.generation.utils import GenerationMixin

from ..attention.layer import config_routes
from .cache_layers import adopt


def _adopting(stock):
    @functools.wraps(stock)
    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        result = stock(self, generation_config, model_kwargs, *args, **kwargs)
        if config_routes(self.config):
            for value in list(model_kwargs.values()):
                if isinstance(value, Cache):
                    adopt(value)
        return result

    _prepare_cache_for_generation.hf_rope_ext_stock = stock
    return _prepare_cache_for_generation


def install() -> None:
    """Wrap ``GenerationMixin._prepare_cache_for_generation`` once (idempotent; another copy's wrapper gives way)."""
    current = GenerationMixin._prepare_cache_for_generation
    if getattr(current, "hf_rope_ext_adopt", None) is adopt:
        return
    wrapped = _adopting(getattr(current, "hf_rope_ext_stock", current))
    wrapped.hf_rope_ext_adopt = adopt
    GenerationMixin._prepare_cache_for_generation = wrapped


def uninstall() -> None:
    current = GenerationMixin._prepare_cache_for_generation
    GenerationMixin._prepare_cache_for_generation = getattr(current, "hf_rope_ext_stock", current)


def cache_keyword(model) -> str:
    """The keyword under which ``model``'s forward (and so ``generate``) takes a KV cache in the installed
    transformers: ``past_key_values`` up to 5.23, ``cache`` from 5.24 (the one place that knows both names)."""
    parameters = inspect.signature(model.forward).parameters
    found = [name for name in ("cache", "past_key_values") if name in parameters]
    if not found:
        raise ValueError(f"{type(model).__name__}.forward takes no KV cache (parameters: {list(parameters)})")
    return found[0]
