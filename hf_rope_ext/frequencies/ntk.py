"""``ntk``: NTK-aware (beta-ary) scaling: a larger base b * s^(d/(d-2)), attention factor 1.

Source: bloc97 2023, "NTK-Aware Scaled RoPE allows LLaMA models to have extended (8k+) context size without any
fine-tuning and minimal perplexity degradation" (r/LocalLLaMA), the "NTK-aware" interpolation of Peng et al. 2023,
"YaRN: Efficient Context Window Extension of Large Language Models", arXiv 2309.00071, section 3.1.
Checked against jquesnelle/yarn ``scaled_rope/LlamaNTKScaledRotaryEmbedding.py`` (the base becomes
``base * alpha ** (dim / (dim-2))``, then plain RoPE frequencies); the tests compare it with transformers' ``default``
type at that base.
"""

from ..types.declare import RopeMethod
from ..types.registry import register
from .common import inv_freq_for_base, rope_setup
from .params import FACTOR, ORIGINAL_MAX


def ntk_base(base: float, factor: float, dim: int) -> float:
    """The scaled base that stretches the lowest frequency by ``factor`` and keeps the highest."""
    return base * factor ** (dim / (dim - 2))


def compute_ntk(config, device=None, seq_len=None, layer_type=None):
    s = rope_setup(config, layer_type)
    return inv_freq_for_base(ntk_base(s.base, float(s.params["factor"]), s.dim), s.dim, device), 1.0


METHOD = register(
    RopeMethod(
        name="ntk",
        kind="frequency",
        frequencies=compute_ntk,
        params={"factor": FACTOR, "original_max_position_embeddings": ORIGINAL_MAX},
        example={"factor": 4.0},
        summary="NTK-aware scaling: base b*s^(d/(d-2)), no attention factor",
    )
)
