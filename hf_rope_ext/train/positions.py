"""Position schedules: which position ids a training window of ``window`` tokens gets, up to a target length.

- ``contiguous``: 0, 1, ..., window-1 (ordinary training at the window's own length).
- ``pose``: PoSE skip-wise positions. The window is cut into ``chunks`` pieces at random points; every piece keeps
  consecutive positions, and piece j is shifted by a skip ``u_j``, with ``0 = u_0 <= u_1 <= ... <= span - window``.
  Positions therefore increase strictly, start at 0 and stay below ``span`` (the target length), so a short window
  sees relative distances up to the target length.
- ``random``: randomized positional encoding: ``window`` distinct positions drawn uniformly from [0, span), sorted.

Every schedule returns int64 ids of shape (batch, window), one row per sequence, in increasing order along a row.
Randomness comes only from the ``generator`` passed in, so a resumed run draws the same positions.
"""

from __future__ import annotations

import torch

SCHEDULES = ("contiguous", "pose", "random")


def position_ids(
    schedule: str,
    batch: int,
    window: int,
    span: int,
    generator: torch.Generator | None = None,
    chunks: int = 2,
) -> torch.Tensor:
    """(batch, window) int64 position ids of ``schedule``; every id lies in [0, span)."""
    check_schedule(schedule, window, span, chunks)
    if schedule == "contiguous":
        return torch.arange(window).expand(batch, window).clone()
    if schedule == "pose":
        return pose_positions(batch, window, span, chunks, generator)
    return random_positions(batch, window, span, generator)


def check_schedule(schedule: str, window: int, span: int, chunks: int = 2) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"position_schedule={schedule!r} is not allowed; expected one of {list(SCHEDULES)}")
    if window < 1 or span < window:
        raise ValueError(f"window={window} must be >= 1 and <= the target length span={span}")
    if schedule == "contiguous" and span != window:
        raise ValueError(f"position_schedule='contiguous' trains at the window's own length: window={window} != {span}")
    if schedule == "pose" and not 1 <= chunks <= window:
        raise ValueError(f"pose_chunks={chunks} must lie in [1, window={window}]")


def pose_positions(batch: int, window: int, span: int, chunks: int, generator: torch.Generator | None) -> torch.Tensor:
    """PoSE ids: ``arange(window)`` plus the skip of the chunk each token falls in."""
    # cuts: (batch, chunks-1) distinct sorted cut points in [1, window-1]; a token at i is in chunk #(cuts <= i)
    order = torch.rand(batch, window - 1, generator=generator).argsort(dim=-1)
    cuts = (order[:, : chunks - 1] + 1).sort(dim=-1).values
    token = torch.arange(window)
    chunk_of = (token[None, :, None] >= cuts[:, None, :]).sum(dim=-1)  # (batch, window) in [0, chunks)
    # skips: (batch, chunks) non-decreasing in [0, span - window], the first chunk unshifted
    drawn = torch.randint(0, span - window + 1, (batch, chunks - 1), generator=generator).sort(dim=-1).values
    skips = torch.cat([torch.zeros(batch, 1, dtype=torch.long), drawn], dim=-1)
    return token[None, :] + skips.gather(1, chunk_of)


def random_positions(batch: int, window: int, span: int, generator: torch.Generator | None) -> torch.Tensor:
    """``window`` distinct ids per row drawn uniformly from [0, span), sorted increasing."""
    keys = torch.rand(batch, span, generator=generator)  # a random permutation of [0, span) per row
    return keys.argsort(dim=-1)[:, :window].sort(dim=-1).values


def step_generator(seed: int, micro_step: int) -> torch.Generator:
    """The generator of one micro-batch: a function of (seed, micro_step) only, so resuming redraws identically."""
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + int(micro_step))
