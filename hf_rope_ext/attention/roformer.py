"""RoFormer's rope at runtime: what a config asks for (validated, resolved once: :class:`RoformerRope`) and the
tensors its encoder then computes: rope scaling of every frequency-level type, inputs past its table, RoPER, both
layouts.

transformers' RoFormer reads no rope registry: ``RoFormerEncoder`` builds a fixed
``RoFormerSinusoidalPositionalEmbedding`` table (``max_position_embeddings`` rows, base 10000) and every
``RoFormerSelfAttention`` rotates q/k (and v when ``rotary_value``) with its static, interleaved
``apply_rotary_position_embeddings``. The seam ``hf_rope_ext._transformers.roformer`` attaches the functions of this
module to encoders whose config asks for a rope (per instance):

- the positional embedding returns rows in the stock table's format, [L, d] = [sin * s | cos * s] per pair,
  computed from ``inv_freq`` at positions past..past+L-1 (any length; s is the type's attention factor);
  dynamic types recompute ``inv_freq`` with the current length;
- each self-attention's ``apply_rotary_position_embeddings`` (:func:`rotate_qkv`) rotates q/k in
  ``config.rope_layout`` (default "interleaved", RoFormer's native) in fp32; values (``rotary_value`` and RoPER) are
  always turned in RoFormer's native interleaved pairs by a pure rotation, because layout conversion permutes only
  q/k rows;
- ``rope_type="roper"``: values rotated by their position and :func:`rotate_output_back` turning the output back by
  the query position (RoPER); the KV cache keeps rotated keys and values, as stock does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..frequencies.common import inv_freq_for_base, rope_setup
from ..models.family import check_layout, head_dim_of
from ..types import registry
from .rotation import cos_sin, turn

NATIVE_LAYOUT = "interleaved"
ROFORMER_BASE = 10000.0  # the base transformers hard-codes in RoFormer's sinusoidal table
ROPER = "roper"
_SCALED_LENGTH_TYPES = ("llama3", "yarn", "longrope")  # transformers fills original_max_position_embeddings for these
CONFIG_KEYS = ("rope_parameters", "rope_theta", "rope_layout")  # the config attributes of a rope request


# ---------------------------------------------------------------------------------------------------------------
# what a config asks for


def supported_types() -> list[str]:
    """Every rope_type a RoFormer model accepts: default, transformers' own, this package's frequency types, roper."""
    ours = {m.name: m for m in registry.methods()}
    builtin = [name for name in ROPE_INIT_FUNCTIONS if name not in ours]
    frequency = [m.name for m in ours.values() if m.kind == "frequency"]
    return sorted({"default", *builtin, *frequency, ROPER})


def rope_request(config) -> tuple | None:
    """The config's rope settings as a comparable tuple, or None when it sets none (stock RoFormer)."""
    values = tuple(getattr(config, key, None) for key in CONFIG_KEYS)
    return None if all(v is None or v == {} for v in values) else values


def resolved_theta(config, params: dict) -> float:
    """rope_theta from rope_parameters or the config; RoFormer's 10000 when neither sets it; both set must agree."""
    inner, outer = params.get("rope_theta"), getattr(config, "rope_theta", None)
    if inner is not None and outer is not None and inner != outer:
        raise ValueError(
            f"rope_parameters['rope_theta']={inner!r} and config.rope_theta={outer!r} disagree; set only one"
        )
    theta = inner if inner is not None else outer if outer is not None else ROFORMER_BASE
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise ValueError(f"rope_theta={theta!r} is invalid for RoFormer: expected a finite number > 0")
    return float(theta)


def normalized_parameters(config) -> dict:
    """A flat rope_parameters dict with rope_type and rope_theta filled in, as transformers standardizes them."""
    raw = getattr(config, "rope_parameters", None) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"rope_parameters={raw!r} is invalid for RoFormer: expected a dict (or None)")
    params = {k: v for k, v in raw.items() if k != "type"}
    params["rope_type"] = raw.get("rope_type", raw.get("type")) or "default"
    params["rope_theta"] = resolved_theta(config, raw)
    if params["rope_type"] in _SCALED_LENGTH_TYPES:
        params.setdefault("original_max_position_embeddings", config.max_position_embeddings)
    return params


class ConfigView:
    """The config as a frequency function sees it: normalized rope_parameters, every other attribute delegated."""

    def __init__(self, config, params: dict):
        self._config = config
        self.rope_parameters = params

    def __getattr__(self, name):
        if name == "_config" or name.startswith("__"):  # not built yet (copy, pickle): nothing to delegate to
            raise AttributeError(name)
        return getattr(self._config, name)

    def standardize_rope_params(self) -> None:
        """transformers' functions call this; the parameters are complete already and the user's config stays."""


def default_frequencies(config, device=None, seq_len=None, layer_type=None):
    """Plain RoPE theta_i = b^(-2i/d) in float64 (RoFormer's table is float64 too), attention factor 1."""
    s = rope_setup(config, layer_type)
    return inv_freq_for_base(s.base, s.dim, device, dtype=torch.float64), 1.0


def frequency_function(rope_type: str) -> tuple[Callable, bool]:
    """(init function with ROPE_INIT_FUNCTIONS' signature, whether it depends on the sequence length)."""
    if rope_type in ("default", ROPER) and rope_type not in registry.available_rope_types():
        return default_frequencies, False
    if rope_type in registry.available_rope_types():
        method = registry.get_method(rope_type)
        if method.kind != "frequency" and rope_type != ROPER:
            raise ValueError(
                f"rope_parameters['rope_type']={rope_type!r} is an attention-level type that RoFormer does not "
                f"support (of the attention-level types RoFormer runs only {ROPER!r}); allowed: {supported_types()}"
            )
        return method.frequencies, method.dynamic
    if rope_type in ROPE_INIT_FUNCTIONS:
        return ROPE_INIT_FUNCTIONS[rope_type], registry.follows_length(rope_type)
    raise ValueError(
        f"rope_parameters['rope_type']={rope_type!r} is not a rope type of RoFormer; allowed: {supported_types()}"
    )


def validate_parameters(config, params: dict) -> None:
    """The registry's validator for this package's types, transformers' for its own (``default`` included).

    As on every other family, transformers' validators refuse missing keys and only warn about keys a type does
    not use (transformers' own rope tests pass ``original_max_position_embeddings`` with ``default``).
    """
    rope_type = params["rope_type"]
    if rope_type in registry.available_rope_types():
        # roper's own family check names the rope-registry attention modules; RoFormer runs RoPER by itself
        registry.validate(params, None if rope_type == ROPER else config)
        if rope_type == ROPER and params.get("value_rotary_factor") != 1:
            raise ValueError(
                f"rope_parameters['value_rotary_factor']={params.get('value_rotary_factor')!r} is not supported by "
                "RoFormer, whose rotary_value turns every value dim with its table: allowed 1.0"
            )
        return
    validator = getattr(config, f"_validate_{rope_type}_rope_parameters", None)
    if validator is not None:
        validator(dict(params), ignore_keys=getattr(config, "ignore_keys_at_rope_validation", None))


# ---------------------------------------------------------------------------------------------------------------
# the resolved request


@dataclass
class RoformerRope:
    """Everything an attached encoder needs, resolved and validated once from the config."""

    view: ConfigView
    init_fn: Callable
    dynamic: bool
    layout: str
    roper: bool
    max_positions: int
    _static: dict = field(default_factory=dict)  # device -> (inv_freq, scale) for length-independent types

    @classmethod
    def from_config(cls, config) -> RoformerRope:
        params = normalized_parameters(config)
        init_fn, dynamic = frequency_function(params["rope_type"])
        validate_parameters(config, params)
        layout = check_layout(getattr(config, "rope_layout", None) or NATIVE_LAYOUT)
        rope = cls(
            ConfigView(config, params),
            init_fn,
            dynamic,
            layout,
            params["rope_type"] == ROPER,
            config.max_position_embeddings,
        )
        rope.check_dim(head_dim_of(config))
        return rope

    def check_dim(self, head_dim: int) -> None:
        pairs = self.frequencies(None, self.max_positions)[0].shape[-1]
        if not 0 < 2 * pairs <= head_dim:
            raise ValueError(
                f"rope_parameters={self.view.rope_parameters!r} gives {pairs} rotary pairs for head_dim={head_dim}; "
                "expected between 1 and head_dim/2"
            )

    def frequencies(self, device, length: int):
        """(inv_freq [d/2], attention factor) for a sequence of ``length`` tokens."""
        if not self.dynamic:
            key = str(device)
            if key not in self._static:
                self._static[key] = self.init_fn(self.view, device)
            return self._static[key]
        stretched = "dynamic" in self.view.rope_parameters["rope_type"]  # transformers' rule: never below max
        seq_len = max(length, self.max_positions) if stretched else length
        return self.init_fn(self.view, device, seq_len=seq_len)


# ---------------------------------------------------------------------------------------------------------------
# tensors


def sin_cos_rows(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> torch.Tensor:
    """positions [L] x inv_freq [d/2] -> [L, d] = [sin * scale | cos * scale], the stock table's row format, by the
    package's one precision rule (``attention.rotation``: float64 angles, cast to float32)."""
    cos, sin = cos_sin(positions, inv_freq, scale)  # [L, d/2] each
    return torch.cat((sin, cos), dim=-1)


def unit(sin: torch.Tensor, cos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Divide out the attention factor: a pure rotation for values and outputs."""
    r = torch.hypot(sin, cos)
    return sin / r, cos / r


def rotate_qkv(sinusoidal_pos, query, key, value=None, *, layout: str):
    """Replacement of ``apply_rotary_position_embeddings``: sinusoidal_pos [1, 1, L, d] ([sin*s | cos*s]),
    query/key/value [B, H, L, head_dim]; q/k in ``layout``, the value by a pure rotation in native pairs."""
    sin, cos = sinusoidal_pos.chunk(2, dim=-1)  # [1, 1, L, d/2] per pair
    query, key = turn(query, cos, sin, layout), turn(key, cos, sin, layout)
    if value is None:
        return query, key
    usin, ucos = unit(sin, cos)
    return query, key, turn(value, ucos, usin, NATIVE_LAYOUT)


def rotate_output_back(module, args, kwargs, output):
    """RoPER's second half (forward hook): turn each head of the context [B, L, H*hd] back by its query position."""
    pos = kwargs.get("sinusoidal_pos", args[2] if len(args) > 2 else None)
    if pos is None or kwargs.get("encoder_hidden_states") is not None:
        return output
    context = output[0]
    heads = context.view(*context.shape[:-1], module.num_attention_heads, module.attention_head_size)
    usin, ucos = unit(*pos[0, 0, :, None].chunk(2, dim=-1))  # [L, 1, d/2] each, against heads [B, L, H, hd]
    back = turn(heads, ucos, -usin, NATIVE_LAYOUT)
    return (back.reshape(context.shape), *output[1:])
