"""Parameter specs and cross-parameter checks shared by the attention-level methods."""

from __future__ import annotations

from ...declare import REQUIRED, Param
from ...frequencies.params import ORIGINAL_MAX
from ...models import ATTENTION_FAMILIES, refuse_family

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


def pretrained_length(params: dict, config) -> int:
    """L0: ``original_max_position_embeddings`` when given, else the config's ``max_position_embeddings``."""
    return int(params.get("original_max_position_embeddings") or config.max_position_embeddings)


def check_family(params: dict, config) -> None:
    """The model family must be one whose attention modules these methods were written and tested for."""
    need = "is an attention-level type: it needs the attention modules these methods were written for"
    refuse_family(params, config, FAMILIES, need)


def check_window(params: dict, config) -> None:
    """The window must be at most L0: distances the pretrained model never saw make the window meaningless."""
    check_family(params, config)
    if config is None:
        return
    window, limit = params.get("window"), pretrained_length(params, config)
    if window > limit:
        raise ValueError(
            f"rope_parameters['window']={window!r} is larger than the pretrained length L0={limit} "
            f"(original_max_position_embeddings, else max_position_embeddings): allowed 1 <= window <= {limit}"
        )
