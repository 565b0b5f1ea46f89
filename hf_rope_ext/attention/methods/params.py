"""Parameter specs and cross-parameter checks shared by the attention-level methods."""

from __future__ import annotations

from ...frequencies.params import ORIGINAL_MAX
from ...models import ATTENTION_FAMILIES, refuse_family
from ...types.declare import REQUIRED, Param
from ...types.registry import pretrained_length

FAMILIES = ATTENTION_FAMILIES  # the model types whose attention modules the attention function serves (models/)

WINDOW = Param(
    default=REQUIRED,
    kind="int",
    minimum=1,
    help="relative distances below this are exact RoPE distances; at most L0 (original_max_position_embeddings)",
)
FACTOR = Param(default=REQUIRED, minimum=1.0, help="beyond the window, distances grow 1/factor as fast")
GROUP_SIZE = Param(
    default=REQUIRED, kind="int", minimum=1, help="beyond the window, positions are floor(pos/group_size)"
)
WINDOWED = {"window": WINDOW, "original_max_position_embeddings": ORIGINAL_MAX}
FAR_WINDOW_FRACTION = 4  # extension defaults of the windowed types: exact distances below L0 / 4


def far_window(pretrained: int, factor: float | None = None) -> dict:
    """{"window": L0/4} at any target factor: the extension default of the windowed types (ReRoPE's; leaky ReRoPE
    adds its slope)."""
    return {"window": max(1, pretrained // FAR_WINDOW_FRACTION)}


# attention temperature, every attention-level type (``engine.temperature`` applies it to the queries)
TEMPERATURE = {
    "attention_temperature": Param(
        default="none",
        kind="choice",
        choices=("none", "constant", "log"),
        help="scores times (0.1 ln s + 1)^2 (constant: YaRN's attention factor on q and k, s = temperature_factor), "
        "or the query at m times log_L0(m + 1) past L0 (log: Qwen's use_logn_attn); none: unchanged",
    ),
    "temperature_factor": Param(
        default=None, minimum=1.0, help="s of attention_temperature='constant' (the extension factor); only then"
    ),
}


# frequencies underneath (STRING): the method rotates by a frequency-level type's theta_i instead of plain RoPE's
UNDERNEATH_TYPES = ("plain", "ntk", "ntk_by_parts", "yarn")
UNDERNEATH = {
    "frequencies": Param(
        default="plain",
        kind="choice",
        choices=UNDERNEATH_TYPES,
        help="the frequencies rotated by: plain RoPE's, or those of a frequency-level type at frequency_factor "
        "(its attention factor on the scores too, as yarn's)",
    ),
    "frequency_factor": Param(default=None, minimum=1.0, help="s of the frequencies underneath (only with one)"),
}


def check_underneath(params: dict) -> None:
    """``frequency_factor`` is given exactly when ``frequencies`` names a type."""
    kind, factor = params.get("frequencies") or "plain", params.get("frequency_factor")
    if (kind != "plain") == (factor is None):
        need = "required" if factor is None else "allowed only"
        raise ValueError(
            f"rope_parameters['frequency_factor']={factor!r} with rope_parameters['frequencies']={kind!r}: "
            f"frequency_factor (s >= 1) is {need} with frequencies one of {list(UNDERNEATH_TYPES[1:])}"
        )


def check_family(params: dict, config) -> None:
    """The model family must be one whose attention modules these methods were written and tested for; the
    attention temperature's two keys must agree (``check_temperature``)."""
    need = "is an attention-level type: it needs the attention modules these methods were written for"
    refuse_family(params, config, FAMILIES, need)
    check_temperature(params)


def check_temperature(params: dict) -> None:
    """``temperature_factor`` is given exactly when ``attention_temperature`` is "constant"."""
    mode, factor = params.get("attention_temperature") or "none", params.get("temperature_factor")
    if (mode == "constant") == (factor is None):
        need = "required" if factor is None else "allowed only"
        raise ValueError(
            f"rope_parameters['temperature_factor']={factor!r} with rope_parameters['attention_temperature']="
            f"{mode!r}: temperature_factor (s >= 1) is {need} with attention_temperature='constant'"
        )


def check_window(params: dict, config) -> None:
    """The window must be at most L0: distances the pretrained model never saw make the window meaningless."""
    check_family(params, config)
    window, limit = params.get("window"), pretrained_length(params, config)
    if window is not None and limit is not None and window > limit:
        raise ValueError(
            f"rope_parameters['window']={window!r} is larger than the pretrained length L0={limit} "
            f"(original_max_position_embeddings, else max_position_embeddings): allowed 1 <= window <= {limit}"
        )
