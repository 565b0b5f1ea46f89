"""What one key of ``rope_parameters`` may hold: its default, its type and its range (the registry's building block,
shared by the package's methods and the table of transformers' own types)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

REQUIRED = object()  # marker: a parameter without a default


@dataclass(frozen=True)
class Param:
    """One key of ``rope_parameters``: its default, its type and the range it must lie in."""

    default: Any = REQUIRED
    kind: Literal["number", "int", "bool", "numbers"] = "number"  # numbers: a list of numbers (longrope's factors)
    minimum: float | None = None  # inclusive lower bound
    exclusive_minimum: float | None = None  # strict lower bound
    help: str = ""

    def describe_allowed(self) -> str:
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
