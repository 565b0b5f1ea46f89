"""Family facts for layout conversion: which state-dict keys hold rotated rows, and how many heads they hold.

Each family module (llama, mistral, qwen2, qwen3, stablelm, phi3, roformer_layout) registers one
:class:`LayoutFamily`; nothing model-specific lives outside this package. ``family_of(model_type)`` finds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..frequencies.common import head_dim_of
from ..rotary import layout_of

# q: query heads, k: key heads (rotated); v: value heads (never rotated); n: one head's per-dim vector (rotated),
# e.g. Qwen3's q_norm/k_norm weight [head_dim], shared by every head
ROW_BLOCKS = ("q", "k", "v", "n")


@dataclass(frozen=True)
class HeadShape:
    """Sizes of one attention layer's projections, read from a config."""

    q_heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int  # the first rotary_dim dims of each head rotate; the rest pass through

    def heads(self, block: str) -> int:
        return {"q": self.q_heads, "k": self.kv_heads, "v": self.kv_heads, "n": 1}[block]


@dataclass(frozen=True)
class Projection:
    """One linear layer whose output rows are per-head blocks: ``module`` matches the end of its module path."""

    module: str  # dotted module name, e.g. "self_attn.q_proj" (matched at a name boundary)
    blocks: tuple[str, ...]  # its output rows, in order (ROW_BLOCKS), e.g. ("q",) or fused ("q", "k", "v")


def config_head_shape(config) -> HeadShape:
    """Head counts of a rope-registry family: GQA-aware, explicit head_dim, partial_rotary_factor."""
    params = getattr(config, "rope_parameters", None) or {}
    partial = params.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", None) or 1.0
    head_dim = head_dim_of(config)
    q_heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or q_heads
    return checked(HeadShape(q_heads, kv_heads, head_dim, int(head_dim * partial)))


def checked(shape: HeadShape) -> HeadShape:
    if shape.q_heads <= 0 or shape.kv_heads <= 0 or shape.q_heads % shape.kv_heads:
        raise ValueError(
            f"num_attention_heads={shape.q_heads} and num_key_value_heads={shape.kv_heads} do not fit: "
            "both must be positive and the first a multiple of the second"
        )
    if shape.rotary_dim % 2 or not 0 < shape.rotary_dim <= shape.head_dim:
        raise ValueError(
            f"rotary dim={shape.rotary_dim} (head_dim={shape.head_dim} x partial_rotary_factor) is not allowed: "
            "it must be even and between 2 and head_dim"
        )
    return shape


@dataclass(frozen=True)
class LayoutFamily:
    model_types: tuple[str, ...]
    projections: tuple[Projection, ...]
    default_layout: str = "half"  # the layout of a checkpoint whose config records no rope_layout
    # True: weights are permuted to half on load and back on save, so the model in memory is always "half"
    # (stock kernels); False: the model in memory holds the layout its config records (RoFormer).
    loads_to_half: bool = True
    head_shape: Callable[..., HeadShape] = config_head_shape

    def checkpoint_layout(self, config) -> str:
        """The layout of the saved weights this config describes."""
        return layout_of(config, self.default_layout)

    def memory_layout(self, config) -> str:
        """The layout of the q/k rows of a live model (and of a peft adapter trained on it)."""
        return "half" if self.loads_to_half else self.checkpoint_layout(config)


_FAMILIES: dict[str, LayoutFamily] = {}


def register_family(family: LayoutFamily) -> LayoutFamily:
    for model_type in family.model_types:
        if _FAMILIES.get(model_type, family) is not family:
            raise ValueError(f"model_type {model_type!r} already has layout facts: {_FAMILIES[model_type]!r}")
        _FAMILIES[model_type] = family
    return family


def family_of(model_type: str | None) -> LayoutFamily:
    if model_type not in _FAMILIES:
        raise ValueError(
            f"model_type={model_type!r} has no RoPE layout facts; supported model types: {sorted(_FAMILIES)}"
        )
    return _FAMILIES[model_type]


def has_layout_facts(model_type: str | None) -> bool:
    return model_type in _FAMILIES


def layout_families() -> list[LayoutFamily]:
    return list(dict.fromkeys(_FAMILIES.values()))


from . import llama, mistral, phi3, qwen2, qwen3, roformer_layout, stablelm  # noqa: E402,F401  (each registers its family)
