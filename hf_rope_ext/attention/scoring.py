"""What one attention-level method provides, and the table of them (name -> scorer).

A scorer turns one layer call (unrotated q/k/v and positions) into score bands per query chunk:
``prepare`` works on the whole call once (rotating keys, values), ``bands`` builds one query chunk's bands,
``finish`` post-processes that chunk's attention output (RoPER rotates it back). Chunks keep the number of
[c, kv] score matrices alive per layer bounded whatever the length. The ``fast_*`` methods serve ``fast``
(the sdpa path): rotated keys/values remembered across decode steps, chunks sized only by the method's needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import registry
from . import rotated_cache
from .kernel import Bands
from .lse import expand_heads
from .rotation import base_inv_freq, rotate
from .table import SCORERS


@dataclass
class Call:
    """One layer call; ``prepare`` expands kv heads to the query heads (GQA), the fast path does not."""

    query: torch.Tensor  # [B, H, q, d], unrotated
    key: torch.Tensor  # [B, Hkv, kv, d], unrotated (H after ``prepare``)
    value: torch.Tensor  # [B, Hkv, kv, dv]
    q_pos: torch.Tensor  # [B, q] int64
    k_pos: torch.Tensor  # [B, kv] int64
    inv_freq: torch.Tensor  # [r/2] float64, plain RoPE theta_i of the rotary dims r
    params: dict  # this layer's rope_parameters (defaults filled in)
    score_scale: float = 1.0  # multiplies the softmax scale (a dynamic type's attention factor, squared)
    memory: rotated_cache.Memory | None = None  # where rotated rows are remembered between calls (decode)
    state: dict = field(default_factory=dict)  # what ``prepare`` computed for all chunks


class Scorer:
    """Plain RoPE scores; subclasses change the bands, the values or the output."""

    bands_count: int = 1  # score matrices per chunk

    def frequencies(self, config, layer_type, q_pos, k_pos, device) -> tuple[torch.Tensor, float]:
        """(theta_i [r/2] float64, score scale) this call rotates by: plain RoPE for the attention-level types."""
        return base_inv_freq(config, layer_type, device), 1.0

    def chunk_limit(self, call: Call) -> int | None:
        """An upper bound on query rows per chunk that the method itself needs (None: memory decides)."""
        return None

    def segments(self, call: Call) -> list[tuple[int, int]]:
        """Query row ranges that chunks must not straddle."""
        return [(0, call.query.shape[2])]

    def prepare(self, call: Call) -> None:
        heads = call.query.shape[1]
        call.key, call.value = expand_heads(call.key, heads), expand_heads(call.value, heads)
        call.state["key"] = rotate(call.key, call.k_pos, call.inv_freq)
        call.state["value"] = call.value

    def bands(self, call: Call, rows: slice) -> Bands:
        q = rotate(call.query[:, :, rows], call.q_pos[:, rows], call.inv_freq)
        return Bands([q], [call.state["key"]])

    def finish(self, call: Call, out: torch.Tensor, rows: slice) -> torch.Tensor:
        return out

    def fast_chunks(self, call: Call) -> list[slice]:
        """Query row chunks of the fast path: the segments, cut to ``chunk_limit`` rows where there is one."""
        limit = self.chunk_limit(call)
        return [
            slice(i, min(i + (limit or stop), stop))
            for start, stop in self.segments(call)
            for i in range(start, stop, limit or stop - start)
        ]

    def fast_keys(self, module, call: Call, old_rows: int) -> torch.Tensor:
        """Keys [B, Hkv, kv, d] rotated by their positions (rows before ``old_rows`` remembered from earlier steps)."""
        if "fast_key" not in call.state:
            tag = ("key", tuple(call.inv_freq.tolist()))
            call.state["fast_key"] = rotated_cache.rotated(
                call.memory, "key", tag, call.key, call.k_pos, old_rows, lambda x, p: rotate(x, p, call.inv_freq)
            )
        return call.state["fast_key"]

    def fast_values(self, module, call: Call, old_rows: int) -> torch.Tensor:
        return call.value

    def fast_query_keys(self, module, call: Call, rows: slice, old_rows: int):
        """(queries [B, H, c, d], keys [B, Hkv, kv, d]) of one chunk, ready for plain attention."""
        q = rotate(call.query[:, :, rows], call.q_pos[:, rows], call.inv_freq)
        return q, self.fast_keys(module, call, old_rows)


def filled(params: dict, method: registry.RopeMethod) -> dict:
    """``params`` with this method's defaults for keys absent or None."""
    return {**params, **{k: registry.param_value(params, method, k) for k in method.params}}


def routes_through_attention(name: str, config) -> bool:
    """Whether ``name`` on this config rotates inside the attention function (identity in the rotary module).

    Attention-level types always do. The package's dynamic frequency types do on the families whose attention
    modules the attention function serves, so cached (unrotated) keys are re-rotated with the frequencies in
    force; elsewhere they run through transformers' own dynamic updater.
    """
    from .params import FAMILIES

    if name not in SCORERS:  # transformers' own types and the static frequency types
        return False
    method = registry.get_method(name)
    return method.kind == "attention" or getattr(config, "model_type", None) in FAMILIES


def config_routes(config) -> bool:
    """Whether a model of ``config`` rotates some layer inside the attention function (one of the package's types,
    flat or per layer type), i.e. whether its cache should keep rotated rows (``cache_layers.adopt``)."""
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
    return any(name in SCORERS and routes_through_attention(name, text) for name in names)
