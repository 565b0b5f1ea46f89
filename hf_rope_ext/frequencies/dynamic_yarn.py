"""``dynamic_yarn``: YaRN whose factor is max(1, seq_len / L0), recomputed as the sequence grows.

Up to L0 it is the unscaled model. The name contains "dynamic", so transformers' ``dynamic_rope_update``
calls this function again with the current length whenever the sequence grows past the cached one.

Paper: Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models", arXiv 2309.00071
(section 3.3, Dynamic Scaling, applied to YaRN: "Dynamic-YaRN"). Checked against jquesnelle/yarn
``scaled_rope/LlamaDynamicYaRNScaledRotaryEmbedding.py`` (``yarn(seq_len / original_max_position_embeddings)`` once
the sequence outgrows the cache, cos and sin times 0.1 ln s + 1); the tests compare each length with transformers'
``yarn`` type (``_compute_yarn_parameters``) at s = seq_len / L0, bit for bit.
"""

import math

from ..models import DYNAMIC_FAMILIES, check_dynamic_family
from ..types.declare import REQUIRED, Param, RopeMethod
from ..types.registry import register
from .common import as_float, rope_setup
from .ntk_by_parts import by_parts_inv_freq, check_betas
from .params import BETA_FAST, BETA_SLOW, TRUNCATE

# Required, as transformers requires it of llama3 and longrope: L0 is what the factor divides by, and a default
# taken from max_position_embeddings would silently follow a config whose max_position_embeddings was raised.
ORIGINAL_MAX_REQUIRED = Param(
    default=REQUIRED, kind="int", minimum=1, help="L0, the pretraining length: the factor is max(1, seq_len / L0)"
)


def yarn_attention_factor(factor: float) -> float:
    """YaRN's sqrt(1/t) = 0.1 ln(s) + 1 (1 for s <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def dynamic_factor(seq_len, original_max: int, max_position_embeddings: int) -> float:
    """s = max(1, seq_len / L0); at construction (no seq_len) the module's cached length is used."""
    length = as_float(seq_len) or float(max_position_embeddings)
    return max(1.0, length / original_max)


def yarn_at(setup, factor, device):
    """YaRN's inv_freq [d/2] at ``factor`` (a number, or a 0-d tensor on the device: the same arithmetic)."""
    p = setup.params
    beta_fast, beta_slow = float(p.get("beta_fast") or 32.0), float(p.get("beta_slow") or 1.0)
    truncate = p.get("truncate", True) is not False
    return by_parts_inv_freq(setup.base, setup.dim, factor, setup.original_max, beta_fast, beta_slow, truncate, device)


def compute_dynamic_yarn(config, device=None, seq_len=None, layer_type=None):
    s = rope_setup(config, layer_type)
    factor = dynamic_factor(seq_len, s.original_max, s.max_position_embeddings)
    attention = s.params.get("attention_factor")
    return yarn_at(s, factor, device), float(attention) if attention is not None else yarn_attention_factor(factor)


def traced_dynamic_yarn(config, device, length, layer_type=None):
    """``compute_dynamic_yarn`` at ``length`` [] int64 on the device, nothing read back (torch.compile's form):
    s = max(1, length / L0) and 0.1 ln s + 1 as 0-d float64 tensors."""
    s = rope_setup(config, layer_type)
    factor = (length.double() / s.original_max).clamp(min=1.0)
    attention = s.params.get("attention_factor")
    scale = float(attention) if attention is not None else 0.1 * factor.log() + 1.0  # ln 1 = 0: 1 up to L0
    return yarn_at(s, factor, device), scale


def check_dynamic_yarn(params: dict, config) -> None:
    check_betas(params, config)
    check_dynamic_family(params, config)  # only where no state outlives a call


METHOD = register(
    RopeMethod(
        name="dynamic_yarn",
        kind="frequency",
        frequencies=compute_dynamic_yarn,
        traced_frequencies=traced_dynamic_yarn,
        params={
            "original_max_position_embeddings": ORIGINAL_MAX_REQUIRED,
            "beta_fast": BETA_FAST,
            "beta_slow": BETA_SLOW,
            "truncate": TRUNCATE,
            "attention_factor": Param(
                default=None, exclusive_minimum=0, help="fixed cos/sin scale; default 0.1 ln s + 1"
            ),
        },
        summary="YaRN with factor max(1, seq_len/L0), recomputed as the sequence grows",
        dynamic=True,
        check=check_dynamic_yarn,
        families=DYNAMIC_FAMILIES,
        example={"original_max_position_embeddings": 64},  # the tiny test models' pretraining length
    )
)
