"""Which state-dict keys hold rotated rows: a family projection followed by a row-carrying parameter name.

Matched parameter names (peft included): ``weight``, ``bias``, ``base_layer.weight|bias``,
``lora_B[.<adapter>].weight|bias``, ``lora_magnitude_vector[.<adapter>][.weight]`` (DoRA).
``lora_A`` is never matched: its rows are the rank, its columns the input.
"""

from __future__ import annotations

import re
from functools import cache

from ..models import Family, Projection

ROW_PARAMS = (
    r"(?:base_layer\.)?(?:weight|bias)"
    r"|lora_B(?:\.[^.]+)?\.(?:weight|bias)"
    r"|lora_magnitude_vector(?:\.[^.]+)?(?:\.weight)?"
)


@cache
def _pattern(module: str) -> re.Pattern:
    return re.compile(rf"(?:^|\.){re.escape(module)}\.(?:{ROW_PARAMS})$")


def projection_of(key: str, family: Family) -> Projection | None:
    """The projection whose output rows ``key`` holds, or None for every other key."""
    return next((p for p in family.projections if _pattern(p.module).search(key)), None)
