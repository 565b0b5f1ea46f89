"""The table of RoPE methods this package adds: name -> parameters, frequency function, kind.

A method is one module declaring a ``RopeMethod`` (``declare``) as its ``METHOD``, listed in its package's
``METHODS`` (``frequencies``, ``attention.methods``); this module registers them all when imported, and
:func:`register` adds others later. Everything else (transformers registration, validation, the ``list`` command,
the generic tests) reads this table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .attention.methods import METHODS as ATTENTION_METHODS
from .declare import COMMON_KEYS, REQUIRED, CheckFn, FrequencyFn, Param, RopeMethod
from .frequencies import METHODS as FREQUENCY_METHODS

__all__ = [
    "COMMON_KEYS",
    "REQUIRED",
    "CheckFn",
    "FrequencyFn",
    "Param",
    "RopeMethod",
    "RopeParameterError",
    "available_rope_types",
    "example_parameters",
    "filled",
    "find",
    "get_method",
    "methods",
    "off_register",
    "on_register",
    "param_value",
    "register",
    "validate",
]

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
            f"rope_type={name!r} is not a type of hf_rope_ext; known: {sorted(_METHODS)} "
            f"(transformers' own: {sorted(BUILTIN_TYPES)})"
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
    """Check one flat ``rope_parameters`` dict of this package's types; raise naming key, value and what is allowed.

    As transformers orders it: missing required keys first (KeyError), then keys the type does not take and values
    (:class:`RopeParameterError`), then a missing rope_theta (KeyError), then the method's cross-parameter checks.
    """
    rope_type = rope_parameters.get("rope_type", rope_parameters.get("type"))
    method = get_method(rope_type)
    ignore = set(getattr(config, "ignore_keys_at_rope_validation", None) or ())
    given = {k: v for k, v in rope_parameters.items() if k not in ignore}
    _check_required(rope_type, method, given)
    allowed = {**COMMON_KEYS, **method.params}
    for key, value in given.items():
        if key not in allowed:
            raise RopeParameterError(
                f"rope_parameters[{key!r}]={value!r} is not a parameter of rope_type={rope_type!r}; "
                f"allowed keys: {sorted(k for k in allowed if k != 'type')}"
            )
        if key not in ("rope_type", "type"):
            _check_value(rope_type, key, value, allowed[key])
    _check_theta(rope_type, given)
    if method.check is not None:
        method.check(rope_parameters, config)


def _check_required(rope_type: str, method: RopeMethod, given: dict) -> None:
    for key, spec in method.params.items():
        if spec.default is REQUIRED and given.get(key) is None:
            raise KeyError(
                f"rope_parameters[{key!r}] is required for rope_type={rope_type!r} "
                f"({spec.describe_allowed()}: {spec.help})"
            )


def _check_theta(rope_type: str, given: dict) -> None:
    if given.get("rope_theta") is None:
        raise KeyError(
            f"rope_parameters['rope_theta'] is missing for rope_type={rope_type!r}: passing rope_parameters to "
            "from_pretrained replaces the saved dict, base included; build it with "
            "hf_rope_ext.rope_parameters_for(path, rope_type, ...) or add the checkpoint's rope_theta"
        )


def _check_value(rope_type: str, key: str, value: Any, spec: Param) -> None:
    def fail() -> None:
        raise RopeParameterError(
            f"rope_parameters[{key!r}]={value!r} is invalid for rope_type={rope_type!r}: "
            f"expected {spec.describe_allowed()}"
        )

    if value is None and spec.default is not REQUIRED:
        return
    if spec.kind == "bool":
        if not isinstance(value, bool):
            fail()
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail()
    if spec.kind == "int" and not float(value).is_integer():
        fail()
    if spec.minimum is not None and value < spec.minimum:
        fail()
    if spec.exclusive_minimum is not None and value <= spec.exclusive_minimum:
        fail()


def param_value(rope_parameters: dict, method: RopeMethod, key: str) -> Any:
    """The value of ``key`` in ``rope_parameters``, or the method's default when it is absent or None."""
    value = rope_parameters.get(key)
    return method.params[key].default if value is None else value


def filled(rope_parameters: dict, method: RopeMethod) -> dict:
    """``rope_parameters`` with ``method``'s defaults for keys absent or None."""
    return {**rope_parameters, **{k: param_value(rope_parameters, method, k) for k in method.params}}


# ---------------------------------------------------------------------------------------------------------------
# transformers' own types, for the ``list`` table and for error messages (their code stays transformers')

BUILTIN_TYPES: dict[str, dict[str, Any]] = {
    "default": {},
    "linear": {"factor": REQUIRED},
    "dynamic": {"factor": REQUIRED},
    "yarn": {
        "factor": REQUIRED,
        "original_max_position_embeddings": "max_position_embeddings",
        "attention_factor": "0.1 ln(factor) + 1",
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": None,
        "mscale_all_dim": None,
        "truncate": True,
    },
    "longrope": {
        "short_factor": REQUIRED,
        "long_factor": REQUIRED,
        "original_max_position_embeddings": REQUIRED,
        "factor": None,
        "attention_factor": None,
    },
    "llama3": {
        "factor": REQUIRED,
        "original_max_position_embeddings": REQUIRED,
        "low_freq_factor": REQUIRED,
        "high_freq_factor": REQUIRED,
    },
}

BUILTIN_TYPES["proportional"] = {"partial_rotary_factor": 1.0}  # transformers 5.23 (Gemma 4)

BUILTIN_SUMMARIES = {
    "proportional": "default frequencies over the whole head_dim, the last 1 - partial_rotary_factor of them zero",
    "default": "plain RoPE, theta_i = b^(-2i/d)",
    "linear": "position interpolation: theta_i / s",
    "dynamic": "dynamic NTK: base grows with seq_len beyond max_position_embeddings",
    "yarn": "NTK-by-parts frequencies and attention factor 0.1 ln(s) + 1",
    "longrope": "per-pair rescale factors, short and long sets switched at L0",
    "llama3": "Llama 3.1 three-band schedule",
}


for _method in (*FREQUENCY_METHODS, *ATTENTION_METHODS):  # the package's own methods, declared in their modules
    register(_method)
