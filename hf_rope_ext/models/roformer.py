"""RoFormer at runtime: rope scaling of every frequency-level type, inputs past its table, RoPER, both layouts.

Why a patch at all: transformers' RoFormer reads no rope registry. ``RoFormerEncoder`` builds a fixed
``RoFormerSinusoidalPositionalEmbedding`` table (``max_position_embeddings`` rows, base 10000) and every
``RoFormerSelfAttention`` rotates q/k (and v when ``rotary_value``) with its static, interleaved
``apply_rotary_position_embeddings``. Neither takes a config, so there is no extension point to register into.

What :func:`install` changes (idempotent; :func:`uninstall` restores all of it, including live models):

1. ``RoFormerEncoder.__init__`` and ``.forward`` are wrapped, nothing else of the class. Each calls :func:`sync`,
   which reads the config's rope request (``rope_parameters`` / ``rope_scaling``, ``rope_theta``, ``rope_layout``).
   Without one the encoder is left as transformers built it (stock, bit for bit; an input longer than the table
   gets an error saying what to set instead of an IndexError from the lookup). With one, the request
   is validated (at build time, so bad input fails early) and per-instance changes are attached (below).
   ``forward`` re-checks the request, so a config changed after loading (``convert_layout`` setting
   ``rope_layout``) takes effect; the check is one tuple comparison.
2. ``RoFormerConfig`` gets ``rope_parameters``, ``rope_theta`` and ``rope_layout`` as attributes that read empty
   ({} for rope_parameters, None for the others) once the config is built and are absent while transformers'
   ``__post_init__`` runs. That is what lets
   ``from_pretrained(path, rope_parameters=...)`` reach the config (transformers only sets kwargs the config
   already has) while stock configs, and the json they save, stay as they were. Replacing a rope_parameters
   that records a rope_theta by one without it is refused (KeyError), as the registry does for other families.
3. In ``RoFormerConfig``'s list of strict-dataclass validators, transformers' ``validate_rope`` is swapped for
   :func:`validate_roformer_rope`, the whole RoFormer check with RoFormer's defaults (base 10000) filled in:
   transformers never standardizes a RoFormer config, so its validators would see an incomplete dict.

Per-instance changes of an encoder with a rope request (the table weight stays, so checkpoints load unchanged):

- ``embed_positions.forward`` returns rows in the stock table's format, [L, d] = [sin * s | cos * s] per pair,
  computed from ``inv_freq`` at positions past..past+L-1 (any length; s is the type's attention factor);
  dynamic types recompute ``inv_freq`` with the current length.
- each self-attention's ``apply_rotary_position_embeddings`` rotates q/k in ``config.rope_layout``
  (default "interleaved", RoFormer's native) in fp32; values (``rotary_value`` and RoPER) are always turned in
  RoFormer's native interleaved pairs by a pure rotation, because layout conversion permutes only q/k rows.
- ``rope_type="roper"``: values rotated by their position and a forward hook on the self-attention rotating its
  output back by the query position (seed 004); the KV cache keeps rotated keys and values, as stock does.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin
from transformers.models.roformer import configuration_roformer, modeling_roformer

from .. import registry
from ..frequencies.common import head_dim_of, inv_freq_for_base, rope_setup
from ..rotary import apply_rotary, check_layout

NATIVE_LAYOUT = "interleaved"
ROFORMER_BASE = 10000.0  # the base transformers hard-codes in RoFormer's sinusoidal table
ROPER = "roper"
_SCALED_LENGTH_TYPES = ("llama3", "yarn", "longrope")  # transformers fills original_max_position_embeddings for these
_CONFIG_KEYS = ("rope_parameters", "rope_theta", "rope_layout")

_STOCK: dict[str, Callable] = {}  # the wrapped RoFormerEncoder methods, while installed
_ATTACHED: weakref.WeakSet = weakref.WeakSet()  # encoders carrying per-instance changes


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
    values = tuple(getattr(config, key, None) for key in _CONFIG_KEYS)
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
        return ROPE_INIT_FUNCTIONS[rope_type], "dynamic" in rope_type or rope_type == "longrope"
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
    """positions [L] x inv_freq [d/2] -> [L, d] = [sin * scale | cos * scale], the stock table's row format.

    Angles in float64 (float32 where the device has none) with autocast off, then cast to float32.
    """
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    with torch.autocast(device_type=positions.device.type, enabled=False):
        a = positions.to(wide)[:, None] * inv_freq.to(positions.device, wide)
        return (torch.cat((a.sin(), a.cos()), dim=-1) * scale).float()


def per_dim(pairs: torch.Tensor, layout: str) -> torch.Tensor:
    """[..., d/2] per pair -> [..., d] per rotary dim, in the order of ``layout``."""
    return torch.cat((pairs, pairs), dim=-1) if layout == "half" else pairs.repeat_interleave(2, dim=-1)


def unit(sin: torch.Tensor, cos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Divide out the attention factor: a pure rotation for values and outputs."""
    r = torch.hypot(sin, cos)
    return sin / r, cos / r


def rotate_qkv(sinusoidal_pos, query, key, value=None, *, layout: str):
    """Replacement of ``apply_rotary_position_embeddings``: sinusoidal_pos [1, 1, L, d] ([sin*s | cos*s]),
    query/key/value [B, H, L, head_dim]; q/k in ``layout``, the value by a pure rotation in native pairs."""
    sin, cos = sinusoidal_pos.chunk(2, dim=-1)
    c, s = per_dim(cos, layout), per_dim(sin, layout)
    query, key = apply_rotary(query, c, s, layout), apply_rotary(key, c, s, layout)
    if value is None:
        return query, key
    usin, ucos = unit(sin, cos)
    return query, key, apply_rotary(value, per_dim(ucos, NATIVE_LAYOUT), per_dim(usin, NATIVE_LAYOUT), NATIVE_LAYOUT)


def rotate_output_back(module, args, kwargs, output):
    """RoPER's second half (forward hook): turn each head of the context [B, L, H*hd] back by its query position."""
    pos = kwargs.get("sinusoidal_pos", args[2] if len(args) > 2 else None)
    if pos is None or kwargs.get("encoder_hidden_states") is not None:
        return output
    context = output[0]
    heads = context.view(*context.shape[:-1], module.num_attention_heads, module.attention_head_size)
    usin, ucos = unit(*pos[0, 0].chunk(2, dim=-1))  # [L, d/2] each
    c, s = per_dim(ucos, NATIVE_LAYOUT)[:, None], per_dim(usin, NATIVE_LAYOUT)[:, None]  # [L, 1, d]
    back = apply_rotary(heads, c, -s, NATIVE_LAYOUT)
    return (back.reshape(context.shape), *output[1:])


def stock_arguments(function, *args, **kwargs) -> list:
    """The arguments of a call to ``function`` (a method of the installed transformers), in the order of its
    parameters, defaults filled in: one reading for every release, whatever it names them (RoFormer's cache length
    is ``past_key_values_length`` up to 5.23, ``cache_length`` from 5.24; transformers passes it by position)."""
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments.values())


def rope_rows(module, rope: RoformerRope, *args, **kwargs):
    """Replacement of the positional embedding's forward (input_ids_shape, cached length, position_ids): rows for any
    positions, from frequencies."""
    stock = modeling_roformer.RoFormerSinusoidalPositionalEmbedding.forward
    _, input_ids_shape, cached, position_ids = stock_arguments(stock, module, *args, **kwargs)
    device = module.weight.device
    if position_ids is None:
        length = cached + input_ids_shape[1]
        position_ids = torch.arange(cached, length, device=device)
    else:
        length = int(position_ids.max()) + 1
    inv_freq, scale = rope.frequencies(device, length)
    return sin_cos_rows(position_ids, inv_freq, scale)


# ---------------------------------------------------------------------------------------------------------------
# attaching to an encoder


@dataclass
class _Attached:
    request: tuple
    rope: RoformerRope
    rotary_value: dict  # self-attention module -> its rotary_value before RoPER set it
    hooks: list


def self_attentions(encoder) -> list:
    return [layer.attention.self for layer in encoder.layer]


def detach(encoder) -> None:
    """Undo :func:`attach`: the encoder is stock again."""
    state = encoder.__dict__.pop("_hf_rope_ext", None)
    if state is None:
        return
    encoder.embed_positions.__dict__.pop("forward", None)
    for attn in self_attentions(encoder):
        attn.__dict__.pop("apply_rotary_position_embeddings", None)
    for attn, value in state.rotary_value.items():
        attn.rotary_value = value
    for hook in state.hooks:
        hook.remove()
    _ATTACHED.discard(encoder)


def attach(encoder) -> None:
    """Read the encoder's config and (re)attach the per-instance changes it asks for; none for a stock config."""
    request = rope_request(encoder.config)
    rope = RoformerRope.from_config(encoder.config) if request is not None else None  # validate before changing
    detach(encoder)
    if rope is None:
        return
    encoder.embed_positions.forward = functools.partial(rope_rows, encoder.embed_positions, rope)
    state = _Attached(copy.deepcopy(request), rope, {}, [])
    for attn in self_attentions(encoder):
        attn.apply_rotary_position_embeddings = functools.partial(rotate_qkv, layout=rope.layout)
        if rope.roper:
            state.rotary_value[attn] = attn.rotary_value
            attn.rotary_value = True
            state.hooks.append(attn.register_forward_hook(rotate_output_back, with_kwargs=True))
    encoder.__dict__["_hf_rope_ext"] = state
    _ATTACHED.add(encoder)


def sync(encoder) -> None:
    """Attach, re-attach or detach when the config's rope request differs from what the encoder carries."""
    state = encoder.__dict__.get("_hf_rope_ext")
    if (state.request if state is not None else None) != rope_request(encoder.config):
        attach(encoder)


def rope_of(model) -> RoformerRope | None:
    """The resolved rope settings a RoFormer model (or encoder) runs with; None when it runs stock."""
    encoder = model if isinstance(model, modeling_roformer.RoFormerEncoder) else model.base_model.encoder
    sync(encoder)
    state = encoder.__dict__.get("_hf_rope_ext")
    return state.rope if state is not None else None


# ---------------------------------------------------------------------------------------------------------------
# install / uninstall


def validate_roformer_rope(self) -> None:
    """RoFormerConfig's rope validator while installed: the whole RoFormer request, RoFormer's defaults filled in."""
    if rope_request(self) is not None:
        RoformerRope.from_config(self)


class LateDefault:
    """A RoFormerConfig attribute that reads empty once the config is built, but is absent during __post_init__.

    Empty is None, or for ``rope_parameters`` a new empty dict (not stored: assign a dict to set it), so that code
    written for other rope families (``"partial_rotary_factor" in config.rope_parameters``) runs on RoFormer too.
    """

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if self.name in obj.__dict__:
            return obj.__dict__[self.name]
        # past transformers' rope check: 5.24 marks the end of __post_init__; every release sets _name_or_path after it
        if obj.__dict__.get("_post_init_done") or "_name_or_path" in obj.__dict__:
            return {} if self.name == "rope_parameters" else None
        raise AttributeError(self.name)

    def __set__(self, obj, value):
        old = obj.__dict__.get(self.name)
        if self.name == "rope_parameters" and isinstance(old, dict) and isinstance(value, dict):
            if old.get("rope_theta") is not None and value and value.get("rope_theta") is None:
                raise KeyError(
                    f"rope_parameters['rope_theta'] is missing: the new rope_parameters={value!r} replaces a dict "
                    f"that records rope_theta={old['rope_theta']!r} (base included); add the rope_theta you want"
                )
        obj.__dict__[self.name] = value

    def __delete__(self, obj):
        obj.__dict__.pop(self.name, None)


def _init(self, config, *args, **kwargs):
    _STOCK["__init__"](self, config, *args, **kwargs)
    sync(self)


class TableLengthError(ValueError, IndexError):
    """A stock RoFormer fed more positions than its table has: a ValueError naming what to set (an IndexError
    too, what stock RoFormer raises there)."""


def check_table_length(encoder, args: tuple, kwargs: dict) -> None:
    """Stock RoFormer looks positions up in a table of max_position_embeddings rows; past it, say what to set."""
    hidden = stock_arguments(_STOCK["forward"], encoder, *args, **kwargs)[1]  # [B, L, hidden]
    past = next((v for v in (*args, *kwargs.values()) if isinstance(v, Cache)), None)  # its name differs by release
    cached = past.get_seq_length() if past is not None else 0
    rows = encoder.embed_positions.weight.shape[0]
    if cached + hidden.shape[1] > rows:
        raise TableLengthError(
            f"this input needs positions 0..{cached + hidden.shape[1] - 1} ({cached} cached + {hidden.shape[1]} new "
            f"tokens) and RoFormer reads them from a table of max_position_embeddings={rows} rows. To run longer "
            "inputs, set rope parameters (positions are then computed, with no table limit): "
            "rope_parameters={'rope_type': 'default'} runs the model as trained at any length, "
            "{'rope_type': 'linear', 'factor': 2.0} or another type of `hf-rope-ext list` scales it; pass it to "
            "from_pretrained(path, rope_parameters=...) or set config.rope_parameters before building the model"
        )


def _forward(self, *args, **kwargs):
    sync(self)
    if "_hf_rope_ext" not in self.__dict__:  # stock: only the error past the table changes
        check_table_length(self, args, kwargs)
    return _STOCK["forward"](self, *args, **kwargs)


def installed() -> bool:
    return bool(_STOCK)


def install() -> None:
    """Wrap RoFormerEncoder.__init__/forward and add the config attributes (safe to call any number of times)."""
    if installed():
        return
    encoder_cls, config_cls = modeling_roformer.RoFormerEncoder, configuration_roformer.RoFormerConfig
    for key in _CONFIG_KEYS:
        if key in vars(config_cls):
            raise ValueError(f"RoFormerConfig already defines {key!r}; hf_rope_ext will not replace it")
    _STOCK.update(
        __init__=encoder_cls.__init__, forward=encoder_cls.forward, validators=config_cls.__class_validators__
    )
    encoder_cls.__init__ = functools.wraps(_STOCK["__init__"])(_init)
    encoder_cls.forward = functools.wraps(_STOCK["forward"])(_forward)
    stock_rope = RotaryEmbeddingConfigMixin.validate_rope
    config_cls.__class_validators__ = [validate_roformer_rope if v is stock_rope else v for v in _STOCK["validators"]]
    for key in _CONFIG_KEYS:
        setattr(config_cls, key, LateDefault(key))


def uninstall() -> None:
    """Restore the stock classes and detach every live encoder (safe to call any number of times)."""
    if not installed():
        return
    for encoder in list(_ATTACHED):
        detach(encoder)
    encoder_cls, config_cls = modeling_roformer.RoFormerEncoder, configuration_roformer.RoFormerConfig
    encoder_cls.__init__, encoder_cls.forward = _STOCK.pop("__init__"), _STOCK.pop("forward")
    config_cls.__class_validators__ = _STOCK.pop("validators")
    for key in _CONFIG_KEYS:
        if isinstance(vars(config_cls).get(key), LateDefault):
            delattr(config_cls, key)
