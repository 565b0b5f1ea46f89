"""``string`` (STRING, arXiv 2410.18745) against its paper: the position matrix written entry by entry, attention
computed from it pair by pair in float64 (nothing shared with the engines), and its bad input refused."""

from __future__ import annotations

import pytest
import torch
from position_reference import layer_output_and_reference

LENGTH = 24


def paper_positions(length: int, shift: int, local: int) -> torch.Tensor:
    """The paper's relative position matrix P[m][n] (m >= n): m - n below the shift S, m - n - S + W from it on."""
    rows = [[(m - n if m - n < shift else m - n - shift + local) if n <= m else 0 for n in range(length)]
            for m in range(length)]  # fmt: skip
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("shift, local", [(5, 2), (7, 0), (3, 2), (24, 4)])
def test_attention_equals_the_paper_position_matrix(shift, local, implementation):
    rope = {"rope_type": "string", "window": shift, "local_window": local}
    got, expected = layer_output_and_reference(rope, implementation, paper_positions(LENGTH, shift, local), seed=3)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_the_position_matrix_reuses_small_distances():
    p = paper_positions(12, 5, 2)
    assert p[4, 0] == 4 and p[5, 0] == 2 and p[11, 0] == 8 and p.max() == 8  # below S exact, then from W on
