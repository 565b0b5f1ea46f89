"""Seam: transformers' weight-loading conversions. Installs a wrapper of ``get_model_conversion_mapping`` where
transformers looks it up (``conversion_mapping`` and ``modeling_utils``): it returns transformers' own list, plus,
only when the model's config records ``rope_layout="interleaved"`` and its family loads to half (Llama, Mistral,
Qwen2, Qwen3, StableLM, Phi-3), one converter per q/k tensor the model has (RoPE layout on load and save).

transformers' conversion registry (``register_checkpoint_conversion_mapping``) is keyed by model type or class name
only, so a mapping registered there would run for every checkpoint of a family, stock ones included, and show in
transformers' own tests (``test_reverse_loading_mapping``); it is never written. ``get_model_conversion_mapping`` is
called by ``from_pretrained`` once the model is built from the checkpoint's config, by ``save_pretrained`` for a
model not loaded from a checkpoint, and by peft. A model loaded from a checkpoint saves through
``model._weight_conversions`` (transformers' per-model record of the conversions it used on load);
``convert_layout`` updates that record through :func:`record_layout_conversions`, which :func:`install` hands to it
(``layout.model.on_convert``). :func:`uninstall` puts the stock function back.
"""

from __future__ import annotations

import functools

import torch
from transformers import conversion_mapping, modeling_utils
from transformers.core_model_loading import ConversionOps, WeightConverter

from ..layout import model as layout_model
from ..layout.permute import block_rows, permute_rows
from ..models import family_of, has_layout_facts


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


def install() -> None:
    """Wrap ``get_model_conversion_mapping`` where transformers looks it up (idempotent).

    The wrapper of another hf_rope_ext copy (a --remote-code export's vendored package) gives way to this one's,
    around the same stock function, as its ``ROPE_INIT_FUNCTIONS`` entries do.
    """
    for module in _CONVERSION_SITES:
        current = module.get_model_conversion_mapping
        if getattr(current, "hf_rope_ext_layout", None) is not layout_conversions:
            stock = getattr(current, "hf_rope_ext_stock", current)
            module.get_model_conversion_mapping = _with_layout_conversions(stock)
    layout_model.on_convert(record_layout_conversions)


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


def uninstall() -> None:
    """Put transformers' own ``get_model_conversion_mapping`` back where it is looked up."""
    layout_model.off_convert(record_layout_conversions)
    for module in _CONVERSION_SITES:
        module.get_model_conversion_mapping = getattr(
            module.get_model_conversion_mapping, "hf_rope_ext_stock", module.get_model_conversion_mapping
        )
