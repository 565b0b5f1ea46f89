"""The one module that touches transformers' internals, through its extension points only.

- ``ROPE_INIT_FUNCTIONS[name]``: the frequency function of each of this package's rope types;
- ``RotaryEmbeddingConfigMixin._validate_<name>_rope_parameters``: validation when a config is built;
- ``get_model_conversion_mapping``: the RoPE layout converters, for models whose config says "interleaved";
- ``AttentionInterface``: the attention-level types;
- ``GenerationMixin._prepare_cache_for_generation``: for a model whose config names one of those types, the cache
  ``generate`` prepared (or was handed) keeps their rotated rows in its layers (``attention.cache_layers.adopt``);
  any other model gets the stock function's cache untouched.

``install()`` is idempotent and leaves every built-in entry untouched, so stock behaviour is unchanged
for models that do not name one of this package's types.
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch
from transformers import conversion_mapping, modeling_utils
from transformers.cache_utils import Cache
from transformers.core_model_loading import ConversionOps, WeightConverter
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin
from transformers.modeling_utils import AttentionInterface

from . import registry
from .attention.cache_layers import adopt
from .attention.function import attend_layer, check_module
from .attention.layer import attention_type_of, config_routes, resolve, routes_through_attention
from .configure import restore_legacy_theta
from .frequencies.common import rope_setup


def _identity_frequencies(method: registry.RopeMethod):
    """For attention-level types: zero frequencies, so q and k reach the attention function (and cache) unrotated."""

    def init_fn(config, device=None, seq_len=None, layer_type=None):
        dim = rope_setup(config, layer_type).dim
        return torch.zeros(dim // 2, dtype=torch.float32, device=device), 1.0

    return init_fn


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
    identity = _identity_frequencies(method)

    def compute(config, device=None, seq_len=None, layer_type=None):
        use = identity if routes_through_attention(method.name, config) else method.frequencies
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


def install() -> None:
    """Register every method of the registry into transformers (safe to call any number of times)."""
    for method in registry.methods():
        install_method(method)
    registry.on_register(install_method)  # methods registered later go in at once
    install_layout_conversions()  # RoPE layout on load/save (issue 3)
    install_attention_functions()  # attention-level rope types (issue 4)
    install_generation_cache()  # their rotated rows kept in generate's cache (issue 23)


# ---------------------------------------------------------------------------------------------------------------
# RoPE layout on load and save (issue 3; per model since issue 13, owner: hf_rope_ext/layout).
# transformers' conversion registry (``register_checkpoint_conversion_mapping``) is keyed by model type or class name
# only, so a mapping registered there runs for every checkpoint of a family, stock ones included, and shows in
# transformers' own tests (``test_reverse_loading_mapping``). transformers 5.23 has no per-config hook on load, so
# ``get_model_conversion_mapping`` (called by ``from_pretrained`` once the model is built from the checkpoint's
# config, by ``save_pretrained`` for a model not loaded from a checkpoint, and by peft) is wrapped: it returns
# transformers' own list, plus, only when the model's config records ``rope_layout="interleaved"`` and its family
# loads to half (Llama, Mistral, Qwen2, Qwen3, StableLM, Phi-3), one converter per q/k tensor the model has. The
# registry itself is never written. A model loaded from a checkpoint saves through ``model._weight_conversions``
# (transformers' per-model record of the conversions it used on load); ``convert_layout`` updates that record
# through :func:`record_layout_conversions`.


class RopeLayoutToHalf(ConversionOps):
    """One projection's rows: checkpoint layout -> half on load (``on_load``), half -> checkpoint layout on save."""

    def __init__(self, blocks: tuple[str, ...], on_load: bool = True):
        self.blocks = tuple(blocks)
        self.on_load = on_load

    def __repr__(self):
        return f"{type(self).__name__}(blocks={self.blocks}, on_load={self.on_load})"

    @torch.no_grad()
    def convert(self, input_dict, source_patterns, target_patterns, config=None, full_layer_name=None, **kwargs):
        (tensors,) = input_dict.values()
        tensor = tensors[0] if isinstance(tensors, list) else tensors
        return {target_patterns[0]: self.permute(tensor, config, full_layer_name or target_patterns[0])}

    def permute(self, tensor: torch.Tensor, config, key: str) -> torch.Tensor:
        """Read the layout at call time: a model converted back to half after loading saves half."""
        from .layout.permute import block_rows, permute_rows
        from .models import family_of

        config = _layout_config(config)
        family = family_of(config.model_type)
        stored = family.checkpoint_layout(config)
        if stored == "half":
            return tensor
        shape = family.head_shape(config)
        index = block_rows(self.blocks, shape, "half" if self.on_load else stored)
        return permute_rows(tensor, index, key, self.blocks, shape)

    @property
    def reverse_op(self) -> ConversionOps:
        return RopeLayoutToHalf(self.blocks, on_load=not self.on_load)


def _layout_config(config):
    """The config holding the family facts: the model's own, or the text config of a composite model."""
    found = _config_with_layout_facts(config)
    if found is None:
        raise ValueError(f"model_type={getattr(config, 'model_type', None)!r} has no RoPE layout facts")
    return found


def _config_with_layout_facts(config):
    """``config`` or its text config, whichever names a family with layout facts; None when neither does."""
    from .models import has_layout_facts

    if has_layout_facts(getattr(config, "model_type", None)):
        return config
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    return text if has_layout_facts(getattr(text, "model_type", None)) else None


def layout_converters(family, parameter_names=None) -> list[WeightConverter]:
    """One-to-one converters (same key in and out) for each q/k weight and bias of ``family`` that the model has.

    ``parameter_names`` (the model's parameter names) drops patterns that match none of them (a bias of a model
    built without biases); None keeps every pattern.
    """

    def present(suffix: str) -> bool:
        return parameter_names is None or any(n == suffix or n.endswith("." + suffix) for n in parameter_names)

    return [
        WeightConverter(f"{p.module}.{param}", f"{p.module}.{param}", operations=[RopeLayoutToHalf(p.blocks)])
        for p in family.projections
        for param in ("weight", "bias")
        if present(f"{p.module}.{param}")
    ]


def _text_model(model):
    """(path, module) of the first transformers model in ``model`` (itself first) of a family with layout facts."""
    from .models import has_layout_facts

    for path, module in model.named_modules():
        config = getattr(module, "config", None)
        if isinstance(module, modeling_utils.PreTrainedModel) and has_layout_facts(getattr(config, "model_type", None)):
            return path, module
    return None, None


def layout_conversions(model) -> list[WeightConverter]:
    """The layout converters ``model`` loads and saves through: none unless its config says "interleaved".

    In a composite model (a language model inside a vision-language one) they are scoped to the language model, as
    transformers scopes a sub-model's mapping, so another tower's ``q_proj`` is never touched.
    """
    from .models import family_of

    path, text_model = _text_model(model)
    if text_model is None:
        return []
    family = family_of(text_model.config.model_type)
    if not family.loads_to_half or family.checkpoint_layout(text_model.config) != "interleaved":
        return []
    converters = layout_converters(family, [name for name, _ in text_model.named_parameters()])
    if path:  # transformers' own scoping of a sub-model's transforms (conversion_mapping.get_model_conversion_mapping)
        for converter in converters:
            converter.scope_prefix = path.removeprefix(model.base_model_prefix).removeprefix(".")
            converter.base_model_prefix = model.base_model_prefix
    return converters


def _is_layout_conversion(transform) -> bool:
    return any(isinstance(op, RopeLayoutToHalf) for op in getattr(transform, "operations", ()))


def _with_layout_conversions(stock):
    @functools.wraps(stock)
    def get_model_conversion_mapping(model, *args, **kwargs):
        return list(stock(model, *args, **kwargs)) + layout_conversions(model)

    get_model_conversion_mapping.hf_rope_ext_stock = stock
    get_model_conversion_mapping.hf_rope_ext_layout = layout_conversions  # whose wrapper it is
    return get_model_conversion_mapping


_CONVERSION_SITES = (conversion_mapping, modeling_utils)  # the modules whose global name from_pretrained/save use


def install_layout_conversions() -> None:
    """Wrap ``get_model_conversion_mapping`` where transformers looks it up (idempotent).

    The wrapper of another hf_rope_ext copy (a --remote-code export's vendored package) gives way to this one's,
    around the same stock function, as its ``ROPE_INIT_FUNCTIONS`` entries do.
    """
    for module in _CONVERSION_SITES:
        current = module.get_model_conversion_mapping
        if getattr(current, "hf_rope_ext_layout", None) is not layout_conversions:
            stock = getattr(current, "hf_rope_ext_stock", current)
            module.get_model_conversion_mapping = _with_layout_conversions(stock)


def record_layout_conversions(model) -> None:
    """After ``model.config.rope_layout`` changed: make what ``save_pretrained`` applies follow it.

    Only a model loaded by ``from_pretrained`` carries a record (``_weight_conversions``); for any other model
    ``save_pretrained`` asks ``get_model_conversion_mapping``, which reads the config then.
    """
    recorded = getattr(model, "_weight_conversions", None)
    if recorded is not None:
        kept = [t for t in recorded if not _is_layout_conversion(t)]
        model._weight_conversions = kept + layout_conversions(model)


# ---------------------------------------------------------------------------------------------------------------
# Attention-level rope types (issue 4, owner: hf_rope_ext/attention). Extension point: ``AttentionInterface``.
# The functions registered under "eager" and "sdpa" send a module whose rope_type is one of the package's
# attention-level types to ``attention.attend``, which rotates and scores itself; any other module goes, with
# the same arguments, to the stock function: transformers' own sdpa function, or for "eager" the
# ``eager_attention_forward`` of the module's own modeling file (each family has its own). Every other
# implementation registered at install time (flash-attention, flex, paged) is wrapped so that these types raise
# a clear error instead of silently running without their score modification; other models pass straight through.

_SUPPORTED_ATTENTION = ("eager", "sdpa")
_FAMILY_EAGER: dict[type, object] = {}


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
        name = attention_type_of(module)
        if name is not None:
            check_module(module, name, implementation)  # raises: this implementation cannot apply the type
        return stock(module, *args, **kwargs)

    attention.hf_rope_ext_stock = stock
    attention.__name__ = f"hf_rope_ext_refusing_{implementation.replace('|', '_')}"
    return attention


_WRAPPED: set[str] = set()  # the implementations found at the first install; later registrations are the user's


def install_attention_functions() -> None:
    """Register the attention functions (idempotent: functions already ours are left as they are)."""
    mapping = AttentionInterface._global_mapping
    _WRAPPED.update(_WRAPPED or set(mapping) | set(_SUPPORTED_ATTENTION))
    for implementation in sorted(_WRAPPED):
        current = mapping.get(implementation)
        if current is not None and hasattr(current, "hf_rope_ext_stock"):
            continue
        wrap = _rope_attention if implementation in _SUPPORTED_ATTENTION else _refusing_attention
        AttentionInterface.register(implementation, wrap(implementation, current))


def stock_attention(implementation: str):
    """The function transformers had under ``implementation`` before install (None for "eager": per family)."""
    return getattr(AttentionInterface._global_mapping[implementation], "hf_rope_ext_stock", None)


# ---------------------------------------------------------------------------------------------------------------
# The cache ``generate`` uses (issue 23, owner: hf_rope_ext/attention/cache_layers.py). transformers chooses and
# builds it in ``GenerationMixin._prepare_cache_for_generation(generation_config, model_kwargs, ...)`` (the same
# signature in every admitted release), which writes it into ``model_kwargs`` under the name the model's forward
# takes (``past_key_values``, ``cache`` from 5.24). The wrapper calls the stock method and then, only for a model
# whose config names one of the package's types that rotate in the attention function, adopts every ``Cache`` it
# finds among those values, whatever their name: a DynamicCache, StaticCache or a user's own cache then keeps the
# rotated rows in its layers. Other models get exactly the stock result.


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


def install_generation_cache() -> None:
    """Wrap ``GenerationMixin._prepare_cache_for_generation`` once (idempotent; another copy's wrapper gives way)."""
    from transformers.generation.utils import GenerationMixin

    current = GenerationMixin._prepare_cache_for_generation
    if getattr(current, "hf_rope_ext_adopt", None) is adopt:
        return
    wrapped = _adopting(getattr(current, "hf_rope_ext_stock", current))
    wrapped.hf_rope_ext_adopt = adopt
    GenerationMixin._prepare_cache_for_generation = wrapped


def cache_keyword(model) -> str:
    """The keyword under which ``model``'s forward (and so ``generate``) takes a KV cache in the installed
    transformers: ``past_key_values`` up to 5.23, ``cache`` from 5.24 (the one place that knows both names)."""
    parameters = inspect.signature(model.forward).parameters
    found = [name for name in ("cache", "past_key_values") if name in parameters]
    if not found:
        raise ValueError(f"{type(model).__name__}.forward takes no KV cache (parameters: {list(parameters)})")
    return found[0]
