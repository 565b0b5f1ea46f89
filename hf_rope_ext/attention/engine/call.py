"""One layer call as the engine sees it (:class:`Call`): tensors, positions of queries and keys, the masks of a chunk.

The KV cache holds keys *before* rotation, so each call needs the position of every cached key:
- no cache (kv_len == q_len): key positions are the ``position_ids`` themselves (packed sequences with
  restarting positions, left padding, shifted positions are all honoured);
- with a cache (kv_len > q_len): cached keys are taken to hold consecutive positions ending at the newest
  query's position, skipping the keys no query may see (padding). This is exactly what ``generate`` produces
  (left padding included: positions = cumsum(attention_mask) - 1) and needs no state kept beside the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..mask_formats import graded, is_step_mask, step_padding
from ..methods.form import AttentionForm
from .rotated_cache import Memory


@dataclass
class Call:
    """One layer call; the reference engine expands kv heads to the query heads (GQA), the fast one does not."""

    query: torch.Tensor  # [B, H, q, d], unrotated
    key: torch.Tensor  # [B, Hkv, kv, d], unrotated
    value: torch.Tensor  # [B, Hkv, kv, dv]
    q_pos: torch.Tensor  # [B, q] int64
    key_mask: torch.Tensor | None  # the mask the key positions are read from (``key_positions``)
    inv_freq: torch.Tensor  # [r/2] float64, plain RoPE theta_i of the rotary dims r
    params: dict  # this layer's rope_parameters (defaults filled in)
    form: AttentionForm  # the method's declaration
    tag: tuple  # the rotation's identity (type, frequencies, parameters): remembered rows are reused under it only
    score_scale: float = 1.0  # multiplies the softmax scale (a dynamic type's attention factor, squared)
    memory: Memory | None = None  # where rotated rows are remembered between calls (decode)
    static: object = None  # a static cache layer's turned rows (``static_rows.StaticRows``), written as its keys are
    state: dict = field(default_factory=dict)  # what one engine computed once for all chunks
    constants: dict = field(default_factory=dict)  # values of the layer alone, kept with it across calls

    @property
    def k_pos(self) -> torch.Tensor:
        """[B, kv] int64: the keys' positions, formed on first use (a decode step on remembered rows needs none)."""
        if "k_pos" not in self.state:  # kept in ``state``, not by functools.cached_property: torch.compile traces this
            self.state["k_pos"] = key_positions(self.q_pos, self.key_mask, self.key.shape[2])
        return self.state["k_pos"]

    def key_positions(self) -> torch.Tensor:
        """``k_pos`` as a function (what ``rotated_cache`` takes: it asks only where it needs them)."""
        return self.k_pos

    def constant(self, name, compute):
        """``compute()`` on the layer's first call on this device; the kept value afterwards."""
        key = (name, self.query.device)
        if key not in self.constants:
            self.constants[key] = compute()
        return self.constants[key]


def query_positions(position_ids: torch.Tensor | None, batch: int, q_len: int) -> torch.Tensor:
    """position_ids [1 or B, q_len] -> [B, q_len] int64; a clear error when the model did not pass them."""
    if position_ids is None:
        raise ValueError(
            "position_ids=None: attention-level rope types need the position_ids the model passes to its "
            "attention function (call the attention module through its model, or pass position_ids=...)"
        )
    if position_ids.ndim != 2 or position_ids.shape[-1] != q_len:
        raise ValueError(
            f"position_ids of shape {tuple(position_ids.shape)} do not fit {q_len} queries: expected [batch, {q_len}]"
        )
    return (position_ids if position_ids.shape[0] == batch else position_ids.expand(batch, q_len)).long()


def visible_keys(mask: torch.Tensor | None, batch: int, kv_len: int, device) -> torch.Tensor:
    """[B, kv_len] bool: keys that at least one query of this call may attend (False: padding, empty slots)."""
    if mask is None:
        return torch.ones(batch, kv_len, dtype=torch.bool, device=device)
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return allowed.any(dim=-2).any(dim=1).expand(batch, kv_len)


def key_positions(q_pos: torch.Tensor, mask: torch.Tensor | None, kv_len: int) -> torch.Tensor:
    """Positions [B, kv_len] of the keys of this call (see the module docstring for the rule with a cache)."""
    batch, q_len = q_pos.shape
    if kv_len == q_len:
        return q_pos
    if mask is None:  # every key visible: consecutive positions up to the newest query's
        return q_pos[:, -1:] - torch.arange(kv_len - 1, -1, -1, device=q_pos.device)
    if mask.shape[-1] != kv_len:
        raise ValueError(f"attention mask with {mask.shape[-1]} key columns does not fit {kv_len} keys")
    visible = visible_keys(mask, batch, kv_len, q_pos.device).long()
    after = visible.sum(-1, keepdim=True) - visible.cumsum(-1)  # visible keys strictly after each key
    return q_pos[:, -1:] - after


def causal_rows(rows: slice, q_len: int, kv_len: int, device) -> torch.Tensor:
    """[1, 1, c, kv_len] bool for query rows ``rows`` of a causal mask aligned to the end of the keys."""
    i = torch.arange(rows.start, rows.stop, device=device)[:, None] + (kv_len - q_len)
    return (torch.arange(kv_len, device=device)[None, :] <= i)[None, None]


def chunk_mask(mask: torch.Tensor | None, causal: bool, rows: slice, q_len: int, kv_len: int, device):
    """The mask of query rows ``rows``: a slice of the given mask, a built causal one, or None (all visible)."""
    if mask is not None:
        return mask[..., rows, :] if mask.shape[-2] > 1 else mask
    return causal_rows(rows, q_len, kv_len, device) if causal else None


def crop_empty_slots(query, key, value, mask):
    """(key, value, mask) without the key slots no query may see at the end (a static cache's unfilled slots),
    and without a mask when a single query sees every key left (a static cache's decode step, as a dynamic
    cache's). No mask, several queries, more keys: an empty static cache, which sdpa crops to the first q_len slots.
    A decode step's mask is read once for all the layers of the step (``mask_formats.step_padding``): where it hides
    only each row's first keys besides the unfilled end, the mask cut there is handed on (left padding).
    """
    q_len, kv = query.shape[2], key.shape[2]
    if mask is None:
        short = q_len > 1 and kv > q_len
        return (key[:, :, :q_len], value[:, :, :q_len], None) if short else (key, value, None)
    if is_step_mask(mask, q_len):  # read once for all the layers of the step
        end, padding, cut = step_padding(mask)
        if padding != "other":
            key, value = (key, value) if end == kv else (key.narrow(2, 0, end), value.narrow(2, 0, end))
            return key, value, None if padding == "none" else cut
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    # an additive bias keeps the mask; read only where it could be dropped (one query seeing every key left)
    biased = q_len == 1 and mask.dtype != torch.bool and bool(graded(mask))
    if allowed.shape[:-1].numel() == 1 and not biased:  # one query, one mask row (a static cache's step): a prefix?
        filled = int(allowed.count_nonzero())
        if filled and bool(allowed[..., :filled].all()):
            return key[:, :, :filled], value[:, :, :filled], None
    seen = allowed.reshape(-1, allowed.shape[-1]).any(0)  # [kv]: some query may see the key
    end = kv - int(seen.flip(0).to(torch.uint8).argmax())  # past the last seen key (none seen: kv)
    if end < kv:
        key, value, mask, allowed = key[:, :, :end], value[:, :, :end], mask[..., :end], allowed[..., :end]
    return key, value, None if q_len == 1 and not biased and bool(allowed.all()) else mask
