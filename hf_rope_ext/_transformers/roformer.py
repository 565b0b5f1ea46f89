"""Seam: RoFormer, which has no extension point (its positional table and rotation take no config). Installs
(:func:`install`, idempotent; :func:`uninstall` restores all of it, live models included):

1. ``RoFormerEncoder.__init__`` and ``.forward`` wrapped, nothing else of the class. Each calls :func:`sync`, which
   reads the config's rope request (``rope_parameters`` / ``rope_scaling``, ``rope_theta``, ``rope_layout``).
   Without one the encoder is left as transformers built it (stock, bit for bit; an input longer than the table
   gets an error saying what to set instead of an IndexError from the lookup). With one, the request is validated
   (at build time, so bad input fails early) and per-instance changes are attached (:func:`attach`: the functions
   of ``hf_rope_ext.attention.roformer``; the table weight stays, so checkpoints load unchanged). ``forward``
   re-checks the request, so a config changed after loading (``convert_layout`` setting ``rope_layout``) takes
   effect; the check is one tuple comparison.
2. ``RoFormerConfig`` gets ``rope_parameters``, ``rope_theta`` and ``rope_layout`` as attributes that read empty
   ({} for rope_parameters, None for the others) once the config is built and are absent while transformers'
   ``__post_init__`` runs. That is what lets ``from_pretrained(path, rope_parameters=...)`` reach the config
   (transformers only sets kwargs the config already has) while stock configs, and the json they save, stay as
   they were. Replacing a rope_parameters that records a rope_theta by one without it is refused (KeyError), as
   the registry does for other families.
3. In ``RoFormerConfig``'s list of strict-dataclass validators, transformers' ``validate_rope`` is swapped for
   :func:`validate_roformer_rope`, the whole RoFormer check with RoFormer's defaults (base 10000) filled in:
   transformers never standardizes a RoFormer config, so its validators would see an incomplete dict.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache
from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin
from transformers.models.roformer import configuration_roformer, modeling_roformer

from ..attention.roformer import CONFIG_KEYS, RoformerRope, rope_request, rotate_output_back, rotate_qkv, sin_cos_rows

_STOCK: dict[str, Callable] = {}  # the wrapped RoFormerEncoder methods, while installed
_ATTACHED: weakref.WeakSet = weakref.WeakSet()  # encoders carrying per-instance changes


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


def give_way(config_cls) -> None:
    """Uninstall the wrappers of another hf_rope_ext copy (a ``--remote-code`` export's vendored package, imported
    first) unless encoders it built are live; raise for any other owner of the config attributes."""
    key = next((k for k in CONFIG_KEYS if k in vars(config_cls)), None)
    if key is None:
        return
    owner = sys.modules.get(type(vars(config_cls)[key]).__module__)
    if type(vars(config_cls)[key]).__name__ != "LateDefault" or not hasattr(owner, "uninstall"):
        raise ValueError(f"RoFormerConfig already defines {key!r}; hf_rope_ext will not replace it")
    if len(owner._ATTACHED):
        raise ValueError(
            f"a RoFormer model built by another copy of hf_rope_ext ({owner.__name__}, an export's remote code) is "
            "in use; import hf_rope_ext before loading that model"
        )
    owner.uninstall()


def install() -> None:
    """Wrap RoFormerEncoder.__init__/forward and add the config attributes (safe to call any number of times)."""
    if installed():
        return
    encoder_cls, config_cls = modeling_roformer.RoFormerEncoder, configuration_roformer.RoFormerConfig
    give_way(config_cls)
    _STOCK.update(
        __init__=encoder_cls.__init__, forward=encoder_cls.forward, validators=config_cls.__class_validators__
    )
    encoder_cls.__init__ = functools.wraps(_STOCK["__init__"])(_init)
    encoder_cls.forward = functools.wraps(_STOCK["forward"])(_forward)
    stock_rope = RotaryEmbeddingConfigMixin.validate_rope
    config_cls.__class_validators__ = [validate_roformer_rope if v is stock_rope else v for v in _STOCK["validators"]]
    for key in CONFIG_KEYS:
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
    for key in CONFIG_KEYS:
        if isinstance(vars(config_cls).get(key), LateDefault):
            delattr(config_cls, key)
