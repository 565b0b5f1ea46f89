"""``string``: STRING, ShifTed Rotary position embeddING (An et al. 2024, "Why Does the Effective Context Length of
LLMs Fall Short?", arXiv 2410.18745; authors' code HKUNLP/STRING ``string_for_llama.py``).

With S = ``window`` (the authors' ``shifted_offset``) and W = ``local_window`` (their ``small_local_value``), a
query at m and a key at n (d = m - n) are at distance d for d < S and d - S + W for d >= S: the far keys reuse the
well-trained distances from W on, in place of the large ones the model saw too rarely. A two-band declaration: the
near band is plain RoPE (d < S), the far band rotates the query by m - S + W and the key by n.

The authors' defaults, taken when a config leaves ``window`` or ``local_window`` out: S = L0/3
(``shifted_offset=int(0.33 * L)``), W = 128 (README: 128, 256 or 512; here at most S/2, for a short L0); their code
also multiplies cos and sin by 0.1 ln 2 + 1 (here ``attention_temperature="constant"``,
``temperature_factor=2``). Their flash-attention version lets the key at d = S into both bands
(``window_size=[S, 0]`` beside the shifted causal piece); this follows the paper's position matrix, where each key
has one distance.

``ramp`` = R > 0 (this package's, not the authors'): the shift grows with the query over R positions,
min(S - W, floor((m - S + 1)(S - W) / R)), instead of all at once (R = 0, the paper's). A key crossing S then moves
back gradually, not from S - 1 to W in one step; from m = S - 1 + R on both are the same. With S = L0 and
R = S - W the shift grows one position per token, so no distance reaches L0 before m = 2 L0 - W - 1 and an input a
few tokens past L0 (a prompt of L0 tokens and its question) keeps its first tokens at the far end of the trained
distances, not W back.

Alone, the largest distance at N tokens is N - S + W, within L0 only up to N = L0 + S - W (about 1.3x with the
authors' S). For more, ``frequencies`` puts a frequency-level type underneath (``ntk``, ``ntk_by_parts``, ``yarn``
at ``frequency_factor``): the shifted distances are turned by its theta_i, as the authors' code turns them by a
model's own scaled frequencies (their Llama 3.1 runs keep its ``llama3`` ones).

Checked against HKUNLP/STRING ``string_for_llama.py`` (``replace_with_string``: ``diag_size`` = S, ``local_window``
= W): keys rotated by n, the shifted query by m - ``diag_size`` + ``local_window``, cos and sin times 0.1 ln 2 + 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...frequencies.common import plain_frequencies
from ...types.declare import FromLength, Param, RopeMethod
from ...types.registry import register
from .form import two_bands
from .params import FAMILIES, TEMPERATURE, UNDERNEATH, WINDOWED, check_underneath, check_window

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads this module
    from torch import Tensor

SHIFT_FRACTION, LOCAL = 3, 128  # the authors' S = L0/3 and W = 128


def authors_shift(params: dict, pretrained: int) -> int:
    """S = L0/3 (at least 1)."""
    return max(1, pretrained // SHIFT_FRACTION)


def authors_local(params: dict, pretrained: int) -> int:
    """W = 128, at most half the shift in force (``params["window"]``)."""
    return min(LOCAL, int(params["window"]) // 2)


SHIFT = Param(
    default=FromLength(authors_shift, "L0 // 3"),
    kind="int",
    minimum=1,
    help="S: distances below it are exact, the others move back by S - W; at most L0 (the authors' L0/3)",
)
LOCAL_WINDOW = Param(
    default=FromLength(authors_local, "min(128, window // 2)"),
    kind="int",
    minimum=0,
    help="W: beyond the shift, distances restart at W (d - window + W); below window (the authors use 128)",
)


RAMP = Param(
    default=0,
    kind="int",
    minimum=0,
    help="R: the shift grows over R query positions from S - 1 on, min(S - W, floor((m - S + 1)(S - W) / R)); "
    "0: all at once (the paper's)",
)


def far_query(m: Tensor, params: dict) -> Tensor:
    """m - S + W: the query moved back by S - W; with a ramp R, by its share of it (m [B, L] int64)."""
    shift, ramp = int(params["window"]), params.get("ramp")
    full = shift - int(params["local_window"])
    if not ramp:
        return m - full
    grown = (m - shift + 1).clamp(min=0) * full  # the ramp's progress times the full shift
    return m - grown.div(int(ramp), rounding_mode="floor").clamp(max=full)


def far_key(n: Tensor, params: dict) -> Tensor:
    """The key at its own position n."""
    return n


def extension_defaults(pretrained: int, factor: float | None) -> dict:
    """The authors' S and W; where the farthest distance at s x L0 (s L0 - 1 - S + W) passes L0 - 1, ``ntk_by_parts``
    underneath at the factor that brings it back within L0 (the temperature stays a knob of its own)."""
    shift = authors_shift({}, pretrained)
    params = {"window": shift, "local_window": authors_local({"window": shift}, pretrained)}
    reach = (factor or 1.0) * pretrained - shift + params["local_window"]  # the farthest distance plus one
    if reach > pretrained:
        params |= {"frequencies": "ntk_by_parts", "frequency_factor": math.ceil(100 * reach / pretrained) / 100}
    return params


def check_string(params: dict, config) -> None:
    """S at most L0 (``check_window``), W below S, the frequencies underneath with their factor."""
    check_window(params, config)
    check_underneath(params)
    shift, local = params.get("window"), params.get("local_window")
    if shift is not None and local is not None and not local < shift:
        raise ValueError(
            f"rope_parameters['local_window']={local!r} is not below rope_parameters['window']={shift!r} for "
            "rope_type='string': allowed 0 <= local_window < window (distances beyond the shift restart at "
            "local_window)"
        )


METHOD = register(
    RopeMethod(
        name="string",
        kind="attention",
        frequencies=plain_frequencies,
        params={**WINDOWED, "window": SHIFT, "local_window": LOCAL_WINDOW, "ramp": RAMP, **TEMPERATURE, **UNDERNEATH},
        summary="STRING: distance m-n below window (the shift S), m-n-window+local_window beyond",
        check=check_string,
        families=FAMILIES,
        example={"window": 16, "local_window": 4},
        defaults=extension_defaults,
        attention=two_bands(far_query, far_key),
    )
)
