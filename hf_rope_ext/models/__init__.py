"""Model families, each described once (``family.Family``): which rows rotate and in which layout, head sizes,
and how the attention function serves it. One module per family with layout facts (llama, mistral, qwen2, qwen3,
stablelm, phi3, roformer_layout), ``attention_only`` for the others; nothing model-specific lives outside this
package. ``roformer`` is RoFormer's runtime (imported by its seam, not here)."""

from __future__ import annotations

from . import attention_only, llama, mistral, phi3, qwen2, qwen3, roformer_layout, stablelm  # noqa: F401  (each registers)
from .family import Family, HeadShape, Projection, check_layout, families, find_family, layout_of

__all__ = [
    "ATTENTION_FAMILIES",
    "DYNAMIC_FAMILIES",
    "Family",
    "HeadShape",
    "Projection",
    "attention_families",
    "check_dynamic_family",
    "check_layout",
    "family_of",
    "find_family",
    "has_layout_facts",
    "is_rope_free_layer",
    "refuse_family",
    "layout_families",
    "layout_of",
    "unsupported_reason",
]


def family_of(model_type: str | None) -> Family:
    """The family of ``model_type`` for layout conversion (one that says which rows rotate)."""
    if not has_layout_facts(model_type):
        known = sorted(t for f in layout_families() for t in f.model_types)
        raise ValueError(f"model_type={model_type!r} has no RoPE layout facts; supported model types: {known}")
    return find_family(model_type)


def has_layout_facts(model_type: str | None) -> bool:
    family = find_family(model_type)
    return family is not None and bool(family.projections)


def layout_families() -> list[Family]:
    return [f for f in families() if f.projections]


def attention_families() -> tuple[str, ...]:
    """The model types whose attention modules the attention function serves, sorted."""
    return tuple(sorted(t for f in families() if f.attention for t in f.model_types))


ATTENTION_FAMILIES = attention_families()
# with the families whose own rotary code runs the dynamic frequency types statelessly (RoFormer)
DYNAMIC_FAMILIES = ATTENTION_FAMILIES + tuple(sorted(t for f in families() if f.own_dynamic for t in f.model_types))


def is_rope_free_layer(module) -> bool:
    """Whether this attention module applies no RoPE (SmolLM3's, EXAONE 4's NoPE layers)."""
    family = find_family(getattr(module.config, "model_type", None))
    return family is not None and family.rope_free is not None and bool(family.rope_free(module))


def unsupported_reason(model_type: str | None) -> str:
    """Why the attention function does not serve ``model_type``."""
    family = find_family(model_type)
    why = family.refused if family is not None else None
    return why or "its attention module was not verified to apply RoPE the way this package needs"


def refuse_family(params: dict, config, served: tuple[str, ...], need: str) -> None:
    """Raise unless ``config``'s family is one of ``served``; ``need``: what the rope type asks of a family."""
    model_type = getattr(config, "model_type", None)
    if config is not None and model_type not in served:
        raise ValueError(
            f"rope_parameters['rope_type']={params.get('rope_type')!r} {need}, which config.model_type={model_type!r} "
            f"does not offer ({unsupported_reason(model_type)}); supported families: {list(served)}"
        )


def check_dynamic_family(params: dict, config) -> None:
    """A dynamic frequency type only where no state outlives a call: on ATTENTION_FAMILIES the attention
    function rotates with the frequencies for the current length; elsewhere transformers' dynamic updater would keep
    the long input's attention factor after resetting ``inv_freq`` (the same short input then gives another output)
    and cache keys rotated under older frequencies."""
    need = (
        "recomputes its frequencies with the length and runs without state only where the package rotates inside "
        "the attention function (transformers' dynamic updater keeps the long input's attention factor after its reset)"
    )
    refuse_family(params, config, DYNAMIC_FAMILIES, need)
