"""LoRA layers that pass their half-precision input to the adapter as it is, instead of an fp32 copy of it.

peft's LoRA ``Linear.forward`` runs ``x = self._cast_input_dtype(x, lora_A.weight.dtype)`` before
``lora_B(lora_A(dropout(x)))``. With a bf16 base and fp32 adapter weights (``autocast_adapter_dtype``) under a bf16
autocast, that makes an fp32 copy of ``x`` (4 bytes an element) which autocast at once casts back to bf16 for the
matmul: a second, bf16 copy, which ``lora_A`` keeps for its weight's grad, per adapter and layer (q, k and v read the
same ``x``: three copies). Without the cast, ``lora_A`` gets ``x`` itself, which the base layer keeps anyway. The
results are the same bits: bf16 -> fp32 -> bf16 is exact, and the grad that flows back through the two casts is
cast fp32 -> bf16 of a bf16 value. (Without autocast the bf16 ``x`` meets an fp32 weight and the matmul raises: this is
for autocast runs. With LoRA dropout the mask is drawn on a bf16 instead of an fp32 tensor: same law, other bits.)

peft's own switch is the ``cast_input_dtype_enabled`` attribute of each ``BaseTunerLayer``, which
``BaseTunerLayer._cast_input_dtype`` reads and ``peft.helpers.disable_input_dtype_casting`` (a context manager) sets
to False on every tuner layer and back. :func:`keep_adapter_input_dtype` sets the same attribute the same way, and
returns the function that puts the values back: not the context manager held open, since a restore function the
caller drops would then close it and undo the change unseen. The switch came with peft 0.15.0 (0.14 lacks it); the
oldest peft this package admits, 0.17, has it.
"""

from __future__ import annotations

from collections.abc import Callable

PEFT_NEEDED = "0.15.0"  # the first peft with cast_input_dtype_enabled and disable_input_dtype_casting
SWITCH = "cast_input_dtype_enabled"
_ABSENT = object()  # a layer with no value of its own (BaseTunerLayer._cast_input_dtype reads True then)


def _check_peft_has_switch() -> None:
    """peft's helper is the mark of the switch: a peft without it raises ValueError naming both versions."""
    import peft
    import peft.helpers

    if not hasattr(peft.helpers, "disable_input_dtype_casting"):
        raise ValueError(
            f"peft=={peft.__version__} has no input dtype casting switch ({SWITCH}); allowed: peft>={PEFT_NEEDED}"
        )


def _tuner_layers(model) -> dict:
    """Every peft tuner layer of ``model`` by name, as ``disable_input_dtype_casting`` walks them."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = {name: module for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)}
    if not layers:
        raise ValueError(
            f"model={type(model).__name__} has no peft tuner layer; allowed: a model wrapped by get_peft_model"
        )
    return layers


def keep_adapter_input_dtype(model) -> Callable[[], None]:
    """Stops peft's cast of each adapter's input to the adapter weight's dtype on every tuner layer of ``model``;
    returns the function that puts back what it found (peft's default, True, unless changed before; a layer that
    had no value of its own loses the one set here)."""
    _check_peft_has_switch()
    layers = _tuner_layers(model)
    found = {name: layer.__dict__.get(SWITCH, _ABSENT) for name, layer in layers.items()}
    for layer in layers.values():
        setattr(layer, SWITCH, False)

    def restore() -> None:
        for name, layer in layers.items():
            if found[name] is _ABSENT:
                layer.__dict__.pop(SWITCH, None)
            else:
                setattr(layer, SWITCH, found[name])

    return restore
