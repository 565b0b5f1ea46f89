"""A decode step's pieces merged once (``engine.union``): on a CPU the parts of split pieces join one softmax over
their log-sum-exps; whole pieces merge as ``merge_two`` does. Against dense softmax attention over the union."""

from __future__ import annotations

import pytest
import torch

from hf_rope_ext.attention.engine import kernels, split_keys, union
from hf_rope_ext.attention.engine.padding import Padding, padded_piece
from hf_rope_ext.attention.engine.piece import Piece


def pieces_of(lengths, seed=0, padded=0):
    """Pieces (q [1, 2, 3, 8], k / v [1, 2, n, 8]) over disjoint keys, queries of their own, and the padding hiding
    each row's first ``padded`` keys of the whole (pieces laid one after the other)."""
    g = torch.Generator().manual_seed(seed)
    total, start, found = sum(lengths), 0, []
    seen = torch.arange(total) >= padded
    low = torch.tensor(torch.finfo(torch.float32).min)
    padding = Padding(torch.tensor([[padded]]), torch.where(seen, 0.0, low).view(1, 1, 1, -1))
    for n in lengths:
        q = torch.randn(1, 2, 3, 8, generator=g)
        k, v = torch.randn(2, 1, 2, n, 8, generator=g)
        found.append((q, k, v, padded_piece(padding if padded else None, start, start + n)))
        start += n
    return found, seen


def dense(pieces, seen, scale):
    """Softmax over every piece's scores at once ([1, 2, 3, 8]), hidden keys out."""
    scores = torch.cat([q @ k.transpose(-1, -2) * scale for q, k, _, _ in pieces], dim=-1)
    scores = scores.masked_fill(~seen, float("-inf"))
    return torch.softmax(scores, dim=-1) @ torch.cat([v for _, _, v, _ in pieces], dim=2)


@pytest.mark.parametrize("padded", [0, 9])
@pytest.mark.parametrize("lengths", [[37], [20, 37], [11, 40, 29], [5, 64]])
@pytest.mark.parametrize("part_keys", [7, 10**6])  # parts of at least 7 keys, or none split
def test_the_union_is_softmax_over_every_key(lengths, padded, part_keys, monkeypatch):
    monkeypatch.setattr(split_keys, "PART_KEYS", part_keys)
    pieces, seen = pieces_of(lengths, padded=padded)
    before = kernels.RAN["cpu_flash_split"]
    out = union.attend_union(pieces, 0.3)
    assert (kernels.RAN["cpu_flash_split"] > before) is (part_keys == 7)
    torch.testing.assert_close(out, dense(pieces, seen, 0.3), rtol=0, atol=1e-5)


def test_another_devices_kernel_runs_whole_pieces_merged_as_two(monkeypatch):
    """Where the device's kernel is not the CPU one (the CUDA kernels' CPU twins in the tests), each piece runs
    through it, whole, and two merge by ``merge_two``."""
    calls = []

    def kernel(q, k, v, piece, scale):
        calls.append(k.shape[2])
        return kernels.cpu_flash(q, k, v, piece, scale)

    monkeypatch.setitem(kernels.KERNELS, "cpu", kernel)
    monkeypatch.setattr(split_keys, "PART_KEYS", 7)
    pieces, seen = pieces_of([20, 37])
    out = union.attend_union(pieces, 0.3)
    assert calls == [20, 37]
    expected = union.merge_two(*(kernels.cpu_flash(*p, 0.3) for p in pieces))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(out, dense(pieces, seen, 0.3), rtol=0, atol=1e-5)


def test_a_window_piece_is_not_taken_apart():
    """A piece whose key range cuts keys (the CPU kernel's own -inf window) is no decode piece: it runs whole."""
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
    assert union.cpu_decode_piece(q, k, v, Piece())
    assert not union.cpu_decode_piece(q, k, v, Piece(row0=39, column0=0, low=0, high=5))
    assert not union.cpu_decode_piece(q, k, v, Piece(row0=0, column0=0, low=0))  # causal
    assert not union.cpu_decode_piece(q.expand(1, 2, 3, 8).repeat(1, 2, 1, 1), k, v, Piece())  # heads not grouped
