"""What an attention module's config asks of the attention function, resolved once per module (:class:`Layer`).

Per call, ``resolve`` reads the module's rope_parameters (its layer type's entry when nested) to see whether they
name a package type that rotates inside attention (stock modules stop there: the stock function runs, traced by
torch.compile as before); for such a module everything else (the declaration, defaults filled in, the
frequencies and the rotation's identity) is resolved at its first call and kept until its rope_parameters change.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from ..frequencies.common import inv_freq64, rope_setup
from ..models import is_rope_free_layer
from ..types import registry
from .engine.call import key_positions
from .methods.form import PLAIN, AttentionForm
from .methods.params import FAMILIES


def layer_rope(module) -> tuple[dict, str | None] | None:
    """(rope_parameters of this attention module's layer, layer_type or None when flat), or None when it has none.

    Nested per layer type (Gemma 3's local/global layers) when the entry of the module's ``layer_types[layer_idx]``
    is a dict, as the rotary module reads them; else flat (Qwen2 and Gemma 2 have ``layer_types`` but flat ones).
    """
    config = getattr(module, "config", None)
    params = getattr(config, "rope_parameters", None)
    if not params:
        return None
    layer_types = getattr(config, "layer_types", None)
    layer_idx = getattr(module, "layer_idx", None)
    if layer_types is not None and layer_idx is not None and layer_types[layer_idx] in params:
        layer_type = layer_types[layer_idx]
        refuse_flat_beside_nested(config, params)
        return params[layer_type] or None, layer_type  # None: a layer without RoPE
    if "rope_type" in params or "type" in params:
        return params, None
    return None


def refuse_flat_beside_nested(config, params: dict) -> None:
    """A package type given flat to a config with per-layer-type parameters would be ignored: refuse it."""
    stray = params.get("rope_type", params.get("type"))
    if stray is not None and registry.find(stray) is not None:
        nested = sorted(k for k, v in params.items() if isinstance(v, dict))
        raise ValueError(
            f"rope_parameters['rope_type']={stray!r} is set beside the per-layer-type entries {nested} of "
            f"model_type={getattr(config, 'model_type', None)!r}, whose rotary module reads only those: put the type "
            f"in each layer type's dict, e.g. rope_parameters={{{nested[0]!r}: {{'rope_type': {stray!r}, ...}}, ...}}"
        )


def routes_through_attention(name: str, config) -> bool:
    """Whether ``name`` on this config rotates inside the attention function (identity in the rotary module).

    Attention-level types always do. The package's dynamic frequency types do on the families whose attention
    modules the attention function serves, so cached (unrotated) keys are re-rotated with the frequencies in
    force; elsewhere they run through transformers' own dynamic updater.
    """
    method = registry.find(name)
    if method is None or not (method.kind == "attention" or method.dynamic):
        return False
    return method.kind == "attention" or getattr(config, "model_type", None) in FAMILIES


def config_routes(config) -> bool:
    """Whether a model of ``config`` rotates some layer inside the attention function (one of the package's types,
    flat or per layer type), i.e. whether its cache should keep rotated rows."""
    text = config
    if hasattr(config, "get_text_config"):
        try:
            text = config.get_text_config(decoder=True)
        except ValueError:  # a composite config with several text configs: its own rope_parameters are read
            text = config
    params = getattr(text, "rope_parameters", None)
    params = params if isinstance(params, dict) else {}
    flat = "rope_type" in params or "type" in params
    dicts = [params] if flat else [v for v in params.values() if isinstance(v, dict)]
    names = {d.get("rope_type", d.get("type")) for d in dicts}
    return any(routes_through_attention(name, text) for name in names)


@dataclass
class Layer:
    """One attention module's rope request, resolved: what every call of the module needs."""

    name: str  # the package's rope_type
    method: registry.RopeMethod
    form: AttentionForm  # the method's declaration (plain RoPE for the dynamic frequency types)
    params: dict  # the layer's rope_parameters, defaults filled in
    layer_type: str | None
    rope: dict  # the rope_parameters dict it was resolved from ...
    snapshot: dict  # ... and a copy, to notice changes made in place
    constants: dict = field(default_factory=dict)  # values of the layer alone, per device (``Call.constant``)

    def frequencies(self, config, q_pos: torch.Tensor, mask, kv: int, device, tagged: bool = True):
        """(theta_i [r/2] float64, score scale, the rotation's identity) of a call with queries at ``q_pos`` and
        ``kv`` keys under ``mask`` (a dynamic type's frequencies depend on the farthest key position); the identity
        (read back from the device once per layer) only when ``tagged``, else None."""
        if not self.method.dynamic:
            key = ("frequencies", device)  # a torch.device (the query's)
            if key not in self.constants:
                inv_freq, factor = underneath(config, self.params, self.layer_type, device)
                self.constants[key] = (inv_freq, factor**2)
            inv_freq, scale = self.constants[key]
            if tagged and ("tag", device) not in self.constants:
                self.constants["tag", device] = self.tag(inv_freq)
            return inv_freq, scale, self.constants["tag", device] if tagged else None
        traced = self.method.traced_frequencies
        if torch.compiler.is_compiling() and traced is not None:  # the length stays on the device
            length = key_positions(q_pos, mask, kv).max() + 1
            inv_freq, attention_factor = traced(config, device, length, self.layer_type)
            return inv_freq.double(), attention_factor**2, None
        length = int(key_positions(q_pos, mask, kv).max()) + 1  # positions 0 .. length-1 in force (cached keys too)
        inv_freq, attention_factor = self.method.frequencies(config, device, length, self.layer_type)
        return inv_freq.double(), float(attention_factor) ** 2, self.tag(inv_freq.double()) if tagged else None

    def kept_tag(self, device) -> tuple | None:
        """The rotation's identity an earlier (eager) call on ``device`` computed, else None (fixed frequencies)."""
        return None if self.method.dynamic else self.constants.get(("tag", device))

    def tag(self, inv_freq: torch.Tensor) -> tuple:
        return (self.name, tuple(inv_freq.tolist()), str(sorted(self.params.items())))


def base_inv_freq(config, layer_type: str | None = None, device=None) -> torch.Tensor:
    """theta_i = b^(-2i/d) of plain RoPE for this config (rotary dim d), shape [d/2], float64 (shared: read only)."""
    setup = rope_setup(config, layer_type)
    return inv_freq64(setup.base, setup.dim, str(torch.device(device or "cpu")))


def underneath(config, params: dict, layer_type: str | None, device) -> tuple[torch.Tensor, float]:
    """(theta_i [r/2] float64, attention factor) the layer rotates by: plain RoPE's, or those of the frequency-level
    type ``params["frequencies"]`` at ``frequency_factor`` (transformers' rope registry computes them on a copy of
    the config whose rope_parameters name that type; L0 and rope_theta are the layer's)."""
    kind = params.get("frequencies") or "plain"
    if kind == "plain":
        return base_inv_freq(config, layer_type, device), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    keep = {k: params[k] for k in ("rope_theta", "partial_rotary_factor") if params.get(k) is not None}
    pretrained = int(params.get("original_max_position_embeddings") or config.max_position_embeddings)
    rope = {**keep, "rope_type": kind, "factor": float(params["frequency_factor"])}
    view = copy.copy(config)
    view.rope_parameters = {**rope, "original_max_position_embeddings": pretrained}
    inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](view, device)
    return inv_freq.double(), float(factor)


# the attribute of an attention module that keeps its Layer: on the module itself (not in a table of modules, whose
# size torch.compile would guard on, recompiling whenever some other model is freed)
KEPT = "_hf_rope_ext_layer"


def resolve(module) -> Layer | None:
    """The resolved rope request of ``module`` when it names a package type that rotates inside attention, else
    None (the stock attention function serves it)."""
    found = layer_rope(module)
    if found is None or found[0] is None or is_rope_free_layer(module):
        return None
    rope, layer_type = found
    name = rope.get("rope_type", rope.get("type"))
    if not routes_through_attention(name, module.config):
        return None
    layer = module.__dict__.get(KEPT)
    if layer is None or layer.rope is not rope or layer.layer_type != layer_type or layer.snapshot != rope:
        layer = build(name, rope, layer_type, module.config)
        module.__dict__[KEPT] = layer
    return layer


def build(name: str, rope: dict, layer_type: str | None, config) -> Layer:
    method = registry.get_method(name)
    form = method.attention if method.attention is not None else PLAIN
    return Layer(name, method, form, registry.filled(rope, method, config), layer_type, rope, dict(rope))
