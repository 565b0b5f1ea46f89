"""What a rope method declares, as plain data (no torch): its parameters (:class:`Param`, also the building block of
the table of transformers' own types in ``builtin_types``) and the method itself (:class:`RopeMethod`). The method
modules (``frequencies/``, ``attention/methods/``) build one ``RopeMethod`` each; ``registry`` collects them into the
table everything else reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

REQUIRED = object()  # marker: a parameter without a default


@dataclass(frozen=True)
class FromLength:
    """A default known once the model is: ``rule(params, L0)`` of the pretrained length L0 and the values in force of
    the keys declared before it (STRING's shift L0/3); ``text`` says how (``hf-rope-ext list`` shows it)."""

    rule: Callable[[dict, int], Any]
    text: str


@dataclass(frozen=True)
class Param:
    """One key of ``rope_parameters``: its default, its type and the range it must lie in."""

    default: Any = REQUIRED
    kind: Literal["number", "int", "bool", "numbers", "choice"] = "number"  # numbers: a list (longrope's factors)
    minimum: float | None = None  # inclusive lower bound
    exclusive_minimum: float | None = None  # strict lower bound
    help: str = ""
    choices: tuple[str, ...] = ()  # kind "choice": the strings allowed

    def describe_allowed(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        what = {"number": "a number", "int": "an integer", "bool": "true or false", "numbers": "a list of numbers"}
        text = what[self.kind]
        if self.minimum is not None:
            text += f" >= {self.minimum:g}"
        if self.exclusive_minimum is not None:
            text += f" > {self.exclusive_minimum:g}"
        return text


def require_greater(params: dict, high_key: str, low_key: str, high_default: float, low_default: float) -> None:
    """Raise unless ``params[high_key]`` > ``params[low_key]`` (defaults filled in)."""
    high = params.get(high_key)
    low = params.get(low_key)
    high = high_default if high is None else high
    low = low_default if low is None else low
    if not high > low:
        raise ValueError(
            f"rope_parameters[{high_key!r}]={high!r} must be greater than rope_parameters[{low_key!r}]={low!r}"
        )


# Keys every method accepts besides its own (transformers fills some of them in itself).
COMMON_KEYS = {
    "rope_type": Param(default="default", help="the method's name"),
    "type": Param(default=None, help="legacy spelling of rope_type"),
    "rope_theta": Param(default=10000.0, exclusive_minimum=0, help="RoPE base b"),
    "partial_rotary_factor": Param(default=1.0, exclusive_minimum=0, help="fraction of head_dim rotated"),
}

# Signature shared with transformers' ROPE_INIT_FUNCTIONS.
FrequencyFn = Callable[..., tuple["Any", float]]  # (config, device=None, seq_len=None, layer_type=None)
CheckFn = Callable[[dict, Any], None]  # (rope_parameters, config) -> raises ValueError
DefaultsFn = Callable[[int, "float | None"], dict]  # (L0, target factor s or None) -> values for the method's keys


@dataclass(frozen=True)
class RopeMethod:
    name: str
    kind: Literal["frequency", "attention"]
    frequencies: FrequencyFn  # the real inv_freq and attention factor of the method
    params: dict[str, Param] = field(default_factory=dict)
    summary: str = ""
    dynamic: bool = False  # frequencies depend on the sequence length
    check: CheckFn | None = None  # cross-parameter checks beyond the per-key ones
    families: tuple[str, ...] | None = None  # model_type values supported; None means every rope-registry family
    training_free: bool = True  # meaningful on a model pretrained with plain RoPE (False: xPos, RoPER need training)
    example: dict = field(default_factory=dict)  # valid parameters besides rope_type, for docs and generic tests
    attention: Any = None  # attention-level types: their declaration (attention.methods.form.AttentionForm)
    # values for the method's own keys that fit s x L0 tokens into the distances the model was pretrained on: what
    # ``extend`` evaluates the method with and ``finetune`` trains it under, below the user's values (None: none;
    # a frequency-level type's ``factor`` is set by the caller)
    defaults: DefaultsFn | None = None
    # a dynamic type's frequencies from a length held on the device (a 0-d tensor), nothing read back: what a call
    # traced by torch.compile rotates by; (config, device, length, layer_type) -> (inv_freq, attention factor as a
    # number or a 0-d tensor). None: the type reads its length back (a graph break under torch.compile)
    traced_frequencies: FrequencyFn | None = None
