"""Two-band scoring shared by ReRoPE, leaky ReRoPE and Self-Extend.

For a query at position m and a key at n (causal, m >= n), with w = ``window``:
- m - n < w: plain RoPE, q rotated by m against k rotated by n;
- m - n >= w: q rotated by far_query(m) against k rotated by far_key(n), so that the pair's relative angle is
  (far_query(m) - far_key(n)) * theta_i: the method's distance beyond the window.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .kernel import Bands
from .rotation import rotate
from .scoring import Call, Scorer

PositionFn = Callable[[torch.Tensor, dict], torch.Tensor]  # (positions [B, L], rope params) -> positions [B, L]


class WindowedScorer(Scorer):
    bands_count = 2

    def __init__(self, far_query: PositionFn, far_key: PositionFn):
        self.far_query, self.far_key = far_query, far_key

    def prepare(self, call: Call) -> None:
        super().prepare(call)
        call.state["far_key"] = rotate(call.key, self.far_key(call.k_pos, call.params), call.inv_freq)

    def bands(self, call: Call, rows: slice) -> Bands:
        q, m = call.query[:, :, rows], call.q_pos[:, rows]
        near = rotate(q, m, call.inv_freq)
        beyond = (m[:, None, :, None] - call.k_pos[:, None, None, :]) >= call.params["window"]  # [B, 1, c, kv]
        if not beyond.any():  # every pair inside the window: plain RoPE, one band (sdpa's fast kernels)
            return Bands([near], [call.state["key"]])
        far = rotate(q, self.far_query(m, call.params), call.inv_freq)
        return Bands([near, far], [call.state["key"], call.state["far_key"]], beyond)
