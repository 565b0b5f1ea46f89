"""The scorer of ``xpos`` (declared in ``xpos``): ordinary RoPE scores times zeta_i^((m - n)/scale_base).

zeta_i = (2i/d + gamma) / (1 + gamma). The absolute form (q times zeta^(m/s), k times zeta^(-n/s)) leaves the
float range near 128k positions (zeta_0^(-256) ~ 1e139). Here both factors are taken relative to a reference r,
the largest query position of the chunk: q times zeta^((m - r)/s) (>= 1, bounded because the chunk spans few
positions) and k times zeta^((r - n)/s) (<= 1; keys after r are masked and get exponent 0). Their product is
zeta^((m - n)/s) exactly; only factors whose true value is below the float range underflow to 0.
Chunks never straddle a drop in position (packed sequences), so the span bound holds there too.
The fast path (sdpa) takes r on a grid instead: the multiple of half the chunk limit just above the chunk's
largest position, so that a decode step reuses the keys scaled at earlier steps until r moves on (every few
thousand tokens); chunks there hold at most half the limit, so r - m stays within the bound.
"""

from __future__ import annotations

import functools
import math

import torch

from . import rotated_cache
from .kernel import Bands
from .rotation import rotate, scale_pairs
from .scoring import Call, Scorer


def log_zeta(inv_freq: torch.Tensor, gamma: float) -> torch.Tensor:
    """log zeta_i for the d/2 rotary pairs, float64, all < 0 (shared between calls: read only)."""
    return _log_zeta(inv_freq.shape[-1], float(gamma), str(inv_freq.device))


@functools.lru_cache(maxsize=64)
def _log_zeta(pairs: int, gamma: float, device: str) -> torch.Tensor:
    two_i_over_d = torch.arange(pairs, device=device, dtype=torch.float64) / pairs
    return torch.log((two_i_over_d + gamma) / (1.0 + gamma))


class XposScorer(Scorer):
    def exponent_bound(self, dtype) -> float:
        """The largest log query factor kept: a quarter of the dtype's range, so scores cannot overflow."""
        return math.log(torch.finfo(dtype).max) / 4

    def chunk_limit(self, call: Call) -> int:
        """Rows per chunk such that zeta_0^(-(rows - 1)/scale_base) stays within the exponent bound."""
        steepest = -float(log_zeta(call.inv_freq, float(call.params["gamma"]))[0])
        return max(1, int(self.exponent_bound(call.query.dtype) * float(call.params["scale_base"]) / steepest))

    def segments(self, call: Call) -> list[tuple[int, int]]:
        """Query row ranges over which every batch row's positions never decrease."""
        if call.q_pos.shape[1] == 1:  # decode
            return [(0, 1)]
        drops = (call.q_pos[:, 1:] < call.q_pos[:, :-1]).any(0).nonzero().flatten().tolist()
        starts = [0] + [i + 1 for i in drops]
        return list(zip(starts, starts[1:] + [call.q_pos.shape[1]], strict=True))

    def fast_chunks(self, call: Call) -> list[slice]:
        half = max(1, self.chunk_limit(call) // 2)
        return [slice(i, min(i + half, stop)) for start, stop in self.segments(call) for i in range(start, stop, half)]

    def fast_query_keys(self, module, call: Call, rows: slice, old_rows: int):
        """Queries scaled by zeta^((m - r)/s), keys by zeta^((r - n)/s), r on the grid (module docstring); each
        rotated and scaled in one pass (``rotate``'s log_scale)."""
        half = max(1, self.chunk_limit(call) // 2)
        m = call.q_pos[:, rows]
        ref = (m.max(dim=-1, keepdim=True).values // half + 1) * half  # [B, 1]
        logz, scale_base = log_zeta(call.inv_freq, float(call.params["gamma"])), float(call.params["scale_base"])
        q_log = ((m - ref).double() / scale_base)[:, None, :, None] * logz
        q_log = q_log.clamp(max=self.exponent_bound(call.query.dtype))
        q = rotate(call.query[:, :, rows], m, call.inv_freq, q_log)

        def scaled(x, n):
            k_log = ((ref - n).clamp(min=0).double() / scale_base)[:, None, :, None] * logz
            return rotate(x, n, call.inv_freq, k_log)

        if old_rows <= 0:  # prefill: keys rotated and scaled once per reference
            memo = ("xpos_keys", tuple(ref.flatten().tolist()))
            if memo not in call.state:
                call.state.pop(call.state.get("xpos_last"), None)  # the previous reference's keys: done with
                call.state[memo], call.state["xpos_last"] = scaled(call.key, call.k_pos), memo
            return q, call.state[memo]
        tag = (
            "xpos_key",
            tuple(call.inv_freq.tolist()),
            tuple(ref.flatten().tolist()),
            str(sorted(call.params.items())),
        )
        return q, rotated_cache.rotated(call.memory, "xpos_key", tag, call.key, call.k_pos, old_rows, scaled)

    def bands(self, call: Call, rows: slice) -> Bands:
        m, n = call.q_pos[:, rows], call.k_pos
        ref = m.max(dim=-1, keepdim=True).values  # [B, 1]
        logz, scale_base = log_zeta(call.inv_freq, float(call.params["gamma"])), float(call.params["scale_base"])
        q_log = ((m - ref).double() / scale_base)[:, None, :, None] * logz  # [B, 1, c, d/2], >= 0
        k_log = ((ref - n).clamp(min=0).double() / scale_base)[:, None, :, None] * logz  # [B, 1, kv, d/2], <= 0
        q = rotate(call.query[:, :, rows], m, call.inv_freq)
        q = scale_pairs(q, q_log.clamp(max=self.exponent_bound(call.query.dtype)))
        return Bands([q], [scale_pairs(call.state["key"], k_log)])
