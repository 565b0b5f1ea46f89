"""The model to fine-tune: the base checkpoint loaded with the target rope type and length set through its config.

``max_position_embeddings`` is raised to the target length (except for transformers' ``dynamic``, which reads it
as the pretraining length) and ``original_max_position_embeddings`` records the old length for every type that
takes it; the config is validated by transformers (which runs this package's validators for its own types).
"""

from __future__ import annotations

import os

import torch

from ..types import registry
from ..types.rope_parameters import accepted_keys, extended_max_positions, rope_parameters_for

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP16_MAX = 65504.0


def check_fits(config, rope_type: str) -> dict:
    """The base model's flat rope parameters; ValueError when ``rope_type`` cannot apply to this model."""
    base = getattr(config, "rope_parameters", None)
    if not isinstance(base, dict) or "rope_theta" not in base:
        raise ValueError(
            f"rope_type={rope_type!r} does not fit model_type={config.model_type!r}: it has no rope_parameters"
        )
    if "rope_type" not in base:
        raise ValueError(
            f"model_type={config.model_type!r} has rope parameters per layer type {sorted(base)}; not supported"
        )
    if rope_type not in registry.BUILTIN_TYPES:
        families = registry.get_method(rope_type).families
        if families is not None and config.model_type not in families:
            raise ValueError(
                f"rope_type={rope_type!r} does not fit model_type={config.model_type!r}; it supports {list(families)}"
            )
    return dict(base)


def target_rope_parameters(config, rope_type: str, length: int, factor: float | None = None, extra: dict | None = None):
    """(rope_parameters, max_position_embeddings) that extend ``config`` to ``length`` tokens with ``rope_type``: its
    ``factor`` length / L0 (or ``factor``), an attention-level type's own keys by ``extend``'s rule
    (the method's ``RopeMethod.defaults``: Self-Extend's group for length / L0, DCA's chunks, leaky ReRoPE's slope...),
    then the user's ``extra`` over them."""
    check_fits(config, rope_type)
    old = int(config.max_position_embeddings)
    if int(length) < old:
        raise ValueError(
            f"--length {length} is shorter than the model's max_position_embeddings={old}; expected >= {old}"
        )
    allowed = accepted_keys(rope_type)
    if factor is not None and "factor" not in allowed:
        raise ValueError(f"--factor {factor}: rope_type={rope_type!r} takes no factor; its keys: {sorted(allowed)}")
    scale = float(length) / old
    defaults = {"factor": scale} if "factor" in allowed else {}
    defaults |= registry.default_parameters(
        rope_type, old, scale
    )  # an attention-level type's keys, as extend sets them
    if factor is not None:
        defaults["factor"] = float(factor)
    params = rope_parameters_for(config, rope_type, **{**defaults, **dict(extra or {})})
    return params, extended_max_positions(rope_type, old, length)


def extended_config(path: str, rope_type: str, length: int, factor: float | None = None, extra: dict | None = None):
    """The base config with the target rope parameters and length, validated (ValueError/KeyError when invalid)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    params, max_positions = target_rope_parameters(config, rope_type, length, factor, extra)
    config.rope_parameters = params
    config.max_position_embeddings = max_positions
    config.validate_rope()
    return config


def base_length(path: str) -> int:
    """The base model's own length L0 (its config's ``max_position_embeddings``)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(path).max_position_embeddings)


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto': the accelerate config's mixed_precision when launched with one, else bf16 on a GPU that has it, else
    fp32 (CPU)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not allowed; expected one of {list(PRECISIONS)}")
    if precision != "auto":
        return precision
    launched = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}.get(os.environ.get("ACCELERATE_MIXED_PRECISION", ""))
    if launched:
        return launched
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def attention_implementation(rope_type: str, device: torch.device) -> str:
    """flash-attention 2 when installed on CUDA for frequency-level types, else SDPA."""
    import importlib.util

    attention_level = rope_type not in registry.BUILTIN_TYPES and registry.get_method(rope_type).kind == "attention"
    flash = importlib.util.find_spec("flash_attn") is not None and device.type == "cuda"
    return "flash_attention_2" if flash and not attention_level else "sdpa"


def load_model(path: str, config, precision: str, attn_implementation: str = "sdpa"):
    """The base weights in the training dtype (fp32 for 'fp32', else half precision) under ``config``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=DTYPES[precision], attn_implementation=attn_implementation
    )


@torch.no_grad()
def check_fp16(model, input_ids: torch.Tensor) -> None:
    """fp16 training on a model whose activations leave fp16's range is refused before any step (use bf16)."""
    out = model(input_ids=input_ids, output_hidden_states=True)
    peak = max(float(h.float().abs().nan_to_num(float("inf")).max()) for h in (*out.hidden_states, out.logits))
    if peak >= FP16_MAX:
        raise ValueError(
            f"precision='fp16': activations reach {peak:g} (fp16 max {FP16_MAX:g}) and overflow; use --precision bf16"
        )
