"""``part_ntk``: NTK-aware, linear and unscaled frequencies blended per pair by how often it turns in L0 (the "part
NTK" scheme, YaRN's predecessor).

Three candidate frequencies per pair: theta_i (extrapolation), theta_i/s (linear) and the NTK-aware
theta_i' (base b*s^(d/(d-2))). Pairs that turn fewer than ``beta_1`` times in L0 take linear, more than
``beta_0`` times take NTK (weighted by ``ntk_factor``); then pairs turning more than ``gamma_0`` times
take theta_i unchanged (weighted by ``extrapolation_factor``), with linear ramps in between.

Source: bloc97 2023, the "by parts" correction to NTK-aware scaling that the YaRN paper (Peng et al. 2023,
arXiv 2309.00071, section 3.2) builds its NTK-by-parts interpolation on. Checked against jquesnelle/yarn
``scaled_rope/LlamaPartNTKScaledRotaryEmbedding.py`` (bloc97's): the constants beta_0 = 1.25, beta_1 = 0.75,
gamma_0 = 16, gamma_1 = 2, ``find_correction_range``, ``linear_ramp_mask`` and its two blends, ``ntk_factor`` and
``extrapolation_factor`` included.
"""

from ..types.declare import Param, RopeMethod
from ..types.registry import register
from .common import correction_range, inv_freq_for_base, ramp, rope_setup
from .ntk import ntk_base
from .params import FACTOR, ORIGINAL_MAX, require_greater

CONSTANTS = {"beta_0": 1.25, "beta_1": 0.75, "gamma_0": 16.0, "gamma_1": 2.0}


def blend(inner, outer, fast, slow, weight, dim, base, original_max):
    """``outer`` for pairs turning more than ``fast`` times (times ``weight``), ``inner`` below ``slow``."""
    low, high = correction_range(fast, slow, dim, base, original_max)
    mask = (1.0 - ramp(low, high, dim // 2, inner.device)) * weight
    return inner * (1.0 - mask) + outer * mask


def part_ntk_inv_freq(
    base, dim, factor, original_max, ntk_factor=1.0, extrapolation_factor=1.0, c=CONSTANTS, device=None
):
    theta = inv_freq_for_base(base, dim, device)
    ntk = inv_freq_for_base(ntk_base(base, factor, dim), dim, device)
    inv = blend(theta / factor, ntk, c["beta_0"], c["beta_1"], ntk_factor, dim, base, original_max)
    return blend(inv, theta, c["gamma_0"], c["gamma_1"], extrapolation_factor, dim, base, original_max)


def compute_part_ntk(config, device=None, seq_len=None, layer_type=None):
    s = rope_setup(config, layer_type)
    p = s.params
    constants = {k: float(p.get(k) if p.get(k) is not None else v) for k, v in CONSTANTS.items()}
    ntk_factor = float(p.get("ntk_factor") if p.get("ntk_factor") is not None else 1.0)
    extra = float(p.get("extrapolation_factor") if p.get("extrapolation_factor") is not None else 1.0)
    inv = part_ntk_inv_freq(s.base, s.dim, float(p["factor"]), s.original_max, ntk_factor, extra, constants, device)
    return inv, 1.0


def check_constants(params: dict, config) -> None:
    require_greater(params, "beta_0", "beta_1", CONSTANTS["beta_0"], CONSTANTS["beta_1"])
    require_greater(params, "gamma_0", "gamma_1", CONSTANTS["gamma_0"], CONSTANTS["gamma_1"])


def _rotations(name: str, text: str) -> Param:
    return Param(default=CONSTANTS[name], exclusive_minimum=0, help=text)


METHOD = register(
    RopeMethod(
        name="part_ntk",
        kind="frequency",
        frequencies=compute_part_ntk,
        params={
            "factor": FACTOR,
            "original_max_position_embeddings": ORIGINAL_MAX,
            "ntk_factor": Param(default=1.0, minimum=0, help="weight of the NTK band against linear"),
            "extrapolation_factor": Param(default=1.0, minimum=0, help="weight of the unscaled band"),
            "beta_0": _rotations("beta_0", "rotations in L0 above which NTK is used"),
            "beta_1": _rotations("beta_1", "rotations in L0 below which linear is used"),
            "gamma_0": _rotations("gamma_0", "rotations in L0 above which theta_i is kept"),
            "gamma_1": _rotations("gamma_1", "rotations in L0 below which the NTK/linear blend is used"),
        },
        example={"factor": 4.0},
        summary="three bands by turns in L0: below beta_1 theta_i/s, above beta_0 the NTK-aware base, above gamma_0 "
        "theta_i kept; linear ramps between",
        check=check_constants,
    )
)
