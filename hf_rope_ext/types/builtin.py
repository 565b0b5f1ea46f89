"""transformers' own rope types, as the package validates them (``registry.validate``) and lists them (``list``).

Their code stays transformers': only what each key may hold is written down here, with the ranges and relations
transformers' own validators warn about (a warning there, an error from ``rope_parameters_for`` and the command).
"""

from __future__ import annotations

from typing import Any

from .declare import REQUIRED, Param, require_greater

FACTOR = Param(minimum=1.0, help="context extension factor s")
L0 = Param(default=REQUIRED, kind="int", minimum=1, help="L0, the pretraining length")
POSITIVE = Param(default=REQUIRED, exclusive_minimum=0)

BUILTIN_PARAMS: dict[str, dict[str, Param]] = {
    "default": {},
    "linear": {"factor": FACTOR},
    "dynamic": {"factor": FACTOR},
    "yarn": {
        "factor": FACTOR,
        "original_max_position_embeddings": Param(default="max_position_embeddings", kind="int", minimum=1),
        "attention_factor": Param(default="0.1 ln(factor) + 1", exclusive_minimum=0),
        "beta_fast": Param(default=32, exclusive_minimum=0),
        "beta_slow": Param(default=1, exclusive_minimum=0),
        "mscale": Param(default=None, exclusive_minimum=0),
        "mscale_all_dim": Param(default=None, minimum=0),
        "truncate": Param(default=True, kind="bool"),
    },
    "longrope": {
        "short_factor": Param(kind="numbers"),
        "long_factor": Param(kind="numbers"),
        "original_max_position_embeddings": L0,
        "factor": Param(default=None, exclusive_minimum=0),
        "attention_factor": Param(default=None, exclusive_minimum=0),
    },
    "llama3": {
        "factor": FACTOR,
        "original_max_position_embeddings": L0,
        "low_freq_factor": POSITIVE,
        "high_freq_factor": POSITIVE,
    },
    "proportional": {"partial_rotary_factor": Param(default=1.0, exclusive_minimum=0)},  # transformers 5.23 (Gemma 4)
}


def _check_yarn(params: dict, config: Any) -> None:
    require_greater(params, "beta_fast", "beta_slow", 32, 1)


def _check_llama3(params: dict, config: Any) -> None:
    require_greater(params, "high_freq_factor", "low_freq_factor", 0, 0)


BUILTIN_CHECKS = {"yarn": _check_yarn, "llama3": _check_llama3}

# name -> {key: default} (REQUIRED for a key without one), for the ``list`` table and accepted keys
BUILTIN_TYPES: dict[str, dict[str, Any]] = {
    name: {key: spec.default for key, spec in params.items()} for name, params in BUILTIN_PARAMS.items()
}

BUILTIN_SUMMARIES = {
    "proportional": "default frequencies over the whole head_dim, the last 1 - partial_rotary_factor of them zero",
    "default": "plain RoPE, theta_i = b^(-2i/d)",
    "linear": "position interpolation: theta_i / s",
    "dynamic": "dynamic NTK: base grows with seq_len beyond max_position_embeddings",
    "yarn": "NTK-by-parts frequencies and attention factor 0.1 ln(s) + 1",
    "longrope": "per-pair rescale factors, short and long sets switched at L0",
    "llama3": "Llama 3.1 three-band schedule",
}
