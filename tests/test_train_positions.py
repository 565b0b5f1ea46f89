"""Position schedules: PoSE ids stay inside the target length and keep order; random ids are distinct and sorted."""

import pytest
import torch

from hf_rope_ext.train.positions import SCHEDULES, position_ids, step_generator


def pose_reference(batch, window, span, chunks, generator):
    """Slow PoSE from the same random draws: cut points, then per token the skip of the chunk it falls in."""
    order = torch.rand(batch, window - 1, generator=generator).argsort(dim=-1)
    drawn = torch.randint(0, span - window + 1, (batch, chunks - 1), generator=generator)
    rows = []
    for b in range(batch):
        cuts = sorted(int(c) + 1 for c in order[b, : chunks - 1])
        skips = [0] + sorted(int(u) for u in drawn[b])
        rows.append([i + skips[sum(1 for c in cuts if i >= c)] for i in range(window)])
    return torch.tensor(rows)


@pytest.mark.parametrize("window,span,chunks", [(8, 64, 2), (16, 16, 2), (12, 100, 4), (5, 40, 1), (6, 7, 6)])
def test_pose_inside_span_and_ordered(window, span, chunks):
    ids = position_ids("pose", 64, window, span, step_generator(3, 0), chunks)
    assert ids.shape == (64, window) and ids.dtype == torch.long
    assert int(ids.min()) >= 0 and int(ids.max()) < span
    assert bool((ids.diff(dim=-1) >= 1).all())  # strictly increasing along each row
    assert bool((ids[:, 0] == 0).all())  # the first chunk is never shifted
    # each row is arange(window) plus at most `chunks` distinct shifts that never decrease
    shifts = ids - torch.arange(window)
    assert bool((shifts.diff(dim=-1) >= 0).all())
    assert all(len(row.unique()) <= chunks for row in shifts)


@pytest.mark.parametrize("chunks", [1, 2, 3, 5])
def test_pose_matches_reference_and_reaches_far(chunks):
    ids = position_ids("pose", 24, 16, 256, step_generator(0, 5), chunks)
    assert torch.equal(ids, pose_reference(24, 16, 256, chunks, step_generator(0, 5)))
    assert chunks == 1 or int(ids.max()) > 200  # long distances are sampled from a short window


def test_random_distinct_sorted_in_range():
    ids = position_ids("random", 32, 10, 50, step_generator(1, 2))
    assert bool((ids.diff(dim=-1) > 0).all()) and int(ids.min()) >= 0 and int(ids.max()) < 50
    counts = torch.bincount(ids.flatten(), minlength=50).float()
    assert bool((counts > 0).all())  # every position in [0, 50) is drawn at least once over 320 draws


def test_contiguous_and_reproducible():
    assert torch.equal(position_ids("contiguous", 3, 9, 9), torch.arange(9).expand(3, 9))
    for schedule in SCHEDULES[1:]:
        a = position_ids(schedule, 4, 8, 64, step_generator(7, 11))
        assert torch.equal(a, position_ids(schedule, 4, 8, 64, step_generator(7, 11)))
        assert not torch.equal(a, position_ids(schedule, 4, 8, 64, step_generator(7, 12)))


@pytest.mark.parametrize(
    "args,match",
    [
        (("sliding", 2, 8, 16), "position_schedule='sliding'"),
        (("pose", 2, 32, 16), "window=32"),
        (("contiguous", 2, 8, 16), "window=8 != 16"),
        (("pose", 2, 8, 16, None, 9), "pose_chunks=9"),
    ],
)
def test_bad_schedule_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        position_ids(*args)
