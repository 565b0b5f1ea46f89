"""The table of RoPE methods this package adds: name -> parameters, frequency function, kind.

A method is one module that declares a ``RopeMethod`` (``declare``) and registers it with :func:`register` when
imported, as peft's tuners register themselves (``register_peft_method``): this module imports no method module.
The package's own methods are the modules of ``frequencies`` and ``attention.methods``, which
``hf_rope_ext.load_methods`` imports; a user's module registers the same way. Everything else (transformers
registration, validation, the ``list`` command, the generic tests) reads this table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..util.did_you_mean import did_you_mean, typo_of
from .builtin import BUILTIN_CHECKS, BUILTIN_PARAMS, BUILTIN_SUMMARIES, BUILTIN_TYPES
from .declare import COMMON_KEYS, REQUIRED, CheckFn, FrequencyFn, FromLength, Param, RopeMethod

__all__ = [
    "BUILTIN_SUMMARIES",
    "BUILTIN_TYPES",
    "COMMON_KEYS",
    "REQUIRED",
    "CheckFn",
    "FrequencyFn",
    "FromLength",
    "Param",
    "RopeMethod",
    "RopeParameterError",
    "available_rope_types",
    "default_parameters",
    "example_parameters",
    "filled",
    "find",
    "get_method",
    "methods",
    "off_register",
    "on_register",
    "pretrained_length",
    "register",
    "type_spec",
    "validate",
]

# Keys every type of the package accepts besides its own.
PACKAGE_KEYS = {
    "original_max_position_embeddings": Param(
        default=None, kind="int", minimum=1, help="L0, the pretraining length (default max_position_embeddings)"
    )
}


def example_parameters(method: RopeMethod, factor: float = 2.0) -> dict:
    """A valid ``rope_parameters`` dict for ``method``: its example, else required keys filled from their specs."""
    params = dict(method.example)
    for key, spec in method.params.items():
        if spec.default is REQUIRED and key not in params:
            params[key] = factor if key == "factor" else max(spec.minimum or 1, 1)
    return {"rope_type": method.name, **params}


_METHODS: dict[str, RopeMethod] = {}
_ON_REGISTER: list[Callable[[RopeMethod], None]] = []  # run for each method registered after install


def register(method: RopeMethod) -> RopeMethod:
    """Add a method to the table; a second method under the same name is an error.

    After ``hf_rope_ext`` is imported, a new method also goes into transformers at once (``on_register``), so the
    table and ``ROPE_INIT_FUNCTIONS`` never disagree; if transformers refuses it, it is not added here either.
    """
    if method.name in _METHODS and _METHODS[method.name] is not method:
        raise ValueError(f"rope_type {method.name!r} is already registered by {_METHODS[method.name]!r}")
    if method.name not in _METHODS:
        for callback in _ON_REGISTER:
            callback(method)
    _METHODS[method.name] = method
    return method


def on_register(callback: Callable[[RopeMethod], None]) -> None:
    """Call ``callback(method)`` for every method registered from now on (once per callback)."""
    if callback not in _ON_REGISTER:
        _ON_REGISTER.append(callback)


def off_register(callback: Callable[[RopeMethod], None]) -> None:
    """Stop calling ``callback`` for methods registered from now on."""
    if callback in _ON_REGISTER:
        _ON_REGISTER.remove(callback)


def get_method(name: str) -> RopeMethod:
    if name not in _METHODS:
        raise KeyError(
            f"rope_type={name!r} is not a type of hf_rope_ext{did_you_mean(name, [*_METHODS, *BUILTIN_TYPES])}; "
            f"known: {sorted(_METHODS)} (transformers' own: {sorted(BUILTIN_TYPES)})"
        )
    return _METHODS[name]


def available_rope_types() -> list[str]:
    """Every rope_type this package adds, sorted."""
    return sorted(_METHODS)


def methods() -> list[RopeMethod]:
    return [_METHODS[n] for n in sorted(_METHODS)]


def find(name) -> RopeMethod | None:
    """The method registered as ``name`` so far, or None (without importing the method packages)."""
    return _METHODS.get(name)


def default_parameters(rope_type: str, pretrain: int, factor: float | None) -> dict:
    """What the method's ``defaults`` hook gives for s = ``factor`` x L0 = ``pretrain`` tokens: its own keys' values
    for ``extend`` and ``finetune``; {} for transformers' own types and a method without one (KeyError if unknown)."""
    if rope_type in BUILTIN_PARAMS:
        return {}
    method = get_method(rope_type)
    return {} if method.defaults is None else dict(method.defaults(pretrain, factor))


def follows_length(rope_type: str) -> bool:
    """Whether ``rope_type``'s frequencies depend on the sequence length read so far: a package type declared
    ``dynamic``, or one of transformers' own that it updates per length (``dynamic_rope_update``: a name holding
    "dynamic", and ``longrope``)."""
    method = find(rope_type)
    return method.dynamic if method is not None else "dynamic" in rope_type or rope_type == "longrope"


# ---------------------------------------------------------------------------------------------------------------
# validation


class RopeParameterError(KeyError, ValueError):
    """``rope_parameters`` holding a key or a value their rope_type does not take.

    A ValueError, as all bad input in this package; also a KeyError, which is what transformers' ``validate_rope``
    raises for parameters that do not fit a type, and what its own tests (``test_rope_validation``) expect of every
    entry of ``ROPE_INIT_FUNCTIONS``. A missing required key is a plain KeyError, as in transformers.
    """

    def __str__(self) -> str:  # KeyError would print the message quoted, as a key
        return str(self.args[0]) if self.args else ""


def validate(rope_parameters: dict, config: Any = None) -> None:
    """Check one flat ``rope_parameters`` dict of any type, the package's or transformers' own (the one place that
    does: ``rope_parameters_for``, the command and, for the package's types, ``from_pretrained`` call it); raise
    naming the key, the value and what is allowed.

    As transformers orders it: missing required keys first (KeyError), then keys the type does not take and values
    (:class:`RopeParameterError`), then a missing rope_theta (KeyError), then the type's cross-parameter checks.
    """
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type"))
    params, check = type_spec(rope_type)
    ignore = set(getattr(config, "ignore_keys_at_rope_validation", None) or ())
    given = {k: v for k, v in rope_parameters.items() if k not in ignore}
    _check_required(rope_type, params, given)
    allowed = {**COMMON_KEYS, **params}
    for key, value in given.items():
        if key not in allowed:
            names = sorted(k for k in allowed if k != "type")
            raise RopeParameterError(
                f"rope_parameters[{key!r}]={value!r} is not a parameter of rope_type={rope_type!r}"
                f"{did_you_mean(key, names)}; allowed keys: {names}"
            )
        if key not in ("rope_type", "type"):
            _check_value(rope_type, key, value, allowed[key])
    _check_theta(rope_type, given)
    if check is not None:  # it sees the defaults computed from L0 (``FromLength``) in force, where the config says L0
        method = find(rope_type)
        check(
            rope_parameters if method is None else filled(rope_parameters, method, config, computed_only=True), config
        )


def type_spec(rope_type: str) -> tuple[dict[str, Param], CheckFn | None]:
    """(parameters, cross-parameter check) of a rope type, transformers' own or the package's (KeyError if unknown).
    Every type of the package takes ``original_max_position_embeddings``: a saved extended model records L0 there."""
    if rope_type in BUILTIN_PARAMS:
        return BUILTIN_PARAMS[rope_type], BUILTIN_CHECKS.get(rope_type)
    method = get_method(rope_type)
    return {**method.params, **{k: v for k, v in PACKAGE_KEYS.items() if k not in method.params}}, method.check


def _check_required(rope_type: str, params: dict[str, Param], given: dict) -> None:
    unknown = [k for k in given if k not in params and k not in COMMON_KEYS]
    for key, spec in params.items():
        if spec.default is REQUIRED and given.get(key) is None:
            raise KeyError(
                f"rope_parameters[{key!r}] is required for rope_type={rope_type!r} "
                f"({spec.describe_allowed()}: {spec.help}){typo_of(key, unknown)}"
            )


def _check_theta(rope_type: str, given: dict) -> None:
    if given.get("rope_theta") is None:
        raise KeyError(
            f"rope_parameters['rope_theta'] is missing for rope_type={rope_type!r}: passing rope_parameters to "
            "from_pretrained replaces the saved dict, base included; build it with "
            "hf_rope_ext.rope_parameters_for(path, rope_type, ...) or add the checkpoint's rope_theta"
        )


def _check_value(rope_type: str, key: str, value: Any, spec: Param) -> None:
    if value is None and spec.default is not REQUIRED:
        return
    if spec.kind == "numbers":
        ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(_fits(v, spec) for v in value)
    else:
        ok = _fits(value, spec)
    if not ok:
        raise RopeParameterError(
            f"rope_parameters[{key!r}]={value!r} is invalid for rope_type={rope_type!r}: "
            f"expected {spec.describe_allowed()}"
        )


def _fits(value: Any, spec: Param) -> bool:
    """Whether one value has the spec's type and lies in its range (a list's items, for ``numbers``)."""
    if spec.kind == "bool":
        return isinstance(value, bool)
    if spec.kind == "choice":
        return isinstance(value, str) and value in spec.choices
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if spec.kind == "int" and not float(value).is_integer():
        return False
    too_low = spec.minimum is not None and value < spec.minimum
    return not too_low and not (spec.exclusive_minimum is not None and value <= spec.exclusive_minimum)


def pretrained_length(params: dict, config: Any) -> int | None:
    """L0: ``original_max_position_embeddings`` when given, else the config's ``max_position_embeddings`` (None
    without a config)."""
    found = params.get("original_max_position_embeddings") or getattr(config, "max_position_embeddings", None)
    return None if found is None else int(found)


def filled(rope_parameters: dict, method: RopeMethod, config: Any = None, *, computed_only: bool = False) -> dict:
    """``rope_parameters`` with ``method``'s defaults for keys absent or None (only those computed from L0 with
    ``computed_only``), in the method's order: one computed from L0 (:class:`FromLength`) sees the values before it
    and needs the ``config`` (or ``original_max_position_embeddings``); it stays None without them."""
    params, length = dict(rope_parameters), pretrained_length(rope_parameters, config)
    for key, spec in method.params.items():
        if params.get(key) is not None:
            continue
        if isinstance(spec.default, FromLength):
            params[key] = spec.default.rule(params, length) if length else None
        elif not computed_only:
            params[key] = spec.default
    return params
