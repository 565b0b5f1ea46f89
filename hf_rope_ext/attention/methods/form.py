"""What an attention-level method declares (plain data, no torch): its score bands and how it treats values.

A query at position m meets a key at position n (distance d = m - n, d >= 0 under a causal mask) in exactly one
band, chosen by the band's key range:
- ``"all"``: every key (one-band methods: xPos, RoPER, the dynamic frequency types rotated in attention);
- ``"window"``: d < w, w = ``rope_parameters["window"]`` (the near band of the two-band methods);
- ``"beyond"``: d >= w, i.e. keys n <= m - w: causal attention shifted by the window (the far band);
- a function ``keys(m [B, c, 1], n [B, 1, kv] int64, params) -> [B, c, kv] bool`` for bands chosen otherwise (Dual
  Chunk Attention's by chunk gap); the reference engine runs these, the fast engine plans none of them.
Within its band the pair is scored as plain RoPE with the query rotated by ``query_position(m)`` and the key by
``key_position(n)`` (None: the position itself), so the pair turns by (query_position(m) - key_position(n))
theta_i. ReRoPE's far band rotates the query by w and leaves keys unrotated; Self-Extend groups both far positions
as floor(pos / group_size). ``Decay`` (xPos) scales each rotary pair's term of the score, ``ValueTurn`` (RoPER)
turns values and the output. The engine (``attention.engine``) runs any such declaration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch is not imported here: ``hf-rope-ext list`` reads the method modules
    from torch import Tensor

PositionFn = Callable[["Tensor", dict], "Tensor"]  # (positions [B, L] int64, rope params) -> positions [B, L]
KeyRange = Callable[["Tensor", "Tensor", dict], "Tensor"]  # (m [B, c, 1], n [B, 1, kv], params) -> [B, c, kv] bool


def origin(positions: Tensor, params: dict) -> Tensor:
    """Every position taken as 0: keys left unrotated (ReRoPE's far band); the engine then reads them as cached."""
    return positions.new_zeros(positions.shape)


@dataclass(frozen=True)
class Band:
    """One score band: the keys it covers and the positions its queries and keys are rotated by. The first band is
    scored for every pair; a later one replaces it where its key range holds."""

    keys: Literal["all", "window", "beyond"] | KeyRange = "all"
    query_position: PositionFn | None = None  # None: the query's own position m
    key_position: PositionFn | None = None  # None: the key's own position n


@dataclass(frozen=True)
class Decay:
    """Each rotary pair i's score term times zeta_i^(d / scale): ``log_zeta(2i/d [d/2] float64, params)`` gives
    log zeta_i (all < 0), ``scale(params)`` the positions per decay step, ``steepest(params)`` the largest decay
    -log zeta_i as a number (the engines size their chunks by it; without it they read log_zeta's first value back
    from the device, which torch.compile cannot trace)."""

    log_zeta: Callable[[Tensor, dict], Tensor]
    scale: Callable[[dict], float]
    steepest: Callable[[dict], float] | None = None


@dataclass(frozen=True)
class ValueTurn:
    """Values rotated by their position n and the output rotated back by the query's m, in pairs (j, j + r_v/2)
    of the first r_v value dims with their own theta_j = b^(-2j/r_v); ``dims(params, rotary_dim, value_dim)``
    gives r_v (or raises ValueError)."""

    dims: Callable[[dict, int, int], int]


@dataclass(frozen=True)
class AttentionForm:
    """How an attention-level method forms scores and outputs (the default: plain RoPE, one band)."""

    bands: tuple[Band, ...] = (Band(),)
    decay: Decay | None = None
    values: ValueTurn | None = None
    # chunks(params) = c: the bands are the chunk gaps 0, 1 and >= 2 of chunks of c positions, in that order, all
    # keys rotated by one key_position (Dual Chunk Attention); the fast engine plans such a form chunk by chunk
    chunks: Callable[[dict], int] | None = None

    @property
    def far(self) -> Band | None:
        """The far band of a two-band method (keys ``"beyond"`` the window), else None."""
        return next((b for b in self.bands if b.keys == "beyond"), None)

    @property
    def kept_turns(self) -> tuple[bool, bool]:
        """(keys, values): what a static cache layer keeps turned as it writes them (``engine.static_rows``): the
        keys turned by the last band's key positions unless that band reads them as cached (ReRoPE) or decays them by
        a factor that follows the query (xPos); the values where they turn (RoPER)."""
        return self.bands[-1].key_position is not origin and self.decay is None, self.values is not None


PLAIN = AttentionForm()


def two_bands(far_query: PositionFn, far_key: PositionFn) -> AttentionForm:
    """Plain RoPE inside the window, the given positions beyond it (ReRoPE, leaky ReRoPE, Self-Extend)."""
    return AttentionForm(bands=(Band("window"), Band("beyond", far_query, far_key)))
