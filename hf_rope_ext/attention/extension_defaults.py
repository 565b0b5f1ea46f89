"""Values for an attention-level type's own keys that fit s x L0 tokens into the distances a model was pretrained on:
the defaults ``extend`` evaluates each method with and ``finetune`` trains under, over which a user's
``--rope-param`` values go. A frequency-level type has none (its ``factor`` is set by the caller)."""

from __future__ import annotations

import math

from ..types.rope_parameters import accepted_keys
from .methods import dual_chunk, self_extend

FAR_WINDOW_FRACTION = 4  # windowed attention types keep exact distances below L0 / 4
STRING_SHIFT_FRACTION, STRING_LOCAL = 3, 128  # STRING's authors: shift S = L0/3, W = 128 (here at most S/2)


def string_defaults(shift: int, local: int, pretrain: int, factor: float | None) -> dict:
    """STRING's S and W; where its farthest distance at s x L0 (s L0 - 1 - S + W) passes L0 - 1, ``ntk_by_parts``
    underneath at the factor that brings it back within L0 (the temperature stays a knob of its own)."""
    params = {"window": shift, "local_window": local}
    reach = (factor or 1.0) * pretrain - shift + local  # the farthest distance plus one
    if reach > pretrain:
        params |= {"frequencies": "ntk_by_parts", "frequency_factor": math.ceil(100 * reach / pretrain) / 100}
    return params


def default_parameters(rope_type: str, pretrain: int, factor: float | None) -> dict:
    """Values for the required keys besides ``factor``, chosen so that s x L0 tokens fit the pretrained distances:
    ``window`` L0/4; leaky ``factor`` just large enough that window + (s L0 - window) / k <= L0; Self-Extend its
    authors' rule (``methods.self_extend.authors_defaults``: window L0/4, the smallest group that keeps
    window + (s L0 - window) / g <= 2/3 L0); STRING (``local_window``) its authors' shift L0/3 and W = 128 (at most
    half the shift, for a short L0); Dual Chunk Attention its authors' chunk_size 3/4 L0, local_size L0/16."""
    keys = accepted_keys(rope_type)
    if "local_window" in keys:
        shift = max(1, pretrain // STRING_SHIFT_FRACTION)
        return string_defaults(shift, min(STRING_LOCAL, shift // 2), pretrain, factor)
    if "chunk_size" in keys:  # Dual Chunk Attention: its authors' chunk_size 3/4 L0, local_size L0/16
        return dual_chunk.authors_defaults(pretrain)
    if "group_size" in keys:  # Self-Extend: its authors' rule, W + (s L0 - W)/G <= 2/3 L0
        return self_extend.authors_defaults(factor or 1.0, pretrain)
    window = max(1, pretrain // FAR_WINDOW_FRACTION)
    squeeze = (factor or 1.0) * pretrain - window  # distances beyond the window at the target length
    extra = {"window": window} if "window" in keys else {}
    if "window" in keys and "factor" in keys and factor is not None:
        extra["factor"] = max(1.0, squeeze / (pretrain - window))  # leaky: the slope beyond the window
    return extra
