"""Seam: the checkpoint function of a model's checkpointed layers. Installs nothing globally: a per-instance change
of a live model, undone by the function it returns.

transformers (5.17 to 5.25) checkpoints each ``GradientCheckpointingLayer`` by calling the layer's
``_gradient_checkpointing_func(forward, *args)`` (the documented way to give a layer its checkpointing function),
which ``gradient_checkpointing_enable`` / ``activation_checkpointing_enable`` set to ``torch.utils.checkpoint`` with
the caller's keyword arguments. :func:`wrap_checkpoint_function` wraps that function on every layer that checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers.modeling_layers import GradientCheckpointingLayer


def checkpointed_layers(model) -> list:
    """The layers of ``model`` (a transformers model, or a wrapper such as peft's whose ``modules()`` reach it) that
    checkpoint their forward, in the order the model holds them."""
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def wrap_checkpoint_function(model, wrap: Callable[[Callable], Callable]) -> Callable[[], None]:
    """Replace each checkpointing layer's function ``f`` by ``wrap(f)``; returns the function that puts every ``f``
    back. ValueError when no layer checkpoints (activation checkpointing is off)."""
    layers = checkpointed_layers(model)
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no layer with activation checkpointing on; enable it first "
            "(finetune: --grad-checkpointing)"
        )
    saved = [layer.__dict__.get("_gradient_checkpointing_func") for layer in layers]
    for layer in layers:
        layer._gradient_checkpointing_func = wrap(layer._gradient_checkpointing_func)

    def restore() -> None:
        for layer, func in zip(layers, saved, strict=True):
            if func is None:
                del layer._gradient_checkpointing_func
            else:
                layer._gradient_checkpointing_func = func

    return restore
