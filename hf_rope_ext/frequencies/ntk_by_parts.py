"""``ntk_by_parts``: YaRN's frequency schedule (paper section 3.2) without its attention factor.

Pairs that turn more than ``beta_fast`` times in L0 keep theta_i (extrapolate), pairs that turn fewer than
``beta_slow`` times get theta_i / s (interpolate), with a linear ramp in the pair index between.

Paper: Peng, Quesnelle, Fan and Shippole 2023, "YaRN: Efficient Context Window Extension of Large Language Models",
arXiv 2309.00071, section 3.2 ("NTK-by-parts" interpolation). Checked against jquesnelle/yarn
``scaled_rope/LlamaYaRNScaledRotaryEmbedding.py`` (``yarn``: ``find_correction_range``, ``linear_ramp_mask`` and the
blend of ``inv_freq_interpolation`` and ``inv_freq_extrapolation``, without its ``mscale``) and transformers'
``_compute_yarn_parameters`` (``modeling_rope_utils.py``), whose inv_freq the tests require bit for bit.
"""

from ..types.declare import RopeMethod
from ..types.registry import register
from .common import correction_range, exponents, ramp, rope_setup
from .params import BETA_FAST, BETA_SLOW, FACTOR, ORIGINAL_MAX, TRUNCATE, require_greater


def by_parts_inv_freq(base, dim, factor, original_max, beta_fast=32.0, beta_slow=1.0, truncate=True, device=None):
    """Blend of theta_i (fast pairs) and theta_i/factor (slow pairs); shape [d/2], fp32."""
    wavelength = base ** exponents(dim, device)  # b^(2i/d) = 1/theta_i, shape [d/2]
    low, high = correction_range(beta_fast, beta_slow, dim, base, original_max, truncate)
    keep = 1.0 - ramp(low, high, dim // 2, device)  # 1 for pair indices below low, 0 above high
    return 1.0 / (factor * wavelength) * (1.0 - keep) + 1.0 / wavelength * keep


def compute_ntk_by_parts(config, device=None, seq_len=None, layer_type=None):
    s = rope_setup(config, layer_type)
    p = s.params
    inv_freq = by_parts_inv_freq(
        s.base,
        s.dim,
        float(p["factor"]),
        s.original_max,
        float(p.get("beta_fast") or 32.0),
        float(p.get("beta_slow") or 1.0),
        p.get("truncate", True) is not False,
        device,
    )
    return inv_freq, 1.0


def check_betas(params: dict, config) -> None:
    require_greater(params, "beta_fast", "beta_slow", 32.0, 1.0)


METHOD = register(
    RopeMethod(
        name="ntk_by_parts",
        kind="frequency",
        frequencies=compute_ntk_by_parts,
        params={
            "factor": FACTOR,
            "original_max_position_embeddings": ORIGINAL_MAX,
            "beta_fast": BETA_FAST,
            "beta_slow": BETA_SLOW,
            "truncate": TRUNCATE,
        },
        example={"factor": 4.0},
        summary="YaRN's NTK-by-parts frequencies, attention factor 1",
        check=check_betas,
    )
)
