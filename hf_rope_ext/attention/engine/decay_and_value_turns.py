"""How the engines apply the declared treatments: xPos's per-pair decay, RoPER's turn of values and outputs.

xPos (``form.decay``): scores times zeta_i^((m - n)/s) per rotary pair. The absolute form (q times zeta^(m/s), k
times zeta^(-n/s)) leaves the float range near 128k positions (zeta_0^(-256) ~ 1e139). Both factors are taken
relative to a reference r at or above every query position of a chunk: q times zeta^((m - r)/s) (>= 1, bounded
because a chunk spans few positions: ``decay_rows``) and k times zeta^((r - n)/s) (<= 1; keys after r are
masked and get exponent 0). Their product is zeta^((m - n)/s) exactly; only factors whose true value is below the
float range underflow to 0. Chunks never straddle a drop in position (packed sequences: ``segments``). The
reference engine takes r = the chunk's largest position; the fast one a multiple of half the chunk limit just
above it, so that decode steps reuse the keys scaled at earlier steps until r moves on (every few thousand tokens).

RoPER (``form.values``): values rotated by their position n with their own frequencies, the output by -m.
"""

from __future__ import annotations

import math

import torch

from ...frequencies.common import inv_freq64
from ..rotation import rotate
from .call import Call


def exponent_bound(dtype) -> float:
    """The largest log query factor kept: a quarter of the dtype's range, so scores cannot overflow."""
    return math.log(torch.finfo(dtype).max) / 4


def log_zeta(call: Call) -> torch.Tensor:
    """log zeta_i [r/2] float64 of the layer (all < 0), computed once per layer and device."""
    pairs = call.inv_freq.shape[-1]

    def compute():
        two_i_over_d = torch.arange(pairs, device=call.query.device, dtype=torch.float64) / pairs
        return call.form.decay.log_zeta(two_i_over_d, call.params)

    return call.constant("log_zeta", compute)


def decay_rows(call: Call) -> int:
    """Rows per chunk such that zeta_0^(-(rows - 1)/scale) stays within the exponent bound."""
    decay = call.form.decay
    steepest = decay.steepest(call.params) if decay.steepest is not None else -float(log_zeta(call)[0])
    return max(1, int(exponent_bound(call.query.dtype) * decay.scale(call.params) / steepest))


def segments(call: Call) -> list[tuple[int, int]]:
    """Query row ranges over which every batch row's positions never decrease (xPos chunks stay inside one). While
    torch.compile traces, one range (positions are not read back): a chunk whose positions then lie too far apart
    for one reference is refused on the device (``query_log_scale``)."""
    if call.form.decay is None or call.q_pos.shape[1] == 1 or torch.compiler.is_compiling():
        return [(0, call.query.shape[2])]
    drops = (call.q_pos[:, 1:] < call.q_pos[:, :-1]).any(0).nonzero().flatten().tolist()
    starts = [0] + [i + 1 for i in drops]
    return list(zip(starts, starts[1:] + [call.q_pos.shape[1]], strict=True))


def query_log_scale(call: Call, m: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """log of the query factor zeta^((m - r)/s): [B, 1, c, r/2] float64, clamped to the exponent bound."""
    q_log = ((m - ref).double() / call.form.decay.scale(call.params))[:, None, :, None] * log_zeta(call)
    bound = exponent_bound(call.query.dtype)
    if torch.compiler.is_compiling() and m.shape[-1] > 1:  # no segments there: a drop in position is an error
        message = "xPos under torch.compile: the positions of one call drop inside a chunk (packed sequences)"
        torch._assert_async((q_log <= bound).all(), message + "; run it without torch.compile")
    return q_log.clamp(max=bound)


def key_log_scale(call: Call, n: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """log of the key factor zeta^((r - n)/s) (exponent 0 past r): [B, 1, kv, r/2] float64, <= 0."""
    return ((ref - n).clamp(min=0).double() / call.form.decay.scale(call.params))[:, None, :, None] * log_zeta(call)


def value_inv_freq(call: Call) -> torch.Tensor:
    """theta_j [r_v/2] float64 of the value dims RoPER turns (see ``methods.roper``), once per layer and device."""

    def compute():
        dims = call.form.values.dims(call.params, 2 * call.inv_freq.shape[-1], call.value.shape[-1])
        return inv_freq64(float(call.params["rope_theta"]), dims, str(call.value.device))

    return call.constant("value_inv_freq", compute)


def turn_output_back(call: Call, out: torch.Tensor, rows: slice) -> torch.Tensor:
    """RoPER's output [B, H, c, dv] of query rows ``rows`` rotated by -m (other forms: unchanged)."""
    if call.form.values is None:
        return out
    return rotate(out, -call.q_pos[:, rows], value_inv_freq(call))
