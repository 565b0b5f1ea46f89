"""``convert_layout``: the public entry point, for state dicts, transformers models and peft models.

What "layout" means for a live model depends on the family (see :class:`hf_rope_ext.models.Family`):
- Llama, Mistral, Qwen2, Qwen3, StableLM, Phi-3 (``loads_to_half``): ``config.rope_layout`` is the layout of
  the *saved* weights. ``from_pretrained`` permutes q/k rows to half on load and ``save_pretrained`` back on
  save, so the model in memory (``model.state_dict()``, peft adapters trained on it) is always half. Converting
  such a model only changes ``config.rope_layout``, i.e. what ``save_pretrained`` writes; its tensors and
  logits stay as they are.
- RoFormer: the model in memory holds the layout its config records; converting permutes its q/k tensors
  (and lora_B rows of a peft model) in place.

What ``save_pretrained`` writes for a loaded model is transformers' record of its weight conversions; the seam that
keeps it (``_transformers.conversions``) asks to hear of every conversion (:func:`on_convert`), so this module
imports nothing of transformers' internals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..models import check_layout, family_of
from .keys import projection_of
from .permute import block_rows, permute_rows
from .state_dict import check_direction, convert_tensors

_ON_CONVERT: list[Callable] = []  # called with each converted model whose family loads to half


def on_convert(callback: Callable) -> None:
    """Call ``callback(model)`` after each conversion of a model whose family loads to half (once per callback)."""
    if callback not in _ON_CONVERT:
        _ON_CONVERT.append(callback)


def off_convert(callback: Callable) -> None:
    if callback in _ON_CONVERT:
        _ON_CONVERT.remove(callback)


def convert_layout(model_or_state_dict, to: str = "half", config=None, *, source: str | None = None):
    """Convert a model, peft model or state dict to the RoPE layout ``to`` ("half" or "interleaved").

    A state dict needs ``config`` (model_type, head counts, partial rotary); it is taken to be in the layout
    ``config`` records (``source=`` overrides) and a new dict is returned; ``config`` is not changed. A model
    carries its config: ``config.rope_layout`` is set to ``to`` and the model itself is returned.
    """
    check_layout(to, "to")
    if isinstance(model_or_state_dict, Mapping):
        return _convert_state_dict(model_or_state_dict, to, config, source)
    if isinstance(model_or_state_dict, torch.nn.Module):
        if source is not None:
            raise ValueError(f"source={source!r} is for state dicts only; a model's config records its layout")
        return _convert_model(model_or_state_dict, to, config)
    raise ValueError(
        f"convert_layout takes a model or a state dict, got {type(model_or_state_dict).__name__}; "
        "allowed: torch.nn.Module (transformers or peft model) or a mapping of tensor names to tensors"
    )


def _convert_state_dict(state_dict, to: str, config, source: str | None) -> dict:
    if config is None:
        raise ValueError("config=None: converting a state dict needs its model's config (model_type, head counts)")
    family = family_of(getattr(config, "model_type", None))
    source = source or family.checkpoint_layout(config)
    return convert_tensors(state_dict, family, family.head_shape(config), source, to)[0]


def _convert_model(model: torch.nn.Module, to: str, config) -> torch.nn.Module:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if config is not None and config is not base.config:
        raise ValueError("config= is for state dicts; a model is converted with its own config (leave config=None)")
    config = base.config
    family = family_of(getattr(config, "model_type", None))
    check_direction(family.checkpoint_layout(config), to, f"this {config.model_type} model")
    # loads_to_half: tensors stay half in memory (only checked); only what save_pretrained writes changes
    _permute_parameters(model, family, config, to, check_only=family.loads_to_half)
    config.rope_layout = to
    if family.loads_to_half:
        for callback in _ON_CONVERT:  # the seam: what save_pretrained applies follows the new layout
            callback(base)
    return model


@torch.no_grad()
def _permute_parameters(model: torch.nn.Module, family, config, to: str, check_only: bool) -> list[str]:
    """Permute (or only shape-check) every q/k row tensor of ``model`` in place; returns the names."""
    shape = family.head_shape(config)
    index = {p: block_rows(p.blocks, shape, to) for p in family.projections}
    moved = []
    tensors = dict(model.named_parameters())  # tied tensors once, so none is permuted twice
    tensors.update(model.named_buffers())
    for name, tensor in tensors.items():
        projection = projection_of(name, family)
        if projection is None:
            continue
        permuted = permute_rows(tensor, index[projection], name, projection.blocks, shape)
        if not check_only:
            tensor.copy_(permuted)
        moved.append(name)
    return moved
