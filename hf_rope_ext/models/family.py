"""A model family described once (:class:`Family`): which projection rows rotate and in which layout (layout
conversion, export), the sizes of its heads, and how its attention modules meet the package's attention function
(routing: whether it serves them, which layers apply no RoPE, why a family is refused). Plain data, no torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LAYOUTS = ("half", "interleaved")  # pairs (i, i + d/2) as rotate_half; pairs (2i, 2i + 1) as GPT-J and RoFormer
# q: query heads, k: key heads (rotated); v: value heads (never rotated); n: one head's per-dim vector (rotated),
# e.g. Qwen3's q_norm/k_norm weight [head_dim], shared by every head
ROW_BLOCKS = ("q", "k", "v", "n")


def check_layout(layout: str, key: str = "rope_layout") -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"{key}={layout!r} is not a RoPE layout; allowed: {list(LAYOUTS)}")
    return layout


def layout_of(config, default: str = "half") -> str:
    """The layout a config records in ``rope_layout`` (``default`` when it records none)."""
    return check_layout(getattr(config, "rope_layout", None) or default)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


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
class Family:
    """What the package knows of one model family (one or more ``model_type`` values)."""

    model_types: tuple[str, ...]
    # which keys rotate: the projections whose output rows are rotary pairs (empty: no layout facts, not converted)
    projections: tuple[Projection, ...] = ()
    default_layout: str = "half"  # a checkpoint's layout when its config records none: what stock transformers runs
    # True: weights are permuted to half on load and back on save, so the model in memory is always "half"
    # (stock kernels); False: the model in memory holds the layout its config records (RoFormer).
    loads_to_half: bool = True
    head_shape: Callable[..., HeadShape] = config_head_shape
    # routing: its attention modules rotate q/k with the rotary module's cos/sin through rotate_half (zero
    # frequencies give the identity), cache the result and pass position_ids on: the attention function serves it
    attention: bool = False
    rope_free: Callable[[Any], bool] | None = None  # per layer: True for an attention module that applies no RoPE
    refused: str | None = None  # why the attention-level types refuse it (None: not verified)
    own_dynamic: bool = False  # its own rotary code recomputes dynamic frequencies statelessly at every call

    def checkpoint_layout(self, config) -> str:
        """The layout of the saved weights this config describes."""
        return layout_of(config, self.default_layout)

    def memory_layout(self, config) -> str:
        """The layout of the q/k rows of a live model (and of a peft adapter trained on it)."""
        return "half" if self.loads_to_half else self.checkpoint_layout(config)


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    for model_type in family.model_types:
        if _FAMILIES.get(model_type, family) is not family:
            raise ValueError(f"model_type {model_type!r} is already described: {_FAMILIES[model_type]!r}")
        _FAMILIES[model_type] = family
    return family


def find_family(model_type: str | None) -> Family | None:
    return _FAMILIES.get(model_type)


def families() -> list[Family]:
    return list(dict.fromkeys(_FAMILIES.values()))
