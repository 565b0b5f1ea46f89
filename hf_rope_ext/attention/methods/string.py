"""``string``: STRING, ShifTed Rotary position embeddING (An et al. 2024, "Why Does the Effective Context Length of
LLMs Fall Short?", arXiv 2410.18745; authors' code HKUNLP/STRING ``string_for_llama.py``).

With S = ``window`` (the authors' ``shifted_offset``) and W = ``local_window`` (their ``small_local_value``), a
query at m and a key at n (d = m - n) are at distance d for d < S and d - S + W for d >= S: the far keys reuse the
well-trained distances from W on, in place of the large ones the model saw too rarely. A two-band declaration: the
near band is plain RoPE (d < S), the far band rotates the query by m - S + W and the key by n.

The authors' defaults: S = L0/3 (``shifted_offset=int(0.33 * L)``), W = 128 (README: 128, 256 or 512); their
code also multiplies cos and sin by 0.1 ln 2 + 1 (here ``attention_temperature="constant"``,
``temperature_factor=2``). Their flash-attention version lets the key at d = S into both bands
(``window_size=[S, 0]`` beside the shifted causal piece); this follows the paper's position matrix, where each key
has one distance.

``gradual=True`` (this package's, not the authors'): the far band's query is never placed before S - 1, i.e. the
shift grows with the query, min(m - S + 1, S - W), one position per token from 0 until it is S - W. A key crossing
the shift then stays S - 1 or more back until the shift is full, where the paper's form moves it from S - 1 to W at
once; from m = 2S - W - 1 on both are the same. With S = L0 an input a few tokens past L0 (a prompt of L0 tokens
and its question) keeps its first tokens at the far end of the trained distances, not W back.

Alone, the largest distance at N tokens is N - S + W, within L0 only up to N = L0 + S - W (about 1.3x with the
authors' S). For more, ``frequencies`` puts a frequency-level type underneath (``ntk``, ``ntk_by_parts``, ``yarn``
at ``frequency_factor``): the shifted distances are turned by its theta_i, as the authors' code turns them by a
model's own scaled frequencies (their Llama 3.1 runs keep its ``llama3`` ones).

Checked against HKUNLP/STRING ``string_for_llama.py`` (``replace_with_string``: ``diag_size`` = S, ``local_window``
= W): keys rotated by n, the shifted query by m - ``diag_size`` + ``local_window``, cos and sin times 0.1 ln 2 + 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...frequencies.common import plain_frequencies
from ...types.declare import REQUIRED, Param, RopeMethod
from ...types.registry import register
from .form import two_bands
from .params import FAMILIES, TEMPERATURE, UNDERNEATH, WINDOWED, check_underneath, check_window

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads this module
    from torch import Tensor

LOCAL_WINDOW = Param(
    default=REQUIRED,
    kind="int",
    minimum=0,
    help="W: beyond the shift, distances restart at W (d - window + W); below window (the authors use 128)",
)


GRADUAL = Param(
    default=False,
    kind="bool",
    help="the shift grows with the query, min(m - window + 1, window - local_window): far keys stay window - 1 "
    "or more back until it is full (false: the paper's, the whole shift at once)",
)


def far_query(m: Tensor, params: dict) -> Tensor:
    """m - S + W: the query moved back by S - W; gradual: never before S - 1 (m [B, L] int64)."""
    shift = int(params["window"])
    moved = m - (shift - int(params["local_window"]))
    return moved.clamp(min=shift - 1) if params.get("gradual") else moved


def far_key(n: Tensor, params: dict) -> Tensor:
    """The key at its own position n."""
    return n


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
        params={**WINDOWED, "local_window": LOCAL_WINDOW, "gradual": GRADUAL, **TEMPERATURE, **UNDERNEATH},
        summary="STRING: distance m-n below window (the shift S), m-n-window+local_window beyond",
        check=check_string,
        families=FAMILIES,
        example={"window": 16, "local_window": 4},
        attention=two_bands(far_query, far_key),
    )
)
